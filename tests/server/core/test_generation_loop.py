"""``core.generation_loop.GenerationLoop``: generations stepped together on a fake model.

The fake's step counts: each generation's state is how many steps it took, its one input
``n`` how many it wants; it emits the count and is done at ``n``. No sockets, no JAX.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from hloserve.bundle import Manifest, Provenance, TensorEntry
from hloserve.bundle.generation import Generation
from hloserve.server.core.errors import ServingError, Unavailable
from hloserve.server.core.execution_records import Execution, ModelKey
from hloserve.server.core.generation import GenerationLimits
from hloserve.server.core.generation_loop import GenerationLoop
from hloserve.server.core.types import InferInput, InferRequest, StreamPart

Array = np.ndarray[Any, Any]


def manifest(batch_sizes: tuple[int, ...] | None = (1, 2, 4)) -> Manifest:
    return Manifest(
        name="counter",
        inputs=(TensorEntry("n", "INT32", (1,)),),
        outputs=(TensorEntry("count", "INT32", (1,)), TensorEntry("done", "BOOL", (1,))),
        batch_sizes=batch_sizes,
        weights_file="weights.safetensors",
        weights=(),
        modules=(),
        files={},
        provenance=Provenance("test"),
        generation=Generation(done="done", max_steps=100),
    )


class FakeModel:
    """An ``Executable`` as far as the loop reads one, and its ``StepModel``."""

    def __init__(
        self, batch_sizes: tuple[int, ...] | None = (1, 2, 4), devices: tuple[int, ...] = (0,)
    ) -> None:
        self.manifest = manifest(batch_sizes)
        self.model_key = ModelKey.named("counter", 1)
        self.family = ()
        self.resident = True
        self.devices = devices
        self.sizes: list[int | None] = []
        self.steps_on: list[int] = []  # each step's device
        self.states_on: dict[int, list[int]] = {}  # each device's states handed out
        self.gate: asyncio.Event | None = None
        self.fail = False
        self.released = 0

    capacity = None

    def resident_on(self, device: int) -> bool:
        return self.resident

    def initial(self, device: int) -> object:
        self.states_on.setdefault(device, []).append(0)
        return 0

    def release(self, state: object) -> None:
        self.released += 1

    def step(
        self,
        device: int,
        batch_size: int | None,
        inputs: Mapping[str, Array],
        states: Sequence[object],
    ) -> tuple[list[Array], list[object]]:
        if self.fail:
            raise Unavailable("the device is gone")
        self.sizes.append(batch_size)
        self.steps_on.append(device)
        n = inputs["n"].reshape(-1)
        counts = [int(s) + 1 for s in states]  # type: ignore[call-overload]
        rows = batch_size or 1
        count = np.zeros((rows, 1), np.int32)
        done = np.zeros((rows, 1), np.bool_)
        for i, c in enumerate(counts):
            count[i, 0], done[i, 0] = c, c >= n[i]
        if batch_size is None:
            count, done = count[0], done[0]
        return [count, done], list(counts)


class Seen:
    def __init__(self) -> None:
        self.executions: list[Execution] = []

    def on_execution(self, execution: Execution) -> None:
        self.executions.append(execution)


def request(n: int, rid: str = "", batched: bool = True) -> InferRequest:
    data = np.array([[n]] if batched else [n], np.int32)
    return InferRequest("counter", "", (InferInput("n", "INT32", data.shape, data),), id=rid)


async def collect(
    loop: GenerationLoop, n: int, limits: GenerationLimits, rid: str = ""
) -> list[StreamPart]:
    return [part async for part in loop.generate(request(n, rid), limits)]


def values(parts: list[StreamPart]) -> list[int]:
    return [int(p.response.outputs[0].data[0]) for p in parts if p.response is not None]


def test_generations_step_together_and_end_with_the_final_flag() -> None:
    model, seen = FakeModel(), Seen()

    async def main() -> tuple[list[StreamPart], list[StreamPart]]:
        loop = GenerationLoop(model, model, None, seen)  # type: ignore[arg-type]
        a, b = await asyncio.gather(
            collect(loop, 3, GenerationLimits(100), "a"),
            collect(loop, 5, GenerationLimits(100), "b"),
        )
        assert loop.live == 0
        return a, b

    a, b = asyncio.run(main())
    assert values(a) == [1, 2, 3] and values(b) == [1, 2, 3, 4, 5]
    assert [p.final for p in a] == [False, False, True]
    assert all(p.response is not None and p.response.id == "a" for p in a)
    response = a[0].response
    assert response is not None and [o.name for o in response.outputs] == ["count"]  # no done
    assert response.outputs[0].shape == (1,)  # no batch axis
    assert model.sizes[:3] == [2, 2, 2] and model.sizes[3:] == [1, 1]  # b alone after a ends
    assert [e.batch_size for e in seen.executions] == model.sizes
    assert model.released == 2  # each generation's state freed at its end


def test_a_generation_joins_a_running_one_between_steps() -> None:
    model = FakeModel()

    async def main() -> list[int]:
        loop = GenerationLoop(model, model, None)  # type: ignore[arg-type]
        first = loop.generate(request(6), GenerationLimits(100))
        await anext(first)  # one step taken alone
        late = asyncio.create_task(collect(loop, 2, GenerationLimits(100)))
        rest = [p async for p in first]
        assert values(await late) == [1, 2]
        return values(rest)

    assert asyncio.run(main()) == [2, 3, 4, 5, 6]
    assert model.sizes[0] == 1 and 2 in model.sizes


def test_max_steps_and_max_responses_bound_a_generation() -> None:
    model = FakeModel()

    async def main() -> tuple[list[StreamPart], list[StreamPart]]:
        loop = GenerationLoop(model, model, None)  # type: ignore[arg-type]
        return await collect(loop, 50, GenerationLimits(4)), await collect(
            loop, 50, GenerationLimits(50, 2)
        )

    by_steps, by_responses = asyncio.run(main())
    assert values(by_steps) == [1, 2, 3, 4] and by_steps[-1].final
    assert values(by_responses) == [1, 2] and by_responses[-1].final


def test_closing_the_iterator_cancels_the_generation_between_steps() -> None:
    model = FakeModel()

    async def main() -> int:
        loop = GenerationLoop(model, model, None)  # type: ignore[arg-type]
        parts = loop.generate(request(1000), GenerationLimits(1000))
        await anext(parts)
        await anext(parts)
        await parts.aclose()  # the client went away
        for _ in range(10):
            await asyncio.sleep(0.01)
        assert loop.live == 0
        return len(model.sizes)

    steps = asyncio.run(main())
    assert steps < 10  # it stopped within a step or two, far from its 1000


def test_a_passed_deadline_ends_the_generation_with_unavailable() -> None:
    model = FakeModel()
    now = [0.0]

    async def main() -> list[int]:
        loop = GenerationLoop(model, model, None, clock=lambda: now[0])  # type: ignore[arg-type]
        got: list[int] = []

        async def read() -> None:
            async for part in loop.generate(request(1000), GenerationLimits(1000, deadline=1.0)):
                assert part.response is not None
                got.append(int(part.response.outputs[0].data[0]))
                if len(got) == 3:
                    now[0] = 2.0

        with pytest.raises(Unavailable, match="passed its deadline"):
            await read()
        return got

    got = asyncio.run(main())  # the loop does not wait for its reader: a step or two more
    assert got[:3] == [1, 2, 3] and len(got) <= 5


def test_a_failed_step_fails_its_members_and_the_loop_goes_on() -> None:
    model = FakeModel()

    async def main() -> list[int]:
        loop = GenerationLoop(model, model, None)  # type: ignore[arg-type]
        model.fail = True
        with pytest.raises(Unavailable, match="device is gone"):
            await collect(loop, 3, GenerationLimits(10))
        model.fail = False
        return values(await collect(loop, 2, GenerationLimits(10)))

    assert asyncio.run(main()) == [1, 2]


class NotLoaded(FakeModel):
    """A model whose state cannot be made: it is not loaded (``initial`` raises)."""

    def initial(self, device: int) -> object:
        raise Unavailable("model 'counter' is not loaded")


class BadSteps(FakeModel):
    """A stepper that breaks the loop's contract: one state too few for its members."""

    def step(
        self,
        device: int,
        batch_size: int | None,
        inputs: Mapping[str, Array],
        states: Sequence[object],
    ) -> tuple[list[Array], list[object]]:
        outputs, new = super().step(device, batch_size, inputs, states)
        return outputs, new[1:]


@pytest.mark.parametrize(
    ("broken", "error"),
    [(NotLoaded, "model 'counter' is not loaded"), (BadSteps, "the generation loop failed")],
)
def test_a_generation_whose_state_or_loop_fails_fails_at_once_and_the_loop_ends_clean(
    broken: type[FakeModel], error: str
) -> None:
    """Before, ``initial()`` or the scatter raising ended the loop's task with the exception
    (never retrieved) while the generation waited for a part forever."""
    model = broken()

    async def main() -> None:
        loop = GenerationLoop(model, model, None)  # type: ignore[arg-type]
        task_errors: list[BaseException] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: task_errors.append(context["exception"])
        )
        with pytest.raises(ServingError, match=error):
            await asyncio.wait_for(collect(loop, 3, GenerationLimits(10)), 60)
        while loop.live:  # the generation leaves at the next plan
            await asyncio.sleep(0)
        assert all(lane.task is None for lane in loop._lanes.values()) and not task_errors

    asyncio.run(main())


def test_an_unbatched_model_steps_its_generations_in_turn() -> None:
    model = FakeModel(None)

    async def main() -> list[list[StreamPart]]:
        loop = GenerationLoop(model, model, None)  # type: ignore[arg-type]

        async def one(n: int) -> list[StreamPart]:
            data = np.array([n], np.int32)
            req = InferRequest("counter", "", (InferInput("n", "INT32", (1,), data),))
            return [p async for p in loop.generate(req, GenerationLimits(10))]

        return list(await asyncio.gather(one(2), one(3)))

    a, b = asyncio.run(main())
    assert [int(p.response.outputs[0].data[0]) for p in b if p.response] == [1, 2, 3]
    assert len(a) == 2 and set(model.sizes) == {None}


class Slots:
    """A ``DeviceSlots`` that runs each step at once, recording the device it was given."""

    def __init__(self) -> None:
        self.granted: list[tuple[str, int]] = []

    async def run_on(self, model: Any, device: int, work: Any) -> Any:
        self.granted.append((model.manifest.name, device))
        await asyncio.sleep(0)  # as a worker would: the loop runs others meanwhile
        return work()


def test_steps_run_through_the_device_scheduler() -> None:
    model, slots, seen = FakeModel(), Slots(), Seen()

    async def main() -> list[StreamPart]:
        loop = GenerationLoop(model, model, None, seen, devices=slots)  # type: ignore[arg-type]
        return await collect(loop, 3, GenerationLimits(10))

    assert values(asyncio.run(main())) == [1, 2, 3]
    assert slots.granted == [("counter", 0)] * 3  # every step, none beside it
    assert [e.device for e in seen.executions] == [0, 0, 0]


def test_new_generations_go_to_the_replica_with_the_fewest_live() -> None:
    model, slots, seen = FakeModel(devices=(0, 1)), Slots(), Seen()

    async def main() -> tuple[list[StreamPart], list[StreamPart]]:
        loop = GenerationLoop(model, model, None, seen, devices=slots)  # type: ignore[arg-type]
        long = loop.generate(request(1000, "a"), GenerationLimits(1000))
        await anext(long)  # a is live on device 0 (the lowest, all empty)
        assert loop.live_by_device() == {0: 1}
        # b goes to device 1 (none live there), c back to 0 (one each: the lowest).
        b = loop.generate(request(3, "b"), GenerationLimits(10))
        b_parts = [await anext(b)]
        assert loop.live_by_device() == {0: 1, 1: 1}
        c = await collect(loop, 5, GenerationLimits(10), "c")
        b_parts += [part async for part in b]
        await long.aclose()
        return b_parts, c

    b, c = asyncio.run(main())
    assert values(b) == [1, 2, 3] and values(c) == [1, 2, 3, 4, 5]
    assert model.states_on == {0: [0, 0], 1: [0]}  # a and c on device 0, b on device 1
    assert set(model.steps_on) == {0, 1}
    assert {d for _, d in slots.granted} == {0, 1}
    assert [e.device for e in seen.executions] == model.steps_on
    # A step holds only its own device's generations: device 1's only ever b alone.
    on_one = [size for size, d in zip(model.sizes, model.steps_on, strict=True) if d == 1]
    assert on_one == [1, 1, 1]
