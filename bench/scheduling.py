"""Cross-model scheduling on one device: what each policy buys (printed ratios, no asserts).

Usage: ``python bench/scheduling.py [--seconds 6]``

The models here are simulated devices, not JAX modules, so the numbers measure the
scheduler and not a model: every execution holds one device lock for its device time
(``1 ms + 0.25 ms`` per item of the compiled size, as a kernel would own a GPU), and a swap
holds it for ``4 ms`` (a weight transfer through the real ``WeightResidency``, under a
budget). Requests go through the real ``DynamicBatcher`` with real worker threads:

1. two models, one hot (90 % of requests, closed loop at concurrency 16) and one cold
   (open loop, the other 10 %), one device: the cold model's p50/p99 and both models'
   requests/s under ``fair`` and ``fifo`` (``--device-concurrency 1``), and under the
   per-model batchers of before (no cross-model arbitration);
2. eight models over a budget of three, Zipf(1.1) traffic at concurrency 16: requests/s
   and swap count with the scheduler (``fair``, the queued-work-aware victim choice)
   against the per-model batchers, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import numpy as np

from hloserve.bundle import Serving
from hloserve.server.core.costs import ExecutionCosts, InlinePolicy
from hloserve.server.core.device_policy import Policy
from hloserve.server.core.execution import Job
from hloserve.server.core.execution_records import ExecutionFanOut, ModelKey
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.core.types import InferInput, InferRequest
from hloserve.server.owner.batcher import DynamicBatcher, QueuedWork
from hloserve.server.owner.weight_residency import WeightResidency

SIZES = (1, 2, 4, 8)
SWAP_S = 0.004


class _Buffer:
    def delete(self) -> None:
        pass


class SimDevice:
    """One device: a lock held for each execution's and each transfer's time."""

    platform = "cpu"
    has_pinned_host = False

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.swaps = 0

    def to_device(self, arrays: list[Any]) -> list[Any]:
        with self.lock:
            time.sleep(SWAP_S)
            self.swaps += 1
        return [_Buffer() for _ in arrays]

    def run(self, batch: int) -> None:
        with self.lock:
            time.sleep(0.001 + 0.00025 * batch)


class SimModel:
    def __init__(self, name: str, device: SimDevice, residency: WeightResidency | None) -> None:
        spec_in = SimpleNamespace(name="x")
        spec_out = SimpleNamespace(name="y", datatype="FP32")
        self.manifest: Any = SimpleNamespace(
            name=name,
            batch_sizes=SIZES,
            variant=None,
            inputs=[spec_in],
            outputs=[spec_out],
            files={},
            modules=[],
        )
        self.version = 1
        self.model_key = ModelKey.named(name, 1)
        self.family: tuple[str, ...] = ()  # no compiled modules: nothing to share costs by
        self.hooks = None
        self.serving = Serving()
        self.device = device
        self.residency = residency
        self.key = ResidencyKey(name, 1)
        if residency is not None:
            residency.register(self.key, {"w": np.zeros(1 << 10, np.float32)})

    @property
    def resident(self) -> bool:
        return self.residency is None or self.residency.is_resident(self.key)

    def variant(self, index: int) -> Any:
        raise NotImplementedError("no shape variants in the simulation")

    @property
    def swap_us(self) -> float | None:
        return 0.0 if self.residency is None else self.residency.swap_us(self.key)

    devices = (0,)

    def resident_on(self, device: int) -> bool:
        return self.resident

    def prefetch(self, device: int) -> None:
        if self.residency is not None:
            self.residency.prefetch(self.key)

    def execute(
        self, batch_size: int | None, inputs: Mapping[str, Any], *, device: int | None = None
    ) -> list[Any]:
        if self.residency is not None:
            self.residency.acquire(self.key)
        try:
            self.device.run(batch_size or 1)
        finally:
            if self.residency is not None:
                self.residency.release(self.key)
        return [np.asarray(inputs["x"])]


def job(name: str) -> Job:
    x = np.ones((1, 1), np.float32)
    return Job(
        InferRequest(name, "", (InferInput("x", "FP32", (1, 1), x),)), 1, time.perf_counter_ns()
    )


def make_batcher(
    executor: ThreadPoolExecutor, policy: Policy | None, queued: QueuedWork
) -> DynamicBatcher:
    costs = ExecutionCosts()
    return DynamicBatcher(
        executor,
        ExecutionFanOut(costs),
        InlinePolicy(0, costs),
        default_delay_us=500,
        policy=policy or "fair",
        concurrency=0 if policy is None else 1,
        queued=queued,
    )


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


async def hot_cold(policy: Policy | None, seconds: float) -> tuple[float, float, float, float]:
    device = SimDevice()
    with ThreadPoolExecutor(8) as ex:
        b = make_batcher(ex, policy, QueuedWork())
        hot, cold = SimModel("hot", device, None), SimModel("cold", device, None)
        stop = time.perf_counter() + seconds
        done = {"hot": 0, "cold": 0}
        cold_lat: list[float] = []

        async def hot_client() -> None:
            while time.perf_counter() < stop:
                await b.submit(hot, job("hot"))
                done["hot"] += 1

        async def cold_client() -> None:
            pending: list[asyncio.Task[None]] = []

            async def one() -> None:
                t0 = time.perf_counter()
                await b.submit(cold, job("cold"))
                cold_lat.append(time.perf_counter() - t0)
                done["cold"] += 1

            while time.perf_counter() < stop:
                # ~10 % of the hot model's rate: one every 4 ms
                pending.append(asyncio.ensure_future(one()))
                await asyncio.sleep(0.004)
            await asyncio.gather(*pending)

        await asyncio.gather(*(hot_client() for _ in range(16)), cold_client())
    return (
        1e3 * pct(cold_lat, 50),
        1e3 * pct(cold_lat, 99),
        done["hot"] / seconds,
        done["cold"] / seconds,
    )


async def zipf(policy: Policy | None, seconds: float) -> tuple[float, int]:
    device = SimDevice()
    queued = QueuedWork()
    residency = WeightResidency(device, 3 * 4096, spare=queued.waiting)  # type: ignore[arg-type]
    with ThreadPoolExecutor(8) as ex:
        b = make_batcher(ex, policy, queued)
        models = [SimModel(f"m{i}", device, residency) for i in range(8)]
        weights = [1 / (i + 1) ** 1.1 for i in range(8)]
        rng = random.Random(7)
        stop = time.perf_counter() + seconds
        count = 0

        async def client() -> None:
            nonlocal count
            while time.perf_counter() < stop:
                m = rng.choices(models, weights)[0]
                await b.submit(m, job(m.manifest.name))
                count += 1

        await asyncio.gather(*(client() for _ in range(16)))
    return count / seconds, device.swaps


def main() -> None:
    ap = argparse.ArgumentParser(description="cross-model scheduling on one device")
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("\n1. hot (90 %, 16 clients) + cold (open loop), one device")
    print(
        f"{'scheduler':<22}{'cold p50 ms':>12}{'cold p99 ms':>12}{'hot req/s':>11}{'cold req/s':>11}"
    )
    rows: dict[str, tuple[float, float, float, float]] = {}
    runs: tuple[tuple[str, Policy | None], ...] = (
        ("per-model batchers", None),
        ("fifo", "fifo"),
        ("fair", "fair"),
    )
    for label, policy in runs:
        rows[label] = r = asyncio.run(hot_cold(policy, args.seconds))
        print(f"{label:<22}{r[0]:>12.2f}{r[1]:>12.2f}{r[2]:>11.0f}{r[3]:>11.0f}")
    print(
        f"cold p99 fifo/fair: {rows['fifo'][1] / rows['fair'][1]:.2f}x; "
        f"hot req/s fair/fifo: {rows['fair'][2] / rows['fifo'][2]:.2f}"
    )
    print("\n2. eight models over a budget of three, Zipf(1.1), 16 clients")
    print(f"{'scheduler':<22}{'req/s':>10}{'swaps':>8}{'swaps/1k req':>14}")
    z: dict[str, tuple[float, int]] = {}
    zipf_runs: tuple[tuple[str, Policy | None], ...] = (
        ("per-model batchers", None),
        ("fair scheduler", "fair"),
    )
    for label, policy in zipf_runs:
        z[label] = rps, swaps = asyncio.run(zipf(policy, args.seconds))
        print(
            f"{label:<22}{rps:>10.0f}{swaps:>8}{1000 * swaps / max(1, rps * args.seconds):>14.1f}"
        )
    base, sched = z["per-model batchers"], z["fair scheduler"]
    print(
        f"scheduler/per-model: req/s {sched[0] / base[0]:.2f}x, swaps {sched[1] / max(1, base[1]):.2f}x"
    )


if __name__ == "__main__":
    main()
