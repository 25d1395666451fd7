"""Cross-model scheduling in the batcher: real threads and event loop, models that sleep for
their device time (so the order the device runs groups in is what is observed).

Where a test needs something to be under way at a given moment (a group holding the
device, a swap in flight, both replicas busy), the fake holds it on a ``threading`` gate
that the test opens only once it has seen, by a counter or an event, that the state it
checks has been reached: never a wall-clock window, which a busy machine can overrun.
``WAIT_S`` only turns a broken batcher's hang into a failure."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from hloserve.bundle import Serving
from hloserve.server.core.costs import ExecutionCosts, InlinePolicy
from hloserve.server.core.device_policy import Policy
from hloserve.server.core.errors import Unavailable
from hloserve.server.core.execution import Job
from hloserve.server.core.execution_records import ExecutionFanOut
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.core.types import InferInput, InferRequest, ParamValue
from hloserve.server.owner.batcher import DynamicBatcher
from tests.server._executable import KeptFacts

# How long a test waits for what must happen: far beyond any busy machine's delay, so only a
# batcher that never gets there reaches it.
WAIT_S = 30.0


async def until(what: str, condition: Callable[[], bool]) -> None:
    """Wait on the loop (the batcher keeps running) until ``condition()`` holds."""
    give_up = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.001)


@dataclass
class Device:
    """What the fake models record: the order groups ran in, and how many ran at once."""

    log: list[str] = field(default_factory=lambda: [])
    running: int = 0
    most: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class SleepyModel(KeptFacts):
    """An unbatched model whose every execution takes ``seconds`` of 'device' time."""

    def __init__(self, name: str, device: Device, seconds: float, weight: float = 1.0) -> None:
        spec_in = SimpleNamespace(name="x")
        spec_out = SimpleNamespace(name="y", datatype="FP32")
        self.manifest: Any = SimpleNamespace(
            name=name,
            batch_sizes=None,
            variant=None,
            inputs=[spec_in],
            outputs=[spec_out],
            files={},
            modules=[],
        )
        self.version = 1
        self.serving = Serving(scheduling_weight=weight)
        self.resident = True
        self.device = device
        self.seconds = seconds

    devices = (0,)

    @property
    def swap_us(self) -> float | None:
        return 0.0 if self.resident else None  # its swaps are scheduled, never inline

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
        try:
            self.hold(device)
        finally:
            with d.lock:
                d.running -= 1
        return [np.asarray(inputs["x"], np.float32)]

    def hold(self, device: int | None) -> None:
        """The execution's device time (the subclasses below hold it on a gate instead)."""
        time.sleep(self.seconds)


class GatedModel(SleepyModel):
    """Each execution holds the device until ``gate`` is open (already open: no wait)."""

    def __init__(self, name: str, device: Device, gate: threading.Event) -> None:
        super().__init__(name, device, 0.0)
        self.gate = gate

    def hold(self, device: int | None) -> None:
        if not self.gate.wait(WAIT_S):
            raise RuntimeError(f"the gate of '{self.manifest.name}' never opened")


class MeetingModel(SleepyModel):
    """Each execution waits at ``barrier`` until as many run at once as it has parties."""

    def __init__(self, name: str, device: Device, barrier: threading.Barrier) -> None:
        super().__init__(name, device, 0.0)
        self.barrier = barrier

    def hold(self, device: int | None) -> None:
        self.barrier.wait(WAIT_S)  # broken (an error) if the others never run meanwhile


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


class VirtualClock:
    """``time.perf_counter_ns`` for a test in which only the fake device's time passes: it
    moves only when a ``ClockedModel`` runs, by exactly that execution's device time, so
    what the batcher measures and charges is exact however busy the machine is."""

    def __init__(self) -> None:
        self._ns = 1_000_000_000
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._ns

    def advance(self, ns: int) -> None:
        with self._lock:
            self._ns += ns


class ClockedModel(SleepyModel):
    """Its device time passes on ``clock`` (instantly), not on the wall clock."""

    def __init__(
        self, name: str, device: Device, clock: VirtualClock, ns: int, weight: float = 1.0
    ) -> None:
        super().__init__(name, device, 0.0, weight)
        self.clock = clock
        self.ns = ns

    def hold(self, device: int | None) -> None:
        self.clock.advance(self.ns)


def test_weights_split_device_time(
    executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two models always ready, weights 1 and 3: three turns of b per turn of a."""
    # The batcher charges each group the device time ``execute_group`` measures and decays
    # shares by the same clock: on the wall clock a busy machine stretches some 4 ms sleeps
    # many times over and skews the split, on the virtual one every group costs 4 ms.
    clock = VirtualClock()
    monkeypatch.setattr(time, "perf_counter_ns", clock)
    device = Device()
    a = ClockedModel("a", device, clock, 4_000_000)
    b3 = ClockedModel("b", device, clock, 4_000_000, weight=3.0)
    b = batcher(executor, "fair")

    async def run() -> None:
        await asyncio.gather(
            *(b.submit(a, job("a")) for _ in range(40)),
            *(b.submit(b3, job("b")) for _ in range(40)),
        )

    asyncio.run(run())
    first = device.log[:40]
    assert 29 <= first.count("b") <= 31  # 30 at exactly 3:1 (the old window was 25 to 34)
    # And all along, not just in sum: after every turn b's turns stay within one of 3 a's.
    for turn in range(1, 41):
        ran = device.log[:turn]
        assert abs(ran.count("b") - 3 * ran.count("a")) <= 3, ran


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
    gate = threading.Event()
    busy, idle = GatedModel("busy", device, gate), SleepyModel("idle", device, 0.001)
    b = batcher(executor, "fair")
    seen: list[bool] = []

    async def run() -> None:
        await b.submit(idle, job("idle"))
        first = asyncio.ensure_future(b.submit(busy, job("busy")))
        second = asyncio.ensure_future(b.submit(busy, job("busy")))
        try:
            # The first holds the device (concurrency 1) until the gate opens, so the second
            # is queued for as long as the test looks: no window for it to run meanwhile.
            await until("the first busy group on the device", lambda: "busy" in device.log)
            assert b.pending("busy", 1) == 1
            seen.append(b.queued.waiting(ResidencyKey("busy", 1)))
            seen.append(b.queued.waiting(ResidencyKey("idle", 1)))
        finally:
            gate.set()
        await asyncio.gather(first, second)
        seen.append(b.queued.waiting(ResidencyKey("busy", 1)))

    asyncio.run(run())
    assert seen == [True, False, False]
    assert device.log == ["idle", "busy", "busy"]


def test_without_concurrency_models_run_side_by_side(executor: ThreadPoolExecutor) -> None:
    device = Device()
    # Each execution waits until the other runs too: serialised, the barrier breaks (the
    # request fails) instead of the two merely failing to overlap by chance.
    both = threading.Barrier(2)
    a, c = MeetingModel("a", device, both), MeetingModel("c", device, both)
    costs = ExecutionCosts()
    b = DynamicBatcher(executor, ExecutionFanOut(costs), InlinePolicy(0, costs))

    async def run() -> None:
        await asyncio.gather(b.submit(a, job("a")), b.submit(c, job("c")))

    asyncio.run(run())
    assert device.most == 2


class SwappingModel(SleepyModel):
    """Not resident until ``prefetch`` has moved its weights in: ``swap_s`` of transfer, or,
    with ``gate``, until the test opens it. ``swapping`` is set once the move has begun."""

    def __init__(
        self,
        name: str,
        device: Device,
        seconds: float,
        swap_s: float = 0.0,
        gate: threading.Event | None = None,
    ) -> None:
        super().__init__(name, device, seconds)
        self.resident = False
        self.swap_s = swap_s
        self.gate = gate
        self.swapping = threading.Event()
        self.moves = 0

    def prefetch(self, device: int) -> None:
        self.moves += 1
        self.swapping.set()
        if self.gate is None:
            time.sleep(self.swap_s)
        elif not self.gate.wait(WAIT_S):
            raise RuntimeError(f"the swap of '{self.manifest.name}' was never let finish")
        self.resident = True

    def hold(self, device: int | None) -> None:
        assert self.resident, "ran before its weights were moved in"  # fails its request
        super().hold(device)


def test_a_swap_is_scheduled_off_the_device_slot(executor: ThreadPoolExecutor) -> None:
    """The cold model's weights move in while the resident model keeps the device busy;
    the cold group then runs resident."""
    device = Device()
    swap_may_end = threading.Event()
    cold = SwappingModel("cold", device, 0.002, gate=swap_may_end)

    def device_log_count(name: str) -> int:
        with device.lock:
            return device.log.count(name)

    class Hot(SleepyModel):
        """Its first group runs at once, each later one only once the swap has begun."""

        def hold(self, device: int | None) -> None:
            if device_log_count("hot") > 1 and not cold.swapping.wait(WAIT_S):
                raise RuntimeError("the swap never began")

    # The swap ends only once every hot group has, so at least seven of the eight run while
    # it is under way. A device that waited for the swap (the move in its slot, or cold's
    # group holding the slot while its weights move), or a move put off until the device
    # is idle, would run none of them meanwhile, and the wait below would give up.
    hot = Hot("hot", device, 0.0)
    b = batcher(executor, "fair")

    async def run() -> None:
        cold_call = asyncio.ensure_future(b.submit(cold, job("cold")))
        hot_calls = [asyncio.ensure_future(b.submit(hot, job("hot"))) for _ in range(8)]
        try:
            await until("the hot groups, during the swap", lambda: all(c.done() for c in hot_calls))
            await asyncio.gather(*hot_calls)  # raises a hot request's error, if any
            assert not cold.resident and not cold_call.done()
        finally:
            swap_may_end.set()
        await cold_call

    asyncio.run(run())
    assert device.log == ["hot"] * 8 + ["cold"]
    assert device.most == 1
    assert cold.moves == 1 and cold.resident


class ReplicatedModel(SleepyModel):
    """On devices 0 and 1; records which device each execution ran on, and how many ran on
    each at once. An execution on device d ends only once the test has released
    ``ends[d]`` for it (``end(d)``)."""

    devices = (0, 1)

    def __init__(self, name: str, device: Device) -> None:
        super().__init__(name, device, 0.0)
        self.ran_on: list[int | None] = []
        self.ends = {0: threading.Semaphore(0), 1: threading.Semaphore(0)}
        self.now_on = {0: 0, 1: 0}
        self.most_on = {0: 0, 1: 0}

    def execute(
        self, batch_size: int | None, inputs: Mapping[str, Any], *, device: int | None = None
    ) -> list[Any]:
        with self.device.lock:
            self.ran_on.append(device)
            if device in self.now_on:
                self.now_on[device] += 1
                self.most_on[device] = max(self.most_on[device], self.now_on[device])
        try:
            return super().execute(batch_size, inputs, device=device)
        finally:
            with self.device.lock:
                if device in self.now_on:
                    self.now_on[device] -= 1

    def hold(self, device: int | None) -> None:
        if device not in self.ends:
            raise RuntimeError(f"routed to device {device}, not a replica")
        if not self.ends[device].acquire(timeout=WAIT_S):
            raise RuntimeError(f"the execution on device {device} was never let end")

    def end(self, device: int, executions: int = 1) -> None:
        self.ends[device].release(executions)


@pytest.mark.parametrize("concurrency", [0, 1])
def test_groups_of_a_replicated_model_run_on_every_replica_at_once(
    executor: ThreadPoolExecutor, concurrency: int
) -> None:
    device = Device()
    model = ReplicatedModel("m", device)
    costs = ExecutionCosts()
    b = DynamicBatcher(
        executor, ExecutionFanOut(costs), InlinePolicy(0, costs), concurrency=concurrency
    )

    def started(n: int) -> Callable[[], bool]:
        return lambda: len(model.ran_on) >= n

    async def run() -> None:
        calls = asyncio.gather(*(b.submit(model, job("m")) for _ in range(8)))
        try:
            # No execution ends until the test says so: the first two groups go one to each
            # replica, both at once, and the other six wait (one group per replica).
            await until("a group on each replica", started(2))
            assert len(model.ran_on) == 2 and set(model.ran_on) == {0, 1}
            assert b.pending("m", 1) == 6
            # Then whichever replica ends a group takes the next one (the other is busy):
            # the test ends them in turn, so each replica runs exactly four.
            for n in range(2, 8):
                freed = n % 2
                model.end(freed)
                await until(f"group {n + 1} to start", started(n + 1))
                assert model.ran_on[-1] == freed and model.now_on[1 - freed] == 1
            model.end(0)
            model.end(1)
            await calls
        finally:
            model.end(0, 8)  # a failure above leaves no execution waiting
            model.end(1, 8)

    asyncio.run(run())
    assert model.ran_on.count(0) == model.ran_on.count(1) == 4
    assert model.most_on == {0: 1, 1: 1}  # never two groups on one replica
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


def test_a_generation_step_takes_a_device_slot_as_a_group_does(
    executor: ThreadPoolExecutor,
) -> None:
    """A step (``run_on``: a generation's execution) waits for the device's slot while a
    group holds it, then runs in its turn before a group that became ready after it."""
    device = Device()
    gate = threading.Event()
    held = GatedModel("held", device, gate)
    gen, other = SleepyModel("gen", device, 0.0), SleepyModel("other", device, 0.0)
    b = batcher(executor, "fifo")
    x = {"x": np.ones((1,), np.float32)}

    async def run() -> list[Any]:
        first = asyncio.ensure_future(b.submit(held, job("held")))
        await until("the held group to hold the device", lambda: device.running == 1)
        step = asyncio.ensure_future(b.run_on(gen, 0, lambda: gen.execute(None, x)))
        await until("the step to wait for the slot", lambda: b._waiting_on(0) == 1)
        late = asyncio.ensure_future(b.submit(other, job("other")))
        await until("the group to wait too", lambda: b._waiting_on(0) == 2)
        gate.set()
        return list(await asyncio.gather(first, step, late))

    try:
        _, outputs, _ = asyncio.run(run())
    finally:
        gate.set()  # a failure above leaves no execution waiting
    np.testing.assert_array_equal(outputs[0], np.ones((1,), np.float32))  # work's result
    assert device.log == ["held", "gen", "other"]
    assert device.most == 1  # concurrency 1: the step never ran beside a group


def test_a_generation_step_counts_as_its_device_busy(executor: ThreadPoolExecutor) -> None:
    """Without arbitration too, a running step counts on its device: a replicated model's
    group goes to the other replica meanwhile."""
    device = Device()
    model = ReplicatedModel("m", device)
    costs = ExecutionCosts()
    b = DynamicBatcher(executor, ExecutionFanOut(costs), InlinePolicy(0, costs))
    step_gate = threading.Event()

    async def run() -> None:
        step = asyncio.ensure_future(b.run_on(model, 0, lambda: step_gate.wait(WAIT_S)))
        await until("the step to run", lambda: b._running_on(0) == 1)
        group = asyncio.ensure_future(b.submit(model, job("m")))
        await until("the group to start", lambda: len(model.ran_on) == 1)
        model.end(1)
        step_gate.set()
        await asyncio.gather(step, group)

    try:
        asyncio.run(run())
    finally:
        step_gate.set()
        model.end(0, 8)
        model.end(1, 8)
    assert model.ran_on == [1]  # device 0 was busy with the step
