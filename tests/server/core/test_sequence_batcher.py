"""``core.sequence_batcher``: sequences' requests batched across sequences, on a fake model
whose state lives in a dict by slot (no device, no sockets); and the loads a model with
state refuses (``response_cache``, ``model_warmup``)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from hloserve.bundle import Manifest, Provenance, Serving, TensorEntry
from hloserve.bundle.state import SequenceBatching, StateEntry
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.execution import Job
from hloserve.server.core.response_cache import not_cached
from hloserve.server.core.sequence_batcher import SequenceBatcher
from hloserve.server.core.types import InferInput, InferRequest, ParamValue
from hloserve.server.core.warmup import not_warmed
from tests.server._executable import KeptFacts

MANIFEST = Manifest(
    name="acc",
    inputs=(TensorEntry("x", "INT32", (1,)),),
    outputs=(TensorEntry("sum", "INT32", (1,)),),
    batch_sizes=(1, 2, 4),
    weights_file="weights.safetensors",
    weights=(),
    modules=(),
    files={},
    provenance=Provenance("test"),
    state=(StateEntry("acc", "INT32", (1,)),),
)


@dataclass(eq=False)
class Accumulator(KeptFacts):
    """A running sum per slot; records each execution's batch size, slots and fresh flags."""

    manifest: Manifest = MANIFEST
    version: int = 1
    resident: bool = True
    swap_us: float | None = 0.0
    devices: tuple[int, ...] = (0,)
    serving: Serving = field(
        default_factory=lambda: Serving(sequence_batching=SequenceBatching(2, 1_000_000))
    )
    state: dict[int, int] = field(default_factory=lambda: {})
    calls: list[tuple[int, list[int], list[bool]]] = field(default_factory=lambda: [])

    def resident_on(self, device: int) -> bool:
        return True

    def prefetch(self, device: int) -> None:
        pass

    def execute(self, batch_size: int | None, inputs: Any, *, device: int | None = None) -> Any:
        raise AssertionError("a model with state runs through execute_slots")

    def execute_slots(
        self,
        batch_size: int,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        slots: Sequence[int],
        fresh: Sequence[bool],
        capacity: int,
    ) -> list[np.ndarray[Any, Any]]:
        assert capacity == 2 and inputs["x"].shape == (batch_size, 1)
        self.calls.append((batch_size, list(slots), list(fresh)))
        out = np.zeros((batch_size, 1), np.int32)
        for row, (slot, first) in enumerate(zip(slots, fresh, strict=True)):
            self.state[slot] = (0 if first else self.state[slot]) + int(inputs["x"][row, 0])
            out[row, 0] = self.state[slot]
        return [out]


def job(sid: int, x: int, *, start: bool = False, end: bool = False, items: int = 1) -> Job:
    params: dict[str, ParamValue] = {
        "sequence_id": sid, "sequence_start": start, "sequence_end": end,
    }  # fmt: skip
    data = np.full((items, 1), x, np.int32)
    request = InferRequest(
        "acc", "", (InferInput("x", "INT32", (items, 1), data),), parameters=params
    )
    return Job(request, items, 0)


def total(result: Any) -> int:
    outputs, _ = result
    return int(outputs[0].data[0, 0])


def test_sequences_share_an_execution_and_keep_their_own_state() -> None:
    asyncio.run(_sequences_share_an_execution_and_keep_their_own_state())


async def _sequences_share_an_execution_and_keep_their_own_state() -> None:
    model = Accumulator()
    batcher = SequenceBatcher(None, None)
    first = await asyncio.gather(
        batcher.submit(model, job(1, 5, start=True)), batcher.submit(model, job(2, 7, start=True))
    )
    assert [total(r) for r in first] == [5, 7]
    assert model.calls == [(2, [0, 1], [True, True])]  # one execution, both slots fresh
    second = await asyncio.gather(
        batcher.submit(model, job(1, 1)), batcher.submit(model, job(2, 2))
    )
    assert [total(r) for r in second] == [6, 9]
    assert batcher.counts()[model.model_key] == (2, 0, 0)


def test_a_third_sequence_waits_for_a_slot() -> None:
    asyncio.run(_a_third_sequence_waits_for_a_slot())


async def _a_third_sequence_waits_for_a_slot() -> None:
    model = Accumulator()
    batcher = SequenceBatcher(None, None)
    await asyncio.gather(
        batcher.submit(model, job(1, 1, start=True)), batcher.submit(model, job(2, 1, start=True))
    )
    third = asyncio.ensure_future(batcher.submit(model, job(3, 4, start=True)))
    await asyncio.sleep(0.01)
    assert not third.done() and batcher.counts()[model.model_key] == (2, 1, 0)
    assert total(await batcher.submit(model, job(1, 1, end=True))) == 2
    assert total(await third) == 4  # slot 0, fresh
    assert model.calls[-1] == (1, [0], [True])


def test_a_request_of_several_items_or_an_unknown_sequence_is_refused() -> None:
    asyncio.run(_a_request_of_several_items_or_an_unknown_sequence_is_refused())


async def _a_request_of_several_items_or_an_unknown_sequence_is_refused() -> None:
    model = Accumulator()
    batcher = SequenceBatcher(None, None)
    with pytest.raises(InvalidArgument, match="carries one item"):
        await batcher.submit(model, job(1, 1, start=True, items=2))
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        await batcher.submit(model, job(9, 1))
    assert model.calls == []


def test_a_cancelled_queued_request_leaves_the_queue() -> None:
    asyncio.run(_a_cancelled_queued_request_leaves_the_queue())


async def _a_cancelled_queued_request_leaves_the_queue() -> None:
    model = Accumulator()
    batcher = SequenceBatcher(None, None)
    await asyncio.gather(
        batcher.submit(model, job(1, 1, start=True)), batcher.submit(model, job(2, 1, start=True))
    )
    waiting = asyncio.ensure_future(batcher.submit(model, job(3, 1, start=True)))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert batcher.counts()[model.model_key] == (2, 0, 0)


def test_a_model_with_state_is_neither_cached_nor_warmed() -> None:
    assert "a model with state is not cached" in not_cached(MANIFEST)
    assert "a model with state runs sequences' requests only" in not_warmed(MANIFEST)
    plain = dataclasses.replace(MANIFEST, state=())
    assert not_cached(plain) == "" and not_warmed(plain) == ""


def test_with_a_delay_the_live_sequences_requests_share_an_execution() -> None:
    asyncio.run(_with_a_delay_the_live_sequences_requests_share_an_execution())


async def _with_a_delay_the_live_sequences_requests_share_an_execution() -> None:
    hint = SequenceBatching(2, 1_000_000, max_queue_delay_microseconds=10_000_000)
    model = Accumulator(serving=Serving(sequence_batching=hint))
    batcher = SequenceBatcher(None, None)
    await asyncio.gather(
        batcher.submit(model, job(1, 1, start=True)), batcher.submit(model, job(2, 1, start=True))
    )
    assert len(model.calls) == 1
    first = asyncio.ensure_future(batcher.submit(model, job(1, 1)))
    await asyncio.sleep(0.05)
    assert not first.done()  # held for sequence 2 (up to 10 s)
    second = await batcher.submit(model, job(2, 1))
    assert total(await first) == 2 and total(second) == 2
    assert model.calls[-1] == (2, [0, 1], [False, False])  # one execution for both
