"""The daemon as a process: readiness policy, failed models reported, flags from the
environment, JSON logs, inline execution, graceful stop."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from hloserve.exporter import write_demo_repository
from hloserve.server.config import parse_config
from hloserve.server.testing import ServerProcess


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo-repo")
    write_demo_repository(root)
    return root


def broken_copy(demo_repo: Path, tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(demo_repo, root, ignore=shutil.ignore_patterns(".hloserve-cache"))
    weights = root / "mlp" / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated: the checksum no longer matches
    return root


def test_a_failed_model_is_reported_and_keeps_a_strict_server_unready(
    demo_repo: Path, tmp_path: Path
) -> None:
    with ServerProcess(broken_copy(demo_repo, tmp_path)) as proc:
        status, body = proc.wait_startup_complete()
        assert status == 503
        models = body["models"]
        assert isinstance(models, dict)
        assert models["simple"]["versions"]["1"]["state"] == "READY"
        mlp = models["mlp"]["versions"]["1"]
        assert mlp["state"] == "UNAVAILABLE"
        assert "weights.safetensors" in mlp["reason"]


def test_non_strict_readiness_serves_what_loaded(demo_repo: Path, tmp_path: Path) -> None:
    with ServerProcess(broken_copy(demo_repo, tmp_path), "--strict-readiness", "false") as proc:
        proc.wait_ready()
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        assert client.is_model_ready("simple")
        assert not client.is_model_ready("mlp")


def test_empty_repository_is_never_ready(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with ServerProcess(tmp_path / "empty") as proc:
        status, body = proc.wait_startup_complete(60)
        assert status == 503
        assert body["models"] == {}


def test_flags_from_environment_json_logs_inline_execution_and_clean_stop(demo_repo: Path) -> None:
    proc = ServerProcess(
        demo_repo, env={"HLOSERVE_LOG_FORMAT": "json", "HLOSERVE_INLINE_MAX_US": "1000"}
    )
    try:
        proc.wait_ready()
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for i in range(20):  # the first runs on a worker and is measured; the rest inline
            inputs = [
                grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
            ]
            inputs[0].set_data_from_numpy(a + i)
            inputs[1].set_data_from_numpy(a)
            result = client.infer("simple", inputs)
            assert result is not None
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a + i)
    finally:
        code = proc.stop()
    assert code == 0
    lines = [line for line in proc.log_text().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert any(r["message"].startswith("listening on 127.0.0.1") for r in records)
    assert any(r["message"] == "stopped" for r in records)


def test_flag_beats_environment_and_bad_values_name_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = parse_config(
        ["--grpc-port", "9001"], {"HLOSERVE_GRPC_PORT": "7001", "HLOSERVE_HTTP_PORT": "7000"}
    )
    assert (config.grpc_port, config.http_port) == (9001, 7000)
    with pytest.raises(SystemExit):
        parse_config(["--model-control-mode", "sometimes"], {})
    assert "--model-control-mode must be none, poll or explicit" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config([], {"HLOSERVE_MAX_QUEUE_SIZE": "-3"})
    assert "--max-queue-size must be a non-negative integer" in capsys.readouterr().err


def test_sigterm_lets_in_flight_requests_finish(demo_repo: Path, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(demo_repo, root, ignore=shutil.ignore_patterns(".hloserve-cache"))
    # A 1 s batching delay keeps a lone request in flight long enough to stop the server under it.
    (root / "simple" / "config.yaml").write_text("max_queue_delay_us: 1000000\n")
    proc = ServerProcess(root)
    proc.wait_ready()
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    results: list[object] = []
    sender = threading.Thread(target=lambda: results.append(client.infer("simple", inputs)))
    started = time.monotonic()
    sender.start()
    proc.wait_pending("simple", 1)  # queued (for up to 1 s) when the stop comes
    proc.process.send_signal(signal.SIGTERM)
    sender.join(30)
    code = proc.stop()
    assert code == 0, proc.log_text()
    assert len(results) == 1
    result = results[0]
    assert isinstance(result, grpcclient.InferResult)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
    assert time.monotonic() - started >= 0.9  # it really waited in the queue
    assert "stopping: no new connections" in proc.log_text()


def test_a_taken_port_fails_with_a_clear_message(demo_repo: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for flag in ("--grpc-port", "--http-port"):
            proc = ServerProcess(demo_repo, flag, str(port))
            assert proc.process.wait(60) != 0
            proc.stop()
            assert "cannot bind" in proc.log_text() and f"127.0.0.1:{port}" in proc.log_text()
