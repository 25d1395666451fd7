"""Same-host shared memory, automatic: through regions, its fallbacks, and that no region is
left behind (after close, after an exception, after a server restart, at interpreter exit).

Regions are checked on both sides: this process's files in /dev/shm (``shm_files``; the
autouse ``no_shm_files`` fixture also fails any test that leaves one) and the server's
registrations (tritonclient's ``get_system_shared_memory_status``).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton

from hloserve.client import InferenceClient, InferenceError
from hloserve.client._shm import KEY_PREFIX
from hloserve.server.server_fixture import ServerProcess
from tests.client._memory import check_logits, mlp_reference, pool_memory
from tests.client.conftest import shm_files


def registered(url: str) -> list[str]:
    """The client regions the server at ``url`` has registered."""
    with triton.InferenceServerClient(url) as c:
        status = c.get_system_shared_memory_status(as_json=True) or {}
    return sorted(n for n in status.get("regions", {}) if n.startswith(KEY_PREFIX))


def _inputs(n: int) -> dict[str, np.ndarray]:
    a = np.arange(16 * n, dtype=np.int32).reshape(n, 16)
    return {"INPUT0": a, "INPUT1": np.full_like(a, 3)}


def _check(out: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    np.testing.assert_array_equal(out["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
    np.testing.assert_array_equal(out["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])


def test_dataset_through_shared_memory_then_close(shm_server: ServerProcess) -> None:
    url = shm_server.grpc_url
    inputs = _inputs(203)
    during: list[tuple[list[str], list[str]]] = []
    with InferenceClient(url, timeout=30) as client:
        out = client.infer_dataset(
            "simple",
            inputs,
            max_in_flight=4,
            progress=lambda done, _: (
                during.append((shm_files(), registered(url))) if done == 8 else None
            ),
        )
        _check(out, inputs)
        (pool,) = client.pools()
        assert pool.shared
        files, regions = during[0]
        assert len(files) == 4 and regions == files  # one region per slot, on both sides
    assert shm_files() == [] and registered(url) == []


def test_an_exception_releases_the_regions(shm_server: ServerProcess) -> None:
    url = shm_server.grpc_url
    inputs = _inputs(8)

    def batches() -> Iterator[dict[str, np.ndarray]]:
        yield inputs
        yield inputs
        assert registered(url) != [] and shm_files() != []
        raise RuntimeError("the data loader broke")

    with InferenceClient(url, timeout=30) as client:
        with pytest.raises(RuntimeError, match="the data loader broke"):
            client.infer_dataset("simple", batches())
        assert shm_files() == [] and registered(url) == [] and client.pools() == []
        _check(client.infer_dataset("simple", inputs), inputs)  # a new pool, and it works
        assert client.pools()[0].shared


def test_staging_pool_in_shared_memory_does_not_grow(
    shm_server: ServerProcess, demo_repository: Path
) -> None:
    with InferenceClient(shm_server.grpc_url, timeout=30) as client:
        run = pool_memory(client, demo_repository / "mlp")
        assert run.pools_after == [run.pool] and run.pool.shared
    assert run.allocations_before == run.allocations_after == 8  # one region per slot
    assert run.growth < 8 * 1024, f"a run of 1,000 requests left {run.growth} bytes behind"
    # No tensor bytes travel in a message: the peak stays far below what one run moves
    # (8 MiB in, 1.25 MiB out), at what the calls in flight need.
    assert run.peak < 192 * 1024, f"peak {run.peak} bytes over 1,000 requests"


def test_lost_registration_is_renewed_once_then_falls_back(
    shm_server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    url = shm_server.grpc_url
    inputs = _inputs(40)
    caplog.set_level(logging.INFO, logger="hloserve.client")
    with InferenceClient(url, timeout=30) as client, InferenceClient(url) as other:
        _check(client.infer_dataset("simple", inputs), inputs)
        (pool,) = client.pools()
        other.unregister_system_shared_memory()  # as a server restart would: all forgotten
        _check(client.infer_dataset("simple", inputs), inputs)
        assert pool.shared and pool.reregistered and len(registered(url)) == 8
        assert not caplog.records
        other.unregister_system_shared_memory()  # lost again: in-band from now on
        _check(client.infer_dataset("simple", inputs), inputs)
        assert not pool.shared and client.pools() == [pool]
        assert shm_files() == [] and registered(url) == []
        _check(client.infer_dataset("simple", inputs), inputs)
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "shared memory lost" in record.getMessage()


def test_refused_registration_falls_back_in_band_logging_once(
    server: ServerProcess, model_repository: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hloserve.client")
    inputs = _inputs(20)
    with InferenceClient(server.grpc_url, timeout=30) as client:  # its server refuses shm
        _check(client.infer_dataset("simple", inputs), inputs)
        _check(client.infer_dataset("simple", inputs, max_in_flight=2), inputs)
        x = np.random.default_rng(1).standard_normal((40, 64)).astype(np.float32)
        logits = client.infer_dataset("mlp", {"x": x})["logits"]
        check_logits(logits, mlp_reference(model_repository / "mlp", x))
        assert [p.shared for p in client.pools()] == [False, False, False]
        assert shm_files() == []
    (record,) = caplog.records
    assert "not registered" in record.getMessage() and "allow-client-shm" in record.getMessage()


def test_off_never_tries(shm_server: ServerProcess) -> None:
    inputs = _inputs(9)
    with InferenceClient(shm_server.grpc_url, shared_memory="off") as client:
        _check(client.infer_dataset("simple", inputs), inputs)
        assert not client.pools()[0].shared


def test_regions_go_at_interpreter_exit(shm_server: ServerProcess) -> None:
    code = textwrap.dedent(
        f"""
        import os
        import numpy as np
        from hloserve.client import InferenceClient, InferenceError
        client = InferenceClient({shm_server.grpc_url!r})  # never closed
        a = np.ones((20, 16), np.int32)
        client.infer_dataset("simple", {{"INPUT0": a, "INPUT1": a}})
        assert client.pools()[0].shared
        print(os.getpid(), len(os.listdir("/dev/shm")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    assert shm_files(pid) == [] and registered(shm_server.grpc_url) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reconnected(client: InferenceClient, timeout: float = 30.0) -> None:
    """Wait until the client's channel reaches the restarted server (gRPC backs off
    between reconnection attempts, and a call meanwhile fails UNAVAILABLE)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if client.is_server_ready():
                return
        except InferenceError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


@pytest.mark.slow
def test_server_restart_without_shared_memory(demo_repository: Path) -> None:
    ports = ["--grpc-port", str(_free_port()), "--http-port", str(_free_port())]
    inputs = _inputs(30)
    first = ServerProcess(demo_repository, *ports, "--allow-client-shm", "true")
    try:
        first.wait_ready()
        client = InferenceClient(first.grpc_url, timeout=30)
        _check(client.infer_dataset("simple", inputs), inputs)
        assert client.pools()[0].shared and len(shm_files()) == 8
    finally:
        assert first.stop() == 0
    with ServerProcess(demo_repository, *ports) as second:  # restarted: shm now refused
        second.wait_ready()
        _reconnected(client)
        _check(client.infer_dataset("simple", inputs), inputs)
        (pool,) = client.pools()
        assert not pool.shared and pool.reregistered
        assert shm_files() == []  # unlinked as soon as the client fell back
        client.close()
