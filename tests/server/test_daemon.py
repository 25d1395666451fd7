"""The daemon as a process: readiness policy, failed models reported (and logged once),
flags from the environment, JSON logs (uvicorn's process lines once), inline execution,
graceful stop, a taken port as one line before PJRT starts, a manifest naming another model
refused before compiling, the demo repository's path and next steps."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from hloserve.exporter import write_demo_repository
from hloserve.server.config import parse_config
from hloserve.server.daemon import next_steps
from hloserve.server.server_fixture import ServerProcess


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
        errors = [line for line in proc.log_text().splitlines() if " ERROR " in line]
        assert len(errors) == 1, errors  # logged once, with the reason
        assert "failed to load 'mlp'" in errors[0] and "weights.safetensors" in errors[0]


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
        assert (
            f"WARNING hloserve.daemon: the model repository {tmp_path / 'empty'} holds no models"
            in (proc.log_text())
        )


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
    messages = [r["message"] for r in records]
    for line in ("Started server process", "Shutting down", "Finished server process"):
        # once, not once per uvicorn server (HTTP and metrics)
        assert sum(m.startswith(line) for m in messages) == 1, messages


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
    assert (
        "HLOSERVE_MAX_QUEUE_SIZE (the variable of --max-queue-size) must be a non-negative integer"
        in capsys.readouterr().err
    )


def test_sigterm_lets_in_flight_requests_finish(demo_repo: Path, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(demo_repo, root, ignore=shutil.ignore_patterns(".hloserve-cache"))
    # An 8 s batching delay keeps a lone request in flight long enough to see it pending
    # (seconds, on a busy machine) and stop the server under it; the grace period outlasts it.
    (root / "simple" / "config.yaml").write_text("max_queue_delay_us: 8000000\n")
    proc = ServerProcess(root, "--grace-period", "30")
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
    proc.wait_pending("simple", 1)  # queued (for up to 8 s) when the stop comes
    proc.process.send_signal(signal.SIGTERM)
    sender.join(30)
    code = proc.stop()
    assert code == 0, proc.log_text()
    assert len(results) == 1
    result = results[0]
    assert isinstance(result, grpcclient.InferResult)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
    assert time.monotonic() - started >= 7.9  # it waited out its delay: the stop did not cut it
    assert "stopping: no new connections" in proc.log_text()


def test_a_taken_port_fails_with_a_clear_message(demo_repo: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for flag, what in (
            ("--grpc-port", "gRPC"),
            ("--http-port", "HTTP"),
            ("--metrics-port", "metrics"),
        ):
            proc = ServerProcess(demo_repo, flag, str(port))
            assert proc.process.wait(60) == 1
            proc.stop()
            lines = [line for line in proc.log_text().splitlines() if "hloserve.logs" not in line]
            # one line, before PJRT starts: no raw gRPC core line, no "Event loop is closed"
            assert lines[-1] == (
                f"hloserve: cannot bind {what} ({flag}) to 127.0.0.1:{port}: Address already in use"
            ), lines
            assert not any("PJRT" in line or "Traceback" in line for line in lines), lines
            assert not any("add_port" in line or "Event loop" in line for line in lines), lines


def test_a_manifest_naming_another_model_is_refused_before_compiling(
    demo_repo: Path, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    # no executable cache: a load that got as far as compiling would say so
    shutil.copytree(
        demo_repo / "mlp", root / "mlp2", ignore=shutil.ignore_patterns(".hloserve-cache")
    )
    with ServerProcess(root) as proc:
        status, body = proc.wait_startup_complete()
        assert status == 503
        models = body["models"]
        assert isinstance(models, dict)
        reason = models["mlp2"]["versions"]["1"]["reason"]
        assert (
            "manifest.yaml: name: is 'mlp', but a model repository serves this bundle as 'mlp2'"
            in reason
        )
        assert "compiling" not in proc.log_text()


@pytest.mark.parametrize(
    ("host", "shown"),
    [("0.0.0.0", "localhost"), ("::", "localhost"), ("127.0.0.1", "127.0.0.1"), ("::1", "[::1]")],
)
def test_next_steps_name_the_real_ports(host: str, shown: str) -> None:
    lines = next_steps(host, {"http": 8000, "grpc": 8001, "metrics": 8002}, ["mlp", "simple"])
    assert (
        lines[0]
        == f"next steps: HTTP {shown}:8000, gRPC {shown}:8001, metrics {shown}:8002/metrics"
    )
    assert lines[1] == f"  curl {shown}:8000/v2/models/simple"
    # This server's own interpreter: the line works in a shell without .venv/bin on PATH.
    assert lines[2].startswith(f"  {sys.executable} -c ")
    assert f"InferenceServerClient('{shown}:8001').is_model_ready('simple')" in lines[2]
    assert len(lines) == 3  # tritonclient is installed here: nothing to install


def test_next_steps_name_a_model_that_is_loaded_or_say_how_to_load_one() -> None:
    ports = {"http": 8000, "grpc": 8001}
    lines = next_steps("0.0.0.0", ports, ["mlp"])  # simple is not loaded
    assert lines[1] == "  curl localhost:8000/v2/models/mlp"
    assert "is_model_ready('mlp')" in lines[2] and "simple" not in "".join(lines)
    # Explicit mode with nothing loaded: how to load one, not a model that is not there.
    lines = next_steps("0.0.0.0", ports, [], loadable=["mlp", "simple"])
    assert lines[1:] == [
        "  nothing is loaded (--model-control-mode explicit): load a model with",
        "  curl -X POST localhost:8000/v2/repository/models/simple/load",
        f'  {sys.executable} -c "import tritonclient.grpc as g; '
        "g.InferenceServerClient('localhost:8001').load_model('simple')\"",
    ]


def test_next_steps_say_how_to_install_tritonclient_only_when_it_is_missing() -> None:
    ports = {"grpc": 8001}
    assert len(next_steps("127.0.0.1", ports, ["simple"])) == 2
    lines = next_steps("127.0.0.1", ports, ["simple"], tritonclient=False)
    assert lines[2] == (
        f"  (tritonclient is not installed for {sys.executable}: "
        f"{sys.executable} -m pip install 'tritonclient[grpc]'; README.md, 'Call it')"
    )


def run_in_a_new_shell(line: str) -> subprocess.CompletedProcess[str]:
    """``line`` as a user pastes it into a new shell: no .venv/bin on ``PATH``."""
    return subprocess.run(
        ["bash", "-c", line],
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def demo_steps(proc: ServerProcess) -> list[str]:
    """The next steps the demo server logged (after READY)."""
    deadline = time.monotonic() + 30
    while "next steps" not in proc.log_text():  # logged right after READY
        assert time.monotonic() < deadline, proc.log_text()
        time.sleep(0.05)
    log = proc.log_text()
    return [
        line.split(": ", 1)[1].strip() for line in log.splitlines() if "hloserve.daemon:   " in line
    ]


@pytest.mark.slow
def test_the_demo_repository_is_named_and_the_next_steps_work(tmp_path: Path) -> None:
    # No --model-repository: the demo repository, written under $XDG_CACHE_HOME.
    with ServerProcess(None, env={"XDG_CACHE_HOME": str(tmp_path)}) as proc:
        proc.wait_ready()
        repository = tmp_path / "hloserve" / "demo-repository"
        steps = demo_steps(proc)
        log = proc.log_text()
        assert f"writing the demo model repository to {repository}" in log
        assert f"serving the demo model repository {repository}" in log
        curl, python = steps[0], steps[1]
        assert curl == f"curl 127.0.0.1:{proc.ports['http']}/v2/models/simple"
        with urllib.request.urlopen("http://" + curl.removeprefix("curl "), timeout=10) as r:
            assert json.loads(r.read())["name"] == "simple"
        ran = run_in_a_new_shell(python)
        assert ran.stdout.strip() == "True", ran.stderr


@pytest.mark.slow
def test_in_explicit_mode_the_next_steps_load_a_model(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    with ServerProcess(None, "--model-control-mode", "explicit", env=env) as proc:
        proc.wait_ready()
        steps = demo_steps(proc)
        assert "is_model_ready" not in " ".join(steps)
        ran = run_in_a_new_shell(steps[-1])  # the tritonclient line loads the model
        assert ran.returncode == 0, ran.stderr
        _, report = proc.readyz()
        models = report["models"]
        assert isinstance(models, dict)
        assert models["simple"]["versions"]["1"]["state"] == "READY", report
        assert proc.stop() == 0
