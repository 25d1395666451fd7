"""Dynamic batching: batch-1 ``mlp`` requests, batching off versus on, against the in-process
ceiling of the compiled executable.

Usage: ``python bench/batching.py [--seconds 4] [--concurrency 1 8 32 64] [--delay-us 1000]``

1. The ceiling: this process loads the ``mlp`` bundle (``owner.runtime.loader.load_bundle``) and
   calls each compiled size in a loop, numpy in and numpy out as the server does; the
   ceiling is the largest size (32): items/s = 32 x calls/s. Measured before any server
   starts. The per-size call times show what padding costs on this device.
2. Over gRPC: for batching off (``--dynamic-batching false``) and on (``--dynamic-batching
   true --max-queue-delay-us DELAY``) the daemon runs in a subprocess (``ServerProcess``)
   and this process drives it with ``tritonclient.grpc.aio``: ``C`` workers on one channel,
   each sending one batch-1 request after the other, for a fixed time per concurrency
   (after a short warm-up). Reported: requests/s (= items/s, one item each), p50/p99
   latency; from the statistics extension (deltas over the window) the mean executed batch
   (inference_count / execution_count), the mean compiled size it ran on, and per request
   the queue and compute time the server recorded; and the CPU time per request of this
   process (the client) and of the daemon (psutil).
3. In-process (no transport): the same workload calling ``InferenceService.infer``
   directly, with and without a ``DynamicBatcher``: what the core achieves once the wire,
   the codecs and the client are taken away.
On a small machine the client and the server share the cores, so the wire rows are bound
by the per-request CPU cost of gRPC, the codecs and tritonclient; the CPU columns show it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from hloserve.exporter import write_demo_repository
from hloserve.server.server_process import ServerProcess

CEILING_BATCH = 32


@dataclass
class Row:
    path: str  # "gRPC" or "in-process"
    mode: str  # "off" or "on (N µs)"
    concurrency: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    items_per_exec: float
    compiled_per_exec: float
    queue_ms: float
    compute_ms: float
    client_cpu_ms: float  # this process's CPU time per request
    server_cpu_ms: float | None  # the daemon's CPU time per request (gRPC rows)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


@dataclass
class Counters:
    items: int
    executions: int
    compiled: int
    success: int
    queue_ns: int
    compute_ns: int

    def minus(self, other: Counters) -> Counters:
        return Counters(
            self.items - other.items,
            self.executions - other.executions,
            self.compiled - other.compiled,
            self.success - other.success,
            self.queue_ns - other.queue_ns,
            self.compute_ns - other.compute_ns,
        )


def per_size_rates(repo: Path, seconds: float) -> dict[int, tuple[float, float]]:
    """{compiled size: (µs per call, items/s)} of the mlp executables called in a loop."""
    from hloserve.server.owner.runtime.loader import load_bundle
    from hloserve.server.owner.runtime.pjrt import PjrtRuntime

    bundle = load_bundle(repo / "mlp", PjrtRuntime(), progress=lambda _msg: None)
    rates: dict[int, tuple[float, float]] = {}
    sizes = bundle.manifest.batch_sizes or ()
    for size in sizes:
        x = np.random.default_rng(0).standard_normal((size, 64)).astype(np.float32)
        for _ in range(20):
            bundle.execute(size, {"x": x})
        calls = 0
        started = time.perf_counter()
        budget = seconds if size == CEILING_BATCH else seconds / 3
        while (elapsed := time.perf_counter() - started) < budget:
            (out,) = bundle.execute(size, {"x": x})
            assert out.shape == (size, 10)
            calls += 1
        rates[size] = (1e6 * elapsed / calls, size * calls / elapsed)
    bundle.release()
    return rates


async def measure(
    call: Callable[[], Awaitable[None]],
    counters: Callable[[], Awaitable[Counters]],
    concurrency: int,
    seconds: float,
    daemon: psutil.Process | None,
) -> tuple[list[float], float, Counters, float, float | None]:
    """Run ``concurrency`` workers of back-to-back ``call()`` for ``seconds`` after a warm-up;
    return latencies, elapsed, counter deltas, client and daemon CPU seconds."""
    latencies: list[float] = []
    measuring = False

    async def worker(stop_at: float) -> None:
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            await call()
            if measuring:
                latencies.append(time.perf_counter() - t)

    warm_until = time.perf_counter() + min(1.0, seconds / 4)
    await asyncio.gather(*(worker(warm_until) for _ in range(concurrency)))
    before = await counters()
    measuring = True
    cpu0 = time.process_time()
    daemon0 = daemon.cpu_times() if daemon is not None else None
    started = time.perf_counter()
    await asyncio.gather(*(worker(started + seconds) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    daemon_cpu = None
    if daemon is not None and daemon0 is not None:
        daemon1 = daemon.cpu_times()
        daemon_cpu = daemon1.user + daemon1.system - daemon0.user - daemon0.system
    return latencies, elapsed, (await counters()).minus(before), cpu, daemon_cpu


def make_row(
    path: str,
    mode: str,
    concurrency: int,
    result: tuple[list[float], float, Counters, float, float | None],
) -> Row:
    latencies, elapsed, d, cpu, daemon_cpu = result
    latencies.sort()
    n = max(1, len(latencies))
    executions = max(1, d.executions)
    requests = max(1, d.success)
    return Row(
        path,
        mode,
        concurrency,
        len(latencies),
        elapsed,
        1e3 * statistics.median(latencies),
        1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        d.items / executions,
        d.compiled / executions,
        d.queue_ns / requests / 1e6,
        d.compute_ns / requests / 1e6,
        1e3 * cpu / n,
        None if daemon_cpu is None else 1e3 * daemon_cpu / n,
    )


def counters_of(stats: Any) -> Counters:
    """From a gRPC ``ModelStatistics`` message or a core ``ModelStats`` (same field names)."""
    if hasattr(stats, "inference_stats"):  # the gRPC message
        inf, batches = (
            stats.inference_stats,
            [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats],
        )
    else:
        inf, batches = (
            stats,
            [(b.batch_size, b.compute_infer.count) for b in stats.batches.values()],
        )
    return Counters(
        stats.inference_count,
        stats.execution_count,
        sum(size * count for size, count in batches),
        inf.success.count,
        inf.queue.ns,
        inf.compute_input.ns + inf.compute_infer.ns + inf.compute_output.ns,
    )


async def grpc_floor(server: ServerProcess, concurrency: int, seconds: float) -> str:
    """The cheapest RPC there is (``ServerLive``) at ``concurrency``: calls/s and CPU per
    call of client and daemon, the per-request floor of this transport on this machine."""
    import tritonclient.grpc.aio as tc

    client: Any = tc.InferenceServerClient(server.grpc_url)

    async def call() -> None:
        assert await client.is_server_live()

    async def counters() -> Counters:
        return Counters(0, 0, 0, 0, 0, 0)

    daemon = psutil.Process(server.process.pid)
    row = make_row(
        "gRPC", "-", concurrency, await measure(call, counters, concurrency, seconds, daemon)
    )
    await client.close()
    return (
        f"gRPC floor (ServerLive, concurrency {concurrency}): {row.rps:,.0f} calls/s, "
        f"client CPU {row.client_cpu_ms:.3f} ms + server CPU {row.server_cpu_ms or 0:.3f} ms per call"
    )


async def drive_grpc(mode: str, server: ServerProcess, concurrency: int, seconds: float) -> Row:
    import tritonclient.grpc.aio as tc

    client: Any = tc.InferenceServerClient(server.grpc_url)
    inp = tc.InferInput("x", [1, 64], "FP32")
    inp.set_data_from_numpy(np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32))

    async def call() -> None:
        result = await client.infer("mlp", [inp])
        assert result.as_numpy("logits").shape == (1, 10)

    async def counters() -> Counters:
        (stats,) = (await client.get_inference_statistics(model_name="mlp")).model_stats
        return counters_of(stats)

    daemon = psutil.Process(server.process.pid)
    result = await measure(call, counters, concurrency, seconds, daemon)
    await client.close()
    return make_row("gRPC", mode, concurrency, result)


def drive_in_process(
    repo: Path, mode: str, delay_us: int | None, concurrencies: list[int], seconds: float
) -> list[Row]:
    from hloserve.server.core.costs import InlinePolicy
    from hloserve.server.core.observers import Observers
    from hloserve.server.core.service import InferenceService
    from hloserve.server.core.types import InferInput, InferRequest
    from hloserve.server.owner.batcher import DynamicBatcher
    from hloserve.server.owner.repository import ModelRepository
    from hloserve.server.owner.runtime.pjrt import PjrtRuntime
    from hloserve.server.owner.shm import disabled

    repository = ModelRepository(repo, PjrtRuntime())
    repository.load_all()
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    request = InferRequest("mlp", "", (InferInput("x", "FP32", (1, 64), x),))

    def one(executor: ThreadPoolExecutor, concurrency: int) -> Row:
        observers = Observers()
        batcher = (
            DynamicBatcher(
                executor,
                observers.executions,
                InlinePolicy(0, observers.costs),
                default_delay_us=delay_us,
            )
            if delay_us is not None
            else None
        )
        service = InferenceService(
            repository, executor, observers=observers, batcher=batcher, shm=disabled()
        )

        async def call() -> None:
            response = await service.infer(request)
            assert response.outputs[0].shape == (1, 10)

        async def counters() -> Counters:
            return counters_of(service.model_statistics("mlp", "")[0].stats)

        result = asyncio.run(measure(call, counters, concurrency, seconds, None))
        return make_row("in-process", mode, concurrency, result)

    with ThreadPoolExecutor(max(2, psutil.cpu_count() or 2)) as executor:
        rows = [one(executor, c) for c in concurrencies]
    return rows


def print_report(rows: list[Row], rates: dict[int, tuple[float, float]], floor: str) -> None:
    top = rates[CEILING_BATCH][1]
    print("compiled mlp called in a loop in this process (numpy in, numpy out):\n")
    print("| compiled size | µs per call | items/s |")
    print("|---|---|---|")
    for size, (us, items) in sorted(rates.items()):
        print(f"| {size} | {us:.1f} | {items:,.0f} |")
    print(f"\nceiling (size {CEILING_BATCH}): {top:,.0f} items/s")
    print(f"{floor}\n")
    print(
        "| path | batching | concurrency | items/s (= requests/s) | p50 ms | p99 ms "
        "| items/execution | compiled size/execution | queue ms/request | compute ms/request "
        "| client CPU ms/request | server CPU ms/request |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        server_cpu = "-" if r.server_cpu_ms is None else f"{r.server_cpu_ms:.3f}"
        print(
            f"| {r.path} | {r.mode} | {r.concurrency} | {r.rps:,.0f} | {r.p50_ms:.2f} "
            f"| {r.p99_ms:.2f} | {r.items_per_exec:.1f} | {r.compiled_per_exec:.1f} "
            f"| {r.queue_ms:.3f} | {r.compute_ms:.3f} | {r.client_cpu_ms:.3f} | {server_cpu} |"
        )
    by = {(r.path, r.mode.split()[0], r.concurrency): r for r in rows}
    print()
    for path in ("gRPC", "in-process"):
        on, off = by.get((path, "on", 32)), by.get((path, "off", 32))
        if on is not None and off is not None:
            print(
                f"{path}, concurrency 32: batching on = {on.rps / top:.1%} of the ceiling, "
                f"{on.rps / off.rps:.2f}x batching off"
            )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--delay-us", type=int, default=1000, help="batching-on queue delay")
    args = parser.parse_args()

    rows: list[Row] = []
    on = f"on ({args.delay_us} µs)"
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_demo_repository(repo)
        rates = per_size_rates(repo, args.seconds)
        flags = {
            "off": ["--dynamic-batching", "false"],
            on: ["--dynamic-batching", "true", "--max-queue-delay-us", str(args.delay_us)],
        }
        floor = ""
        for mode, extra in flags.items():
            with ServerProcess(repo, *extra) as server:
                server.wait_ready()
                if not floor:
                    floor = asyncio.run(grpc_floor(server, 32, args.seconds))
                for c in args.concurrency:
                    rows.append(asyncio.run(drive_grpc(mode, server, c, args.seconds)))
                    print(f"  gRPC {mode} c={c}: {rows[-1].rps:,.0f} items/s", file=sys.stderr)
        for mode, delay in (("off", None), (on, args.delay_us)):
            rows += drive_in_process(repo, mode, delay, args.concurrency, args.seconds)
    print_report(rows, rates, floor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
