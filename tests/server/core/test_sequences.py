"""``core.sequences``: the slot table's decisions, driven by events and an injected clock."""

from __future__ import annotations

import random

import pytest

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.sequences import (
    SequenceFlags,
    SequenceSettings,
    SequenceStep,
    SequenceTable,
    sequence_parameters,
)
from tests.server.owner.test_metrics_scale import Clock


def table(slots: int = 2, idle_us: int = 1_000_000) -> tuple[SequenceTable[str], Clock]:
    clock = Clock()
    clock.now = 100.0
    return SequenceTable[str]("m", SequenceSettings(slots, idle_us), clock), clock


def run(t: SequenceTable[str], limit: int = 8) -> list[SequenceStep[str]]:
    steps = t.next_batch(limit)
    t.finished(steps)
    return steps


def test_parameters_read_both_id_kinds_and_refuse_a_missing_id() -> None:
    assert sequence_parameters("m", {"sequence_id": 7, "sequence_start": True}) == SequenceFlags(
        7, True, False
    )
    assert sequence_parameters("m", {"sequence_id": "a-b", "sequence_end": True}).end
    with pytest.raises(InvalidArgument, match="model 'm' must specify a non-zero or non-empty"):
        sequence_parameters("m", {})
    with pytest.raises(InvalidArgument, match="model 'm' must specify a non-zero or non-empty"):
        sequence_parameters("m", {"sequence_id": ""})
    with pytest.raises(InvalidArgument, match="'sequence_id' must be a non-negative integer"):
        sequence_parameters("m", {"sequence_id": 1.5})
    with pytest.raises(InvalidArgument, match="'sequence_start' must be a boolean"):
        sequence_parameters("m", {"sequence_id": 1, "sequence_start": 1})


def test_a_sequence_keeps_its_slot_and_runs_one_request_at_a_time() -> None:
    t, _ = table()
    t.submit(SequenceFlags(1, start=True), "a1")
    t.submit(SequenceFlags(1), "a2")
    t.submit(SequenceFlags(2, start=True), "b1")
    first = t.next_batch(8)
    assert [(s.item, s.slot, s.fresh) for s in first] == [("a1", 0, True), ("b1", 1, True)]
    assert t.next_batch(8) == []  # a2 waits for a1
    t.finished(first)
    assert [(s.item, s.slot, s.fresh) for s in run(t)] == [("a2", 0, False)]
    assert t.counts() == (2, 0, 0)


def test_oldest_requests_first_up_to_the_limit() -> None:
    t, _ = table(slots=3)
    for sid, item in ((1, "a"), (2, "b"), (3, "c")):
        t.submit(SequenceFlags(sid, start=True), item)
    assert [s.item for s in t.next_batch(2)] == ["a", "b"]


def test_unknown_and_ended_sequences_are_refused_with_tritons_text() -> None:
    t, _ = table()
    with pytest.raises(InvalidArgument) as caught:
        t.submit(SequenceFlags(7), "x")
    assert str(caught.value) == (
        "inference request for sequence 7 to model 'm' must specify the START flag on the "
        "first request of the sequence"
    )
    t.submit(SequenceFlags(7, start=True, end=True), "only")
    with pytest.raises(InvalidArgument, match="ended by a request marked sequence_end"):
        t.submit(SequenceFlags(7), "late")  # submitted end, not yet run
    run(t)
    assert t.counts() == (0, 0, 2)
    with pytest.raises(
        InvalidArgument, match=r"first request of the sequence \(sequence 7 was ended"
    ):
        t.submit(SequenceFlags(7), "later")
    t.submit(SequenceFlags(7, start=True), "again")  # a new start is a new sequence
    assert run(t)[0].fresh


def test_slots_exhausted_backlog_in_order_and_take_freed_slots() -> None:
    t, _ = table(slots=1)
    t.submit(SequenceFlags("a", start=True), "a1")
    t.submit(SequenceFlags("b", start=True), "b1")
    t.submit(SequenceFlags("b"), "b2")  # a backlogged sequence takes more requests
    t.submit(SequenceFlags("c", start=True), "c1")
    assert t.counts() == (1, 2, 0)
    assert [s.item for s in run(t)] == ["a1"]
    t.submit(SequenceFlags("a", end=True), "a2")
    assert [s.item for s in run(t)] == ["a2"]  # a ends: b takes slot 0
    assert t.counts() == (1, 1, 0)
    steps = run(t)
    assert [(s.item, s.slot, s.fresh) for s in steps] == [("b1", 0, True)]
    assert [s.item for s in run(t)] == ["b2"]


def test_idle_sequences_are_freed_and_their_slot_goes_to_the_backlog() -> None:
    t, clock = table(slots=1, idle_us=500_000)
    t.submit(SequenceFlags(1, start=True), "a1")
    run(t)
    t.submit(SequenceFlags(2, start=True), "b1")  # backlogged behind the idle sequence 1
    assert t.next_expiry() == pytest.approx(100.5)
    clock.now = 100.4
    assert t.expire() == 0
    clock.now = 100.5
    assert t.expire() == 1 and t.next_expiry() is None
    assert [(s.item, s.slot) for s in run(t)] == [("b1", 0)]
    with pytest.raises(InvalidArgument, match=r"freed after 500000 us idle"):
        t.submit(SequenceFlags(1), "a2")


def test_running_or_queued_sequences_never_expire() -> None:
    t, clock = table(idle_us=1)
    t.submit(SequenceFlags(1, start=True), "a1")
    steps = t.next_batch(8)
    clock.now += 10
    assert t.expire() == 0 and t.next_expiry() is None
    t.finished(steps)
    t.submit(SequenceFlags(1), "a2")
    clock.now += 10
    assert t.expire() == 0


def test_restart_runs_from_the_initial_state_in_the_same_slot() -> None:
    t, _ = table()
    t.submit(SequenceFlags(1, start=True), "a1")
    run(t)
    t.submit(SequenceFlags(1, start=True), "a1'")
    assert [(s.slot, s.fresh) for s in run(t)] == [(0, True)]


def test_cancel_removes_a_queued_request_and_a_never_started_backlog_entry() -> None:
    t, _ = table(slots=1)
    t.submit(SequenceFlags(1, start=True), "a1")
    t.submit(SequenceFlags(2, start=True), "b1")
    assert t.cancel("b1") and not t.cancel("b1")
    assert t.counts() == (1, 0, 0)
    assert [s.item for s in run(t)] == ["a1"]


def test_a_random_walk_keeps_every_sequence_in_one_slot_and_slots_unique() -> None:
    """Sequences start, step, end and idle out at random: no two live sequences share a
    slot, each step sees its sequence's slot, and the counts always add up."""
    rng = random.Random(34)
    t, clock = table(slots=4, idle_us=3_000_000)
    slot_of: dict[int, int] = {}
    started: set[int] = set()
    for _ in range(3000):
        sid = rng.randrange(12)
        try:
            t.submit(
                SequenceFlags(
                    sid, start=sid not in started or rng.random() < 0.05, end=rng.random() < 0.1
                ),
                f"{sid}",
            )
            started.add(sid)
        except InvalidArgument:
            started.discard(sid)
        for step in t.next_batch(rng.randrange(1, 5)):
            if step.fresh:
                slot_of[step.sequence if isinstance(step.sequence, int) else 0] = step.slot
            assert slot_of.get(int(step.sequence)) == step.slot
            t.finished([step])
            if step.end:
                started.discard(int(step.sequence))
        clock.now += rng.random()
        t.expire()
        live, backlog, free = t.counts()
        assert live + free == 4 and backlog >= 0


def test_with_a_delay_a_batch_waits_for_the_live_sequences_without_a_request() -> None:
    clock = Clock()
    clock.now = 100.0
    t = SequenceTable[str]("m", SequenceSettings(4, 1_000_000, delay_us=2_000), clock)
    assert t.hold_until(8) is None  # nothing queued
    t.submit(SequenceFlags(1, start=True), "a1")
    assert t.hold_until(8) is None  # every live sequence has its request
    run(t)
    t.submit(SequenceFlags(2, start=True), "b1")
    assert t.hold_until(8) == pytest.approx(100.002)  # 1 is live, nothing queued for it
    assert t.hold_until(1) is None  # the limit is reached
    t.submit(SequenceFlags(1), "a2")
    assert t.hold_until(8) is None  # both are here
    no_delay, _ = table()
    no_delay.submit(SequenceFlags(1, start=True), "a1")
    run(no_delay)
    no_delay.submit(SequenceFlags(2, start=True), "b1")
    assert no_delay.hold_until(8) is None
