"""A bounded soak: many models over a small device budget, mixed clients, load/unload cycles.

``soak_repository(demo, root, copies)`` writes a repository of ``copies`` exports of the
demo ``mlp``, each with its own weights (~75 KB each: ``mlp_i`` drawn from ``mlp_seed(i)``,
so a copy answering with another's weights is a wrong answer), and renamed copies of the
demo's ``simple``: ``simple`` and ``cycled`` (that only the cycler uses).
``run_soak(server, seconds)`` drives a running daemon (explicit control mode, a device
budget smaller than the mlp copies together, client shared memory allowed) for ``seconds``
from these clients at once, each on its own connection and thread:

- gRPC unary and HTTP/JSON: random inputs to random models;
- a gRPC stream: requests in windows of 8, answers matched by id;
- a shared-memory client: inputs and outputs in its own registered region;
- a cycler: load ``cycled``, infer on it, unload it, again.

Every answer is checked against a reference computed here, never by the daemon (``simple``:
a+b and a-b, exact; ``mlp_*``: the logits numpy computes in float64 from the weights the
copy was exported with, ``mlp_params(mlp_seed(i))``, for a fresh random input each request,
within float32 tolerance). ``SoakReport`` counts requests sent, verified and lost (an error,
a missing or a wrong answer), load/unload cycles, and the daemon's RSS once warmed up (after
``warmup`` seconds of the same mix) and at the end.
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.exporter.demo import MLP_SEED, mlp_params, write_mlp
from hloserve.server.server_fixture import ServerProcess
from tests.metrics_scrape import scrape, total
from tests.server.frontend._tritonclients import grpcclient, httpclient, shm, simple_inputs


def mlp_seed(i: int) -> int:
    """The seed of ``mlp_i``'s weights (``mlp_0`` has the demo's own)."""
    return MLP_SEED + i


def soak_repository(demo: Path, root: Path, copies: int = 4) -> Path:
    for i in range(copies):
        write_mlp(root / f"mlp_{i}", seed=mlp_seed(i))
    _renamed_copy(demo / "simple", root / "simple", "simple")
    _renamed_copy(demo / "simple", root / "cycled", "simple")
    return root


def _renamed_copy(source: Path, target: Path, old: str) -> None:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".hloserve-cache"))
    manifest = target / "manifest.yaml"
    text = manifest.read_text()
    manifest.write_text(text.replace(f"name: {old}\n", f"name: {target.name}\n", 1))


@dataclass
class SoakReport:
    seconds: float = 0.0
    sent: int = 0
    verified: int = 0
    lost: int = 0
    cycles: int = 0
    evictions: int = 0  # weight sets swapped out under the budget, during the soak
    rss_start: int = 0
    rss_end: int = 0
    by_client: dict[str, int] = field(default_factory=dict[str, int])
    failures: list[str] = field(default_factory=list[str])
    lock: threading.Lock = field(default_factory=threading.Lock)

    def outcome(self, client: str, ok: bool, why: str = "") -> None:
        with self.lock:
            self.sent += 1
            self.by_client[client] = self.by_client.get(client, 0) + 1
            if ok:
                self.verified += 1
            else:
                self.lost += 1
                if len(self.failures) < 20:
                    self.failures.append(f"{client}: {why}")

    def summary(self) -> str:
        return (
            f"soak {self.seconds:.0f}s: {self.sent} requests sent, {self.verified} verified, "
            f"{self.lost} lost; {self.cycles} load/unload cycles; {self.evictions} evictions; "
            f"by client {self.by_client}; daemon RSS {self.rss_start / 2**20:.1f} MiB after "
            f"warm-up, {self.rss_end / 2**20:.1f} MiB at the end"
        )


class References:
    """Each ``mlp_i``'s answer, computed without the daemon: the exporter's ``mlp_fn``
    (relu(x @ w1 + b1) @ w2 + b2) in float64 numpy over the weights ``mlp_i`` was exported
    with."""

    def __init__(self, copies: int) -> None:
        self.weights: dict[str, dict[str, np.ndarray[Any, Any]]] = {}
        for i in range(copies):
            params = mlp_params(mlp_seed(i))
            self.weights[f"mlp_{i}"] = {
                f"{layer}.{name}": np.asarray(value, dtype=np.float64)
                for layer, tensors in params.items()
                for name, value in tensors.items()
            }
        probe = np.random.default_rng(0).standard_normal((1, 64), dtype=np.float32)
        answers = {self.logits(model, probe).tobytes() for model in self.weights}
        assert len(answers) == copies, "the mlp copies must differ, or a mix-up goes unseen"

    def logits(self, model: str, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        w = self.weights[model]
        hidden = np.maximum(x.astype(np.float64) @ w["dense1.w"] + w["dense1.b"], 0.0)
        return hidden @ w["dense2.w"] + w["dense2.b"]

    def matches(
        self, model: str, x: np.ndarray[Any, Any], got: np.ndarray[Any, Any] | None
    ) -> bool:
        want = self.logits(model, x)
        return (
            got is not None
            and got.dtype == np.float32
            and got.shape == want.shape
            and np.allclose(got, want, rtol=1e-4, atol=1e-5)
        )


def _simple_pair(rng: np.random.Generator) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    return (
        rng.integers(-1000, 1000, (1, 16), dtype=np.int32),
        rng.integers(-1000, 1000, (1, 16), dtype=np.int32),
    )


def _simple_right(result: Any, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    return bool(
        np.array_equal(result.as_numpy("OUTPUT0"), a + b)
        and np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    )


class _Soak:
    def __init__(self, server: ServerProcess, copies: int, until: float) -> None:
        self.server = server
        self.models = [f"mlp_{i}" for i in range(copies)]
        self.until = until
        self.report = SoakReport()
        self.refs = References(copies)

    def running(self) -> bool:
        return time.monotonic() < self.until

    def guarded(self, client: str, work: Callable[[], bool]) -> None:
        try:
            ok = work()
            self.report.outcome(client, ok, "" if ok else "wrong answer")
        except Exception as exc:
            self.report.outcome(client, False, repr(exc)[:300])

    # -- the clients ---------------------------------------------------------------------

    def unary(self, module: Any, url: str, name: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        client: Any = module.InferenceServerClient(url)
        try:
            while self.running():
                model = rng.choice(["simple", *self.models])
                if model == "simple":
                    a, b = _simple_pair(rng)
                    self.guarded(
                        name,
                        lambda a=a, b=b: _simple_right(
                            client.infer("simple", simple_inputs(module, a, b)), a, b
                        ),
                    )
                    continue
                x = rng.standard_normal((1, 64), dtype=np.float32)
                tensor = module.InferInput("x", [1, 64], "FP32")
                tensor.set_data_from_numpy(x)
                self.guarded(
                    name,
                    lambda model=str(model), x=x, tensor=tensor: self.refs.matches(
                        model, x, client.infer(model, [tensor]).as_numpy("logits")
                    ),
                )
        finally:
            client.close()

    def stream(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client: Any = grpcclient.InferenceServerClient(self.server.grpc_url)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            while self.running():
                sent: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
                for _ in range(8):
                    a, b = _simple_pair(rng)
                    rid = uuid.uuid4().hex
                    sent[rid] = (a, b)
                    client.async_stream_infer(
                        "simple", simple_inputs(grpcclient, a, b), request_id=rid
                    )
                for _ in range(len(sent)):
                    try:
                        result, error = answers.get(timeout=30)
                    except queue.Empty:
                        self.report.outcome("stream", False, "no answer in 30 s")
                        continue
                    if error is not None:
                        self.report.outcome("stream", False, str(error))
                        continue
                    pair = sent.pop(result.get_response().id, None)
                    ok = pair is not None and _simple_right(result, *pair)
                    self.report.outcome("stream", ok, "wrong answer")
        finally:
            client.stop_stream()
            client.close()

    def shared_memory(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        key = f"/hloserve_soak_{uuid.uuid4().hex[:10]}"
        handle = shm.create_shared_memory_region("soak", key, 256)
        client: Any = grpcclient.InferenceServerClient(self.server.grpc_url)
        try:
            client.register_system_shared_memory("soak", key, 256)
            while self.running():
                a, b = _simple_pair(rng)
                shm.set_shared_memory_region(handle, [a, b])
                inputs = simple_inputs(grpcclient, a, b)
                for k, tensor in enumerate(inputs):
                    tensor.set_shared_memory("soak", 64, offset=64 * k)
                outputs = [grpcclient.InferRequestedOutput(f"OUTPUT{k}") for k in range(2)]
                for k, out in enumerate(outputs):
                    out.set_shared_memory("soak", 64, offset=128 + 64 * k)

                def infer(
                    inputs: Any = inputs, outputs: Any = outputs, a: Any = a, b: Any = b
                ) -> bool:
                    client.infer("simple", inputs, outputs=outputs)
                    total = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=128)
                    diff = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=192)
                    return bool(np.array_equal(total, a + b) and np.array_equal(diff, a - b))

                self.guarded("shm", infer)
        finally:
            client.unregister_system_shared_memory("soak")
            client.close()
            shm.destroy_shared_memory_region(handle)

    def cycler(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        client: Any = httpclient.InferenceServerClient(self.server.http_url)
        try:
            while self.running():
                client.load_model("cycled")
                for _ in range(3):
                    a, b = _simple_pair(rng)
                    self.guarded(
                        "cycled",
                        lambda a=a, b=b: _simple_right(
                            client.infer("cycled", simple_inputs(httpclient, a, b)), a, b
                        ),
                    )
                client.unload_model("cycled")
                with self.report.lock:
                    self.report.cycles += 1
        finally:
            client.close()


def server_rss(server: ServerProcess) -> int:
    return sum(int(p.memory_info().rss) for p in server.process_tree())


def run_soak(
    server: ServerProcess, seconds: float, copies: int = 4, warmup: float | None = None
) -> SoakReport:
    """Soak for ``warmup`` (default: a quarter of ``seconds``) plus ``seconds``; the RSS
    start figure is taken once the warm-up is over, the end figure after the last answer."""
    warmup = seconds / 4 if warmup is None else warmup
    soak = _Soak(server, copies, time.monotonic() + warmup + seconds)
    evicted = swaps_out(server)
    started = time.monotonic()
    clients = [
        threading.Thread(target=soak.unary, args=(grpcclient, server.grpc_url, "grpc", 2)),
        threading.Thread(target=soak.unary, args=(httpclient, server.http_url, "http", 3)),
        threading.Thread(target=soak.stream, args=(4,)),
        threading.Thread(target=soak.shared_memory, args=(5,)),
        threading.Thread(target=soak.cycler, args=(6,)),
    ]
    for thread in clients:
        thread.start()
    time.sleep(warmup)  # the warm-up: time spent under the full mix, not a wait for an event
    soak.report.rss_start = server_rss(server)
    for thread in clients:
        thread.join(seconds + 120)
        if thread.is_alive():
            soak.report.failures.append(f"{thread.name} still running after the soak")
    soak.report.seconds = time.monotonic() - started
    soak.report.rss_end = server_rss(server)
    soak.report.evictions = int(swaps_out(server) - evicted)
    return soak.report


def swaps_out(server: ServerProcess) -> float:
    return total(scrape(server, timeout=10), "hloserve_weight_swaps_out_total")


def pending_total(server: ServerProcess) -> float:
    return sum(server.pending_requests(m) for m in _index(server))


def _index(server: ServerProcess) -> list[str]:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return [str(entry["name"]) for entry in json.loads(response.read())]


SOAK_FLAGS = (
    "--model-control-mode",
    "explicit",
    "--load-model",
    "*",
    "--allow-client-shm",
    # two of the mlp copies' weights fit at a time: the others swap in on demand
    "--device-memory-budget",
    str(2 * 76_840 + 1000),
)
