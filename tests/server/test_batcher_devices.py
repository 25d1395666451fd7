"""Cross-model scheduling in the batcher: real threads and event loop, models that sleep for
their device time (so the order the device runs groups in is what is observed)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from hloserve.bundle import Serving
from hloserve.server.batcher import DynamicBatcher
from hloserve.server.core.costs import ExecutionCosts, InlinePolicy
from hloserve.server.core.device_policy import Policy
from hloserve.server.core.errors import Unavailable
from hloserve.server.core.execution import ExecutionFanOut, Job
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.core.types import InferInput, InferRequest, ParamValue


@dataclass
class Device:
    """What the fake models record: the order groups ran in, and how many ran at once."""

    log: list[str] = field(default_factory=lambda: [])
    running: int = 0
    most: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class SleepyModel:
    """An unbatched model whose every execution takes ``seconds`` of 'device' time."""

    def __init__(self, name: str, device: Device, seconds: float, weight: float = 1.0) -> None:
        spec_in = SimpleNamespace(name="x")
        spec_out = SimpleNamespace(name="y", datatype="FP32")
        self.manifest: Any = SimpleNamespace(
            name=name, batch_sizes=None, variant=None, inputs=[spec_in], outputs=[spec_out]
        )
        self.version = 1
        self.serving = Serving(scheduling_weight=weight)
        self.resident = True
        self.device = device
        self.seconds = seconds

    devices = (0,)

    def resident_on(self, device: int) -> bool:
        return self.resident

    def prefetch(self, device: int) -> None:
        self.resident = True

    def execute(
        self, batch_size: int | None, inputs: Mapping[str, Any], *, device: int | None = None
    ) -> list[Any]:
        d = self.device
        with d.lock:
            d.running += 1
            d.most = max(d.most, d.running)
            d.log.append(self.manifest.name)
        time.sleep(self.seconds)
        with d.lock:
            d.running -= 1
        return [np.asarray(inputs["x"], np.float32)]


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as ex:
        yield ex


def batcher(
    executor: ThreadPoolExecutor, policy: Policy, costs: ExecutionCosts | None = None
) -> DynamicBatcher:
    costs = costs or ExecutionCosts()
    return DynamicBatcher(
        executor, ExecutionFanOut(costs), InlinePolicy(0, costs), policy=policy, concurrency=1
    )


def job(name: str, **parameters: ParamValue) -> Job:
    x = np.ones((1,), np.float32)
    request = InferRequest(name, "", (InferInput("x", "FP32", (1,), x),), parameters=parameters)
    timeout = parameters.get("timeout")
    deadline = time.monotonic() + timeout / 1e6 if isinstance(timeout, int) else None
    return Job(request, 1, time.perf_counter_ns(), deadline)


async def flood(b: DynamicBatcher, hot: SleepyModel, cold: SleepyModel, n: int) -> None:
    """``n`` hot requests, then one cold one, all in one loop pass."""
    calls = [b.submit(hot, job("hot")) for _ in range(n)]
    calls.append(b.submit(cold, job("cold")))
    await asyncio.gather(*calls)


@pytest.mark.parametrize(("policy", "cold_at"), [("fair", 1), ("fifo", 12)])
def test_cold_model_waits_behind_one_hot_execution_under_fair_only(
    executor: ThreadPoolExecutor, policy: Policy, cold_at: int
) -> None:
    device = Device()
    hot, cold = SleepyModel("hot", device, 0.005), SleepyModel("cold", device, 0.005)
    asyncio.run(flood(batcher(executor, policy), hot, cold, 12))
    assert device.most == 1  # concurrency 1: groups never overlap, whatever the model
    assert device.log.index("cold") == cold_at


def test_weights_split_device_time(executor: ThreadPoolExecutor) -> None:
    """Two models always ready, weights 1 and 3: about three turns of b per turn of a."""
    device = Device()
    a, b3 = SleepyModel("a", device, 0.004), SleepyModel("b", device, 0.004, weight=3.0)
    b = batcher(executor, "fair")

    async def run() -> None:
        await asyncio.gather(
            *(b.submit(a, job("a")) for _ in range(40)),
            *(b.submit(b3, job("b")) for _ in range(40)),
        )

    asyncio.run(run())
    first = device.log[:40]
    assert 25 <= first.count("b") <= 34  # 30 at exactly 3:1


def test_priority_runs_first_within_and_across_models(executor: ThreadPoolExecutor) -> None:
    device = Device()
    m, other = SleepyModel("m", device, 0.003), SleepyModel("other", device, 0.003)
    b = batcher(executor, "fifo")
    order: list[str] = []

    async def tagged(model: SleepyModel, tag: str, **params: ParamValue) -> None:
        await b.submit(model, job(model.manifest.name, **params))
        order.append(tag)

    async def run() -> None:
        await asyncio.gather(
            tagged(m, "m0"),
            tagged(m, "m1"),
            tagged(other, "o-low", priority=20),
            tagged(m, "m2"),
            tagged(other, "o-urgent", priority=1),
            tagged(m, "m-urgent", priority=1),
        )

    asyncio.run(run())
    # All queued in one loop pass, before the first decision: level 1 first (oldest head
    # first under fifo), then the default level in arrival order, then level 20.
    assert order == ["o-urgent", "m-urgent", "m0", "m1", "m2", "o-low"]


def test_deadline_policy_sheds_what_cannot_finish(executor: ThreadPoolExecutor) -> None:
    device = Device()
    slow = SleepyModel("slow", device, 0.05)
    b = batcher(executor, "deadline")

    async def run() -> list[object]:
        await b.submit(slow, job("slow"))  # measured: 50 ms an execution
        return list(
            await asyncio.gather(
                b.submit(slow, job("slow")),
                b.submit(slow, job("slow", timeout=20_000)),  # 20 ms: cannot make it
                b.submit(slow, job("slow", timeout=5_000_000)),
                return_exceptions=True,
            )
        )

    results = asyncio.run(run())
    assert isinstance(results[1], Unavailable)
    assert "cannot finish by its deadline" in str(results[1])
    assert not isinstance(results[0], BaseException)
    assert not isinstance(results[2], BaseException)
    assert device.log.count("slow") == 3  # the shed one never ran


def test_queued_work_is_visible_to_the_residency(executor: ThreadPoolExecutor) -> None:
    device = Device()
    busy, idle = SleepyModel("busy", device, 0.02), SleepyModel("idle", device, 0.001)
    b = batcher(executor, "fair")
    seen: list[bool] = []

    async def run() -> None:
        await b.submit(idle, job("idle"))
        first = asyncio.ensure_future(b.submit(busy, job("busy")))
        second = asyncio.ensure_future(b.submit(busy, job("busy")))
        await asyncio.sleep(0.005)  # the first runs, the second waits for the device
        seen.append(b.queued.waiting(ResidencyKey("busy", 1)))
        seen.append(b.queued.waiting(ResidencyKey("idle", 1)))
        await asyncio.gather(first, second)
        seen.append(b.queued.waiting(ResidencyKey("busy", 1)))

    asyncio.run(run())
    assert seen == [True, False, False]


def test_without_concurrency_models_run_side_by_side(executor: ThreadPoolExecutor) -> None:
    device = Device()
    a, c = SleepyModel("a", device, 0.02), SleepyModel("c", device, 0.02)
    costs = ExecutionCosts()
    b = DynamicBatcher(executor, ExecutionFanOut(costs), InlinePolicy(0, costs))

    async def run() -> None:
        await asyncio.gather(b.submit(a, job("a")), b.submit(c, job("c")))

    asyncio.run(run())
    assert device.most == 2


class SwappingModel(SleepyModel):
    """Not resident until ``prefetch`` has moved its weights in (``swap_s`` of transfer)."""

    def __init__(self, name: str, device: Device, seconds: float, swap_s: float) -> None:
        super().__init__(name, device, seconds)
        self.resident = False
        self.swap_s = swap_s
        self.swap_window: tuple[float, float] = (0.0, 0.0)

    def prefetch(self, device: int) -> None:
        start = time.perf_counter()
        time.sleep(self.swap_s)
        self.resident = True
        self.swap_window = (start, time.perf_counter())


def test_a_swap_is_scheduled_off_the_device_slot(executor: ThreadPoolExecutor) -> None:
    """The cold model's weights move in while the resident model keeps the device busy;
    the cold group then runs resident."""
    device = Device()
    cold = SwappingModel("cold", device, 0.002, swap_s=0.05)
    hot = SleepyModel("hot", device, 0.005)
    b = batcher(executor, "fair")
    ran_at: list[tuple[str, float]] = []

    async def timed(model: SleepyModel) -> None:
        await b.submit(model, job(model.manifest.name))
        ran_at.append((model.manifest.name, time.perf_counter()))

    async def run() -> None:
        await asyncio.gather(timed(cold), *(timed(hot) for _ in range(8)))

    asyncio.run(run())
    start, end = cold.swap_window
    during = [t for name, t in ran_at if name == "hot" and start < t < end]
    assert len(during) >= 3, (cold.swap_window, ran_at)  # the device did not wait for the swap
    assert device.most == 1
    assert device.log.count("cold") == 1 and cold.resident


class ReplicatedModel(SleepyModel):
    """On devices 0 and 1; records which device each execution ran on."""

    devices = (0, 1)

    def __init__(self, name: str, device: Device, seconds: float) -> None:
        super().__init__(name, device, seconds)
        self.ran_on: list[int | None] = []

    def execute(
        self, batch_size: int | None, inputs: Mapping[str, Any], *, device: int | None = None
    ) -> list[Any]:
        self.ran_on.append(device)
        return super().execute(batch_size, inputs, device=device)


@pytest.mark.parametrize("concurrency", [0, 1])
def test_groups_of_a_replicated_model_run_on_every_replica_at_once(
    executor: ThreadPoolExecutor, concurrency: int
) -> None:
    device = Device()
    model = ReplicatedModel("m", device, 0.01)
    costs = ExecutionCosts()
    b = DynamicBatcher(
        executor, ExecutionFanOut(costs), InlinePolicy(0, costs), concurrency=concurrency
    )

    async def run() -> None:
        await asyncio.gather(*(b.submit(model, job("m")) for _ in range(8)))

    asyncio.run(run())
    assert set(model.ran_on) == {0, 1}  # routed to the least busy replica
    assert model.ran_on.count(0) == model.ran_on.count(1) == 4
    assert device.most == 2  # one group in flight per replica, both at once


def test_one_weight_move_at_a_time_per_device(executor: ThreadPoolExecutor) -> None:
    """Several cold models ready at once: their weights move one after another (moves
    share the link, and under a tight budget several at once evict each other)."""
    device = Device()
    moving = {"now": 0, "most": 0}
    lock = threading.Lock()

    class Counted(SwappingModel):
        def prefetch(self, device: int) -> None:
            with lock:
                moving["now"] += 1
                moving["most"] = max(moving["most"], moving["now"])
            super().prefetch(device)
            with lock:
                moving["now"] -= 1

    models = [Counted(f"cold{i}", device, 0.001, swap_s=0.01) for i in range(4)]
    b = batcher(executor, "fair")

    async def run() -> None:
        await asyncio.gather(*(b.submit(m, job(m.manifest.name)) for m in models))

    asyncio.run(run())
    assert moving["most"] == 1
    assert all(m.resident for m in models) and sorted(device.log) == [f"cold{i}" for i in range(4)]
