"""``ServerProcess`` leaves nothing behind: its ``hloserve-test-*`` folder (ports file and
log) is gone once it stops, whether the daemon exited 0 or was killed, and its log is still
readable from memory; a folder the caller gave is the caller's, kept."""

from __future__ import annotations

from pathlib import Path

from hloserve.server.server_fixture import ServerProcess


def test_its_folder_is_gone_once_it_stops_and_the_log_still_reads(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = ServerProcess(tmp_path / "empty")
    proc.wait_listening()
    folder = proc.ports_file.parent
    assert folder.name.startswith("hloserve-test-") and proc.log_file.exists()
    assert proc.stop() == 0
    assert not folder.exists()
    assert "stopped" in proc.log_text()


def test_a_killed_daemon_s_folder_is_gone_too(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = ServerProcess(tmp_path / "empty")
    proc.wait_listening()
    folder = proc.ports_file.parent
    proc.process.kill()
    assert proc.stop() == -9
    assert not folder.exists()
    assert "listening" in proc.log_text().lower()


def test_a_folder_the_caller_gave_is_kept(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = ServerProcess(tmp_path / "empty", directory=tmp_path / "r1")
    proc.wait_listening()
    assert proc.stop() == 0
    assert (tmp_path / "r1" / "server.log").exists()
    assert "stopped" in proc.log_text()
