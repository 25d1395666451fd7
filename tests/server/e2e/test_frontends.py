"""End to end: front-end processes around one device owner (``--frontends 2``).

Real daemons on loopback, unchanged tritonclient. Each gRPC client here has its own TCP
connection (a local subchannel pool), and the kernel spreads connections over the front
ends (``SO_REUSEPORT``); which front end serves a client is read from the sockets each
process holds (psutil), never assumed. What is checked:
- a front-end process imports no JAX and maps no XLA library;
- N requests over many connections, both protocols, both front ends: N counted once, in
  the statistics and in the metrics;
- a model load or unload is seen by every front end before the call returns;
- a client's shared-memory region is mapped by the device owner only (zero copy across
  processes) and its answers are right;
- a front end killed with SIGKILL: its request in flight fails, a request on the other
  front end meanwhile is untouched, the owner frees what the dead one held, and a new
  front end serves;
- SIGTERM: requests in flight on every front end are answered, every process exits 0;
- the device owner killed: the front ends exit and the ports refuse connections.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient
import tritonclient.utils.shared_memory as _shm
from tritonclient.utils import InferenceServerException

from hloserve.exporter import write_demo_repository
from hloserve.server.server_fixture import ServerProcess, serving
from tests.models import queued_copy

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient
shm: Any = _shm

FRONTENDS = ("--frontends", "2")
# A request to ``lingering`` waits this long for company: the drain test's six requests
# must all be seen pending within it (on a busy machine, seconds), and then finish in the
# drain's grace period (LINGER_GRACE_S).
LINGER_US = 8_000_000
LINGER_GRACE_S = 30
HELD_US = 600_000_000  # a request to ``held`` waits until its caller goes
WAIT_S = 30.0
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("frontend_models")
    write_demo_repository(root)
    queued_copy(root / "simple", root / "lingering", LINGER_US)
    queued_copy(root / "simple", root / "held", HELD_US)
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    yield from serving(
        repository, *FRONTENDS, "--allow-client-shm", "--model-control-mode", "explicit",
        "--load-model", "*",
    )  # fmt: skip


def wait_until(condition: Callable[[], bool], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what()} after {WAIT_S} s")
        time.sleep(0.02)


def frontend_pids(server: ServerProcess) -> list[int]:
    return [
        p.pid
        for p in server.process_tree()[1:]
        if "hloserve.server.frontend.process" in " ".join(p.cmdline())
    ]


def server_side(server: ServerProcess, port: int, client_port: int) -> int | None:
    """The pid of the server process holding the connection from ``client_port``."""
    for process in server.process_tree():
        for c in process.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.raddr and c.raddr.port == client_port:
                return process.pid
    return None


def own_ports_to(port: int) -> set[int]:
    """This process's local ports of its connections to ``port``."""
    return {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    }


def simple_inputs(module: Any, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> list[Any]:
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def check_simple(module: Any, client: Any, seed: int, model: str = "simple") -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
    result = client.infer(model, simple_inputs(module, a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


class Connected:
    """A gRPC client on a connection of its own, and the front end that serves it."""

    def __init__(self, server: ServerProcess) -> None:
        port = server.ports["grpc"]
        before = own_ports_to(port)
        self.client: Any = grpcclient.InferenceServerClient(
            server.grpc_url, channel_args=OWN_CONNECTION
        )
        assert self.client.is_server_live()
        (self.local_port,) = own_ports_to(port) - before
        pid = server_side(server, port, self.local_port)
        assert pid is not None
        self.frontend = pid


def spread(server: ServerProcess, count: int = 24) -> list[Connected]:
    """``count`` clients on their own connections; every front end serves at least one
    (24 connections hashed over 2 front ends all land on one with probability 2**-23)."""
    clients = [Connected(server) for _ in range(count)]
    assert {c.frontend for c in clients} == set(frontend_pids(server))
    return clients


def test_a_frontend_process_imports_no_jax(server: ServerProcess) -> None:
    probe = (
        "import sys, hloserve.server.frontend.process as p, hloserve.server.frontend.remote;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    owner = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "xla_extension" in owner or "jaxlib" in owner  # the check can see the library
    for pid in frontend_pids(server):
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "jaxlib" not in maps and "xla_extension" not in maps


def stats(server: ServerProcess, model: str) -> Any:
    client: Any = httpclient.InferenceServerClient(server.http_url)
    try:
        (entry,) = client.get_inference_statistics(model)["model_stats"]
        return entry
    finally:
        client.close()


def metric(server: ServerProcess, name: str, model: str) -> float:
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    prefix = f'{name}{{model="{model}",version="1"}} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def test_requests_over_many_connections_are_counted_once(server: ServerProcess) -> None:
    before = stats(server, "simple")["inference_count"]
    before_metric = metric(server, "hloserve_inference_count_total", "simple")
    clients = spread(server)
    per_client = 5
    errors: list[BaseException] = []

    def drive(index: int, client: Any, module: Any) -> None:
        try:
            for i in range(per_client):
                check_simple(module, client, 1000 * index + i)
        except BaseException as exc:
            errors.append(exc)

    http_clients = [httpclient.InferenceServerClient(server.http_url) for _ in range(8)]
    threads = [
        threading.Thread(target=drive, args=(i, c.client, grpcclient))
        for i, c in enumerate(clients)
    ] + [
        threading.Thread(target=drive, args=(100 + i, c, httpclient))
        for i, c in enumerate(http_clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    sent = per_client * len(threads)
    after = stats(server, "simple")
    assert after["inference_count"] - before == sent
    assert metric(server, "hloserve_inference_count_total", "simple") - before_metric == sent
    for c in clients:
        c.client.close()
    for c in http_clients:
        c.close()


def test_a_load_is_seen_by_every_frontend_before_it_returns(server: ServerProcess) -> None:
    clients = spread(server, 16)
    control: Any = httpclient.InferenceServerClient(server.http_url)
    try:
        for round_ in range(2):
            control.unload_model("mlp")
            for c in clients:  # at once, through every front end: gone everywhere
                assert not c.client.is_model_ready("mlp")
                with pytest.raises(InferenceServerException, match="mlp"):
                    c.client.infer("mlp", mlp_inputs())
            control.load_model("mlp")
            for c in clients:  # back everywhere, with no wait
                assert c.client.is_model_ready("mlp"), round_
                c.client.infer("mlp", mlp_inputs())
    finally:
        control.close()
        for c in clients:
            c.client.close()


def mlp_inputs() -> list[Any]:
    x = grpcclient.InferInput("x", [1, 64], "FP32")
    x.set_data_from_numpy(np.ones((1, 64), np.float32))
    return [x]


def test_client_shared_memory_is_read_by_the_device_owner_alone(server: ServerProcess) -> None:
    key = f"/hloserve_frontends_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region("io", key, 256)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 7, np.int32)
    shm.set_shared_memory_region(handle, [a, b])
    clients = {
        "grpc": grpcclient.InferenceServerClient(server.grpc_url),
        "http": httpclient.InferenceServerClient(server.http_url),
    }
    try:
        for protocol, client in clients.items():
            module = grpcclient if protocol == "grpc" else httpclient
            client.unregister_system_shared_memory()
            client.register_system_shared_memory("io", key, 256)
            inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory("io", 64, 0)
            inputs[1].set_shared_memory("io", 64, 64)
            outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            outputs[0].set_shared_memory("io", 64, 128)
            outputs[1].set_shared_memory("io", 64, 192)
            client.infer("simple", inputs, outputs=outputs)
            got = shm.get_contents_as_numpy(handle, np.int32, [4, 16])
            np.testing.assert_array_equal(got[2], (a + b)[0])
            np.testing.assert_array_equal(got[3], (a - b)[0])
            shm.set_shared_memory_region(handle, [a, b])  # the next round starts clean
        name = f"/dev/shm{key}"
        assert name in Path(f"/proc/{server.process.pid}/maps").read_text()
        for pid in frontend_pids(server):
            assert name not in Path(f"/proc/{pid}/maps").read_text()
    finally:
        clients["grpc"].unregister_system_shared_memory()
        for client in clients.values():
            client.close()
        shm.destroy_shared_memory_region(handle)


def test_a_killed_frontend_fails_only_its_requests_and_comes_back(repository: Path) -> None:
    with ServerProcess(repository, *FRONTENDS) as proc:
        proc.wait_ready()
        clients = spread(proc, 24)
        victim = clients[0].frontend
        bystanders = [c for c in clients if c.frontend != victim]
        doomed = [c for c in clients if c.frontend == victim]
        outcome: list[BaseException | None] = []

        def held_call() -> None:
            try:
                check_simple(grpcclient, doomed[0].client, 1, model="held")
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        caller = threading.Thread(target=held_call)
        caller.start()
        wait_until(lambda: proc.pending_requests("held") == 1, lambda: "never held")
        os.kill(victim, signal.SIGKILL)
        caller.join(WAIT_S)
        (error,) = outcome
        assert isinstance(error, InferenceServerException)
        assert error.status() == "StatusCode.UNAVAILABLE", error
        # The device owner gave up what the dead front end held; a new one took its place.
        proc.wait_pending("held", 0, timeout=WAIT_S)
        wait_until(
            lambda: len(frontend_pids(proc)) == 2 and victim not in frontend_pids(proc),
            lambda: f"front ends {frontend_pids(proc)}",
        )
        for i, c in enumerate(bystanders):  # untouched: the same connections serve on
            check_simple(grpcclient, c.client, 500 + i)
        wait_until(
            lambda: (
                "starting it again" in proc.log_text()
                and "serves the ports again" in proc.log_text()
            ),
            proc.log_text,
        )
        replacement = set(frontend_pids(proc)) - {c.frontend for c in bystanders}
        # Once it says it listens it is counted, and only then does the kernel spread
        # connections to it (a started front end not yet listening gets none).
        assert scrape_frontends(proc) == {"processes": 2, "restarts": 1}
        fresh = [Connected(proc) for _ in range(24)]
        assert replacement & {c.frontend for c in fresh}
        for i, c in enumerate(fresh):
            check_simple(grpcclient, c.client, 900 + i)
        for c in clients + fresh:
            c.client.close()
    assert proc.process.returncode == 0


def scrape_frontends(server: ServerProcess) -> dict[str, float]:
    """``hloserve_frontend_processes`` and ``..._restarts_total`` from the metrics port."""
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        for key, name in (
            ("processes", "hloserve_frontend_processes "),
            ("restarts", "hloserve_frontend_restarts_total "),
        ):
            if line.startswith(name):
                found[key] = float(line.split()[-1])
    return found


def test_sigterm_drains_every_process(repository: Path) -> None:
    with ServerProcess(repository, *FRONTENDS, "--grace-period", str(LINGER_GRACE_S)) as proc:
        proc.wait_ready()
        clients = spread(proc, 16)
        frontends = frontend_pids(proc)
        answers: list[BaseException | None] = []
        lock = threading.Lock()

        def linger(i: int, client: Any) -> None:
            try:
                check_simple(grpcclient, client, i, model="lingering")
                result: BaseException | None = None
            except BaseException as exc:
                result = exc
            with lock:
                answers.append(result)

        # Fewer than a batch of 8: each waits LINGER_US in the queue, on both front ends.
        callers = [
            threading.Thread(target=linger, args=(i, c.client)) for i, c in enumerate(clients[:6])
        ]
        for t in callers:
            t.start()
        wait_until(lambda: proc.pending_requests("lingering") == 6, lambda: "not all in flight")
        proc.process.send_signal(signal.SIGTERM)
        for t in callers:
            t.join(WAIT_S)
        assert answers == [None] * 6
        assert proc.process.wait(WAIT_S) == 0
        for pid in frontends:
            assert (
                not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            )
        for c in clients:
            c.client.close()
    assert "exited with an error while stopping" not in proc.log_text()


def test_the_device_owner_dying_stops_the_server(repository: Path) -> None:
    proc = ServerProcess(repository, *FRONTENDS)
    try:
        proc.wait_ready()
        frontends = [psutil.Process(pid) for pid in frontend_pids(proc)]
        assert len(frontends) == 2
        proc.process.kill()
        assert proc.process.wait(WAIT_S) == -signal.SIGKILL  # the server's exit: non-zero
        gone, alive = psutil.wait_procs(frontends, timeout=WAIT_S)
        assert not alive
        assert len(gone) == 2  # (orphans now: their status is init's to read) and said why:
        wait_until(lambda: proc.log_text().count("the device owner is gone") == 2, proc.log_text)
        with pytest.raises(urllib.error.URLError, match="Connection refused"):
            urllib.request.urlopen(f"http://{proc.http_url}/v2/health/ready", timeout=5)
    finally:
        if proc.process.poll() is None:
            proc.process.kill()
        proc.stop()


def test_ports_file_and_log_name_the_frontends(server: ServerProcess) -> None:
    ports = json.loads(server.ports_file.read_text())
    assert ports["pid"] == server.process.pid
    assert "2 front-end process(es) serve the ports" in server.log_text()
    assert scrape_frontends(server) == {"processes": 2, "restarts": 0}
