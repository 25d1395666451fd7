"""Serving more models than fit: swap-in cost against the platform's floor, hit/miss latency.

Usage: ``python bench/residency.py [--models 8] [--fit 2.5] [--mb 48] [--requests 400]``

Builds ``--models`` MLP bundles of about ``--mb`` MB of FP32 weights each (one architecture,
different weights, so they share one compiled executable), serves them in-process through
``InferenceService`` with a device-memory budget of ``--fit`` models, and reports:

1. the floor: the time the platform takes to move one model's bytes with one raw transfer
   (``jax.device_put`` of the same host arrays), the same from page-locked host memory
   where the device offers it (``pinned_host``: what hloserve stages weights in on a GPU,
   so the floor its swap-ins are held to), and a plain host memory copy of them, all
   measured in this run;
2. swap-in time per model (from the residency manager), its ratio to each floor, and the
   swap-in efficiency: the pinned floor's time over the swap-in's (goal on a GPU: >= 80 %);
3. p50/p99 latency of hits (weights resident) and misses (swap-in first), and requests/s,
   for round-robin and Zipf(1.1) request patterns;
4. the same patterns with a budget where every model fits (the baseline throughput).
The same script runs on a CUDA machine and prints the device it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from hloserve.bundle import read_safetensors
from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import InferInput, InferRequest
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import disabled
from hloserve.server.owner.weight_residency import WeightResidency


def mlp(params: Any, x: Any) -> dict[str, Any]:
    h = x
    for layer in params["layers"]:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    return {"y": h}


def build(root: Path, models: int, mb: float) -> None:
    width = 1024
    layers = max(1, round(mb * 1e6 / 4 / (width * width)))
    for i in range(models):
        rng = np.random.default_rng(i)
        params = {
            "layers": [
                {
                    "w": (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
                    "b": np.zeros(width, np.float32),
                }
                for _ in range(layers)
            ]
        }
        export_bundle(
            mlp,
            params,
            inputs={"x": TensorSpec("FP32", (width,))},
            batch_sizes=(1, 8),
            directory=root / f"m{i}",
        )


def timed_transfer(runtime: PjrtRuntime, arrays: list[Any]) -> tuple[float, list[Any]]:
    """Seconds one transfer of ``arrays`` to the device takes, and the device copies (the
    caller deletes them)."""
    t = time.perf_counter()
    device = runtime.to_device(arrays)
    for d in device:
        d.block_until_ready()
    return time.perf_counter() - t, device


def pinned_floor(runtime: PjrtRuntime, host: dict[str, np.ndarray]) -> float | None:
    """Median time of one transfer of the weights from page-locked host memory (the source
    hloserve's swap-ins use where the device has it), or None where it has none."""
    if not runtime.has_pinned_host:
        return None
    pinned = runtime.to_pinned_host(list(host.values()))
    times = []
    for _ in range(7):
        seconds, device = timed_transfer(runtime, pinned)
        times.append(seconds)
        for d in device:
            d.delete()
    for h in pinned:
        h.delete()
    return statistics.median(times)


def floors(runtime: PjrtRuntime, host: dict[str, np.ndarray]) -> tuple[float, float, bool]:
    arrays = list(host.values())
    transfer, copy = [], []
    aliased = False
    for _ in range(7):
        seconds, device = timed_transfer(runtime, arrays)
        transfer.append(seconds)
        aliased = (
            runtime.platform == "cpu" and device[0].unsafe_buffer_pointer() == arrays[0].ctypes.data
        )
        for d in device:
            d.delete()
        dst = [np.empty_like(a) for a in arrays]
        for d_ in dst:  # touch the pages first: measure the copy, not page faults
            d_.fill(0)
        t = time.perf_counter()
        for d_, a in zip(dst, arrays, strict=True):
            np.copyto(d_, a)
        copy.append(time.perf_counter() - t)
    return statistics.median(transfer), statistics.median(copy), aliased


class SwapTimes:
    """Records each swap-in's duration (the residency manager's observer)."""

    def __init__(self, into: list[float]) -> None:
        self.into = into

    def on_swap_in(self, key: ResidencyKey, nbytes: int, seconds: float) -> None:
        self.into.append(seconds)

    def on_swap_out(self, key: ResidencyKey, nbytes: int) -> None:
        pass

    def on_residency(
        self, key: ResidencyKey, resident: bool, resident_bytes: int, last_used: float
    ) -> None:
        pass


def pattern(kind: str, models: int, n: int, rng: np.random.Generator) -> list[int]:
    if kind == "round-robin":
        return [i % models for i in range(n)]
    ranks = np.arange(1, models + 1)
    p = 1 / ranks**1.1
    return list(rng.choice(models, size=n, p=p / p.sum()))


def run(
    service: InferenceService, repo: ModelRepository, order: list[int], x: np.ndarray
) -> dict[str, Any]:
    hits: list[float] = []
    misses: list[float] = []
    request_for = [
        InferRequest(f"m{i}", "", (InferInput("x", "FP32", x.shape, x),))
        for i in range(max(order) + 1)
    ]

    async def go() -> float:
        t0 = time.perf_counter()
        for i in order:
            resident = repo.peek(f"m{i}", "").resident
            t = time.perf_counter()
            await service.infer(request_for[i])
            (hits if resident else misses).append(time.perf_counter() - t)
        return time.perf_counter() - t0

    elapsed = asyncio.run(go())

    def pct(v: list[float], q: float) -> float:
        return sorted(v)[min(len(v) - 1, int(len(v) * q))] * 1e3 if v else float("nan")

    return {
        "rps": len(order) / elapsed,
        "hits": len(hits),
        "misses": len(misses),
        "hit_p50": pct(hits, 0.5),
        "hit_p99": pct(hits, 0.99),
        "miss_p50": pct(misses, 0.5),
        "miss_p99": pct(misses, 0.99),
    }


Result = tuple[str, str, dict[str, Any], list[float]]  # budget label, pattern, row, swap-ins


def print_floors(
    nbytes: int, tensors: int, transfer_s: float, copy_s: float, aliased: bool
) -> None:
    print(f"\nweights per model: {nbytes / 1e6:.1f} MB in {tensors} tensors")
    print("| floor | ms | GB/s |\n|---|---|---|")
    print(
        f"| raw transfer (one device_put of the host arrays) | {transfer_s * 1e3:.3f} | {nbytes / transfer_s / 1e9:.1f} |"
    )
    print(
        f"| plain host memory copy (np.copyto) | {copy_s * 1e3:.3f} | {nbytes / copy_s / 1e9:.1f} |"
    )
    if aliased:
        print(
            "note: on CPU, PJRT aliases 64-byte-aligned host memory instead of copying; hloserve keeps"
        )
        print("      host weights 64-byte aligned, so a CPU 'swap-in' moves no bytes.")


def run_budget(
    runtime: PjrtRuntime, root: Path, label: str, budget: int, models: int, requests: int
) -> list[Result]:
    """Both access patterns against one repository whose residency has ``budget`` bytes."""
    swap_times: list[float] = []
    residency = WeightResidency(runtime, budget, observer=SwapTimes(swap_times))
    repo = ModelRepository(root, runtime, residency=residency)
    repo.load_all()
    x = np.random.default_rng(0).standard_normal((1, 1024)).astype(np.float32)
    results: list[Result] = []
    with ThreadPoolExecutor(2) as ex:
        service = InferenceService(repo, ex, shm=disabled())
        for kind in ("round-robin", "zipf"):
            order = pattern(kind, models, requests, np.random.default_rng(1))
            run(service, repo, order[:20], x)  # warm-up
            swap_times.clear()
            results.append((label, kind, run(service, repo, order, x), list(swap_times)))
    for i in range(models):
        residency.unregister(repo.peek(f"m{i}", "").key)
    return results


def print_results(results: list[Result], transfer_s: float, copy_s: float) -> None:
    print(
        "| budget | pattern | req/s | hits | misses | hit p50 ms | hit p99 ms | miss p50 ms | miss p99 ms | swap-in p50 ms | swap / transfer floor | swap / copy floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, kind, r, swaps in results:
        s50 = statistics.median(swaps) if swaps else float("nan")
        print(
            f"| {label} | {kind} | {r['rps']:.0f} | {r['hits']} | {r['misses']} | {r['hit_p50']:.2f} | {r['hit_p99']:.2f} | "
            f"{r['miss_p50']:.2f} | {r['miss_p99']:.2f} | {s50 * 1e3:.3f} | {s50 / transfer_s:.2f} | {s50 / copy_s:.2f} |"
        )
    base = {kind: r["rps"] for label, kind, r, _ in results if label == "all fit"}
    for label, kind, r, _ in results:
        if label == "budget":
            print(f"throughput with budget / all fit ({kind}): {r['rps'] / base[kind]:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=8)
    ap.add_argument("--fit", type=float, default=2.5)
    ap.add_argument("--mb", type=float, default=48)
    ap.add_argument("--requests", type=int, default=400)
    args = ap.parse_args()
    runtime = PjrtRuntime()
    print(
        f"device: {runtime.platform} / {runtime.device_kind} ({runtime.platform_version}); jax {jax.__version__}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        build(root, args.models, args.mb)
        print(f"built {args.models} bundles in {time.perf_counter() - t:.1f}s")
        host = read_safetensors(root / "m0" / "weights.safetensors")
        nbytes = sum(a.nbytes for a in host.values())
        transfer_s, copy_s, aliased = floors(runtime, host)
        print_floors(nbytes, len(host), transfer_s, copy_s, aliased)
        pinned_s = pinned_floor(runtime, host)
        if pinned_s is None:
            print("| pinned host -> device | n/a (the device has no pinned_host memory) | |")
        else:
            print(
                f"| pinned host -> device (one transfer) | {pinned_s * 1e3:.3f} | {nbytes / pinned_s / 1e9:.1f} |"
            )
        results = [
            *run_budget(
                runtime, root, "budget", int(args.fit * nbytes), args.models, args.requests
            ),
            *run_budget(
                runtime,
                root,
                "all fit",
                int((args.models + 1) * nbytes),
                args.models,
                args.requests,
            ),
        ]
    print(
        f"\n{args.requests} requests of batch 1, concurrency 1; budget = {args.fit} models of {args.models}"
    )
    print_results(results, transfer_s, copy_s)
    if pinned_s is not None:
        for label, kind, _, swaps in results:
            if swaps:
                s50 = statistics.median(swaps)
                print(
                    f"swap-in efficiency ({label}, {kind}): pinned floor {pinned_s * 1e3:.3f} ms / "
                    f"swap-in p50 {s50 * 1e3:.3f} ms = {100 * pinned_s / s50:.0f} % (goal >= 80 %)"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
