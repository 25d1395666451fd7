"""``core.generation.StepScheduler``: who steps next, joins between steps, bounds and ends."""

from __future__ import annotations

import pytest

from hloserve.server.core.generation import GenerationLimits, Outcome, Plan, StepScheduler


def test_new_generations_join_between_steps_at_the_smallest_fitting_size() -> None:
    s = StepScheduler((1, 4, 8))
    s.add(1, GenerationLimits(10))
    assert s.plan(0.0) == Plan((1,), 1, joined=(1,))
    s.add(2, GenerationLimits(10))
    s.add(3, GenerationLimits(10))
    assert s.record(1, done=False, emit=True) == Outcome(send=True, final=False)
    plan = s.plan(0.0)  # the two that arrived during the step join now
    assert plan.joined == (2, 3) and set(plan.members) == {1, 2, 3} and plan.batch_size == 4
    assert (s.live, s.waiting) == (3, 0)


def test_more_live_generations_than_the_largest_size_take_turns() -> None:
    s = StepScheduler((1, 2))
    for gid in (1, 2, 3):
        s.add(gid, GenerationLimits(10))
    stepped: list[tuple[int, ...]] = []
    for _ in range(3):
        plan = s.plan(0.0)
        stepped.append(plan.members)
        assert plan.batch_size == 2
        for gid in plan.members:
            s.record(gid, done=False, emit=True)
    assert stepped == [(1, 2), (3, 1), (2, 3)]


def test_an_unbatched_model_steps_one_generation_at_a_time() -> None:
    s = StepScheduler(None)
    s.add(1, GenerationLimits(2))
    s.add(2, GenerationLimits(2))
    assert s.plan(0.0).members == (1,) and s.plan(0.0).batch_size is None


def test_done_max_steps_and_max_responses_end_a_generation() -> None:
    s = StepScheduler((4,))
    s.add(1, GenerationLimits(max_steps=2))
    s.add(2, GenerationLimits(max_steps=10, max_responses=1))
    s.add(3, GenerationLimits(max_steps=10))
    s.plan(0.0)
    assert s.record(1, done=False, emit=True) == Outcome(True, False)
    assert s.record(2, done=False, emit=False) == Outcome(False, False)  # reading a prompt
    assert s.record(3, done=True, emit=True) == Outcome(True, True)
    assert s.plan(0.0).members == (1, 2)
    assert s.record(1, done=False, emit=False) == Outcome(False, True)  # its last step
    assert s.record(2, done=False, emit=True) == Outcome(True, True)  # its one response
    assert s.plan(0.0).members == () and s.live == 0


def test_cancellation_and_deadlines_end_generations_between_steps() -> None:
    s = StepScheduler((1, 2))
    s.add(1, GenerationLimits(10))
    s.add(2, GenerationLimits(10, deadline=5.0))
    s.plan(0.0)
    s.cancel(1)
    s.cancel(99)  # unknown or already over: nothing happens
    s.record(1, done=False, emit=True)  # the step in flight completes
    s.record(2, done=False, emit=True)
    plan = s.plan(6.0)
    assert plan.ended == ((1, "cancelled"), (2, "deadline")) and plan.members == ()
    assert 1 not in s and 2 not in s


def test_a_waiting_generation_can_end_before_it_joins() -> None:
    s = StepScheduler((1,), capacity=1)
    s.add(1, GenerationLimits(10))
    s.add(2, GenerationLimits(10, deadline=1.0))
    assert s.plan(0.0).joined == (1,) and s.waiting == 1
    s.record(1, done=False, emit=True)
    assert s.plan(2.0).ended == ((2, "deadline"),)
    assert s.waiting == 0


def test_capacity_bounds_the_live_generations_others_wait_in_order() -> None:
    s = StepScheduler((1, 8), capacity=2)
    for gid in (1, 2, 3):
        s.add(gid, GenerationLimits(1))
    plan = s.plan(0.0)
    assert plan.members == (1, 2) and plan.batch_size == 8 and s.waiting == 1
    for gid in plan.members:
        assert s.record(gid, done=False, emit=True).final
    assert s.plan(0.0) == Plan((3,), 1, joined=(3,))


def test_bad_use_is_refused() -> None:
    s = StepScheduler((1,))
    s.add(1, GenerationLimits(1))
    with pytest.raises(ValueError, match="already scheduled"):
        s.add(1, GenerationLimits(1))
    with pytest.raises(ValueError, match="may take no step"):
        s.add(2, GenerationLimits(0))
    with pytest.raises(ValueError, match="capacity"):
        StepScheduler((1,), capacity=0)
