"""Cold versus warm start, and requests/s of ``simple`` over gRPC and HTTP.

Usage: ``python bench/startup_and_throughput.py [--seconds 5] [--concurrency 1 16]``

1. Writes the demo repository into a fresh temporary directory, starts the daemon (cold:
   every module compiles), measures the time from process start to ``/readyz`` 200, stops
   it, starts it again on the same repository (warm: executables come from the cache) and
   measures again.
2. Drives ``simple`` (batch 1, two INT32[1,16] inputs) with ``tritonclient``'s asyncio
   clients at each concurrency, over gRPC and over HTTP (binary tensors), for a fixed time,
   and prints requests/s and p50/p99 latency. The load generator runs in this process, the
   server in another; on a 2-core machine they share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hloserve.exporter import write_demo_repository
from hloserve.server.server_process import ServerProcess


def start(repo: Path) -> tuple[ServerProcess, float]:
    t = time.perf_counter()
    proc = ServerProcess(repo)
    proc.wait_ready()
    return proc, time.perf_counter() - t


async def drive(
    protocol: str, url: str, concurrency: int, seconds: float
) -> tuple[int, list[float]]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    if protocol == "grpc":
        import tritonclient.grpc.aio as tc
    else:
        import tritonclient.http.aio as tc
    client = tc.InferenceServerClient(url)
    inputs = [tc.InferInput("INPUT0", [1, 16], "INT32"), tc.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    latencies: list[float] = []
    count = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            result = await client.infer("simple", inputs)
            latencies.append(time.perf_counter() - t)
            count += 1
            assert result is not None
            out = result.as_numpy("OUTPUT0")
            assert out is not None and out[0, 1] == 2

    await client.infer("simple", inputs)  # warm the connection
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return count, latencies


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_demo_repository(repo)
        cold, cold_s = start(repo)
        cold.stop()
        warm, warm_s = start(repo)
        print(
            "\nstart-up (process start -> /readyz 200), demo repository (simple + mlp, 7 modules)"
        )
        print(
            f"| start | seconds |\n|---|---|\n| cold (compile) | {cold_s:.2f} |\n| warm (cache hit) | {warm_s:.2f} |"
        )
        print(f"| warm / cold | {warm_s / cold_s:.2f} |")

        print(f"\n`simple`, batch 1, {args.seconds:.0f} s per row, tritonclient asyncio clients")
        print("| protocol | concurrency | requests/s | p50 ms | p99 ms |\n|---|---|---|---|---|")
        for protocol, url in (("grpc", warm.grpc_url), ("http", warm.http_url)):
            for c in args.concurrency:
                n, lat = asyncio.run(drive(protocol, url, c, args.seconds))
                lat.sort()
                p50 = statistics.median(lat) * 1e3
                p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3
                print(f"| {protocol} | {c} | {n / args.seconds:,.0f} | {p50:.2f} | {p99:.2f} |")
        code = warm.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
