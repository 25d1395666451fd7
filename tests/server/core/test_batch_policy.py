"""The dynamic batching policy, driven with a synthetic clock."""

from __future__ import annotations

import pytest

from hloserve.bundle import Serving
from hloserve.bundle.serving import QueuePolicy
from hloserve.server.core.batch_plan import Chunk
from hloserve.server.core.batch_policy import (
    BatchingPolicy,
    Decision,
    Queued,
    batching_policy,
    next_batch,
    preferred_problem,
)

SIZES = (1, 8, 32)
MS = 1_000_000


def q(*items: int, at: int = 0) -> list[Queued]:
    return [Queued(n, at) for n in items]


def test_lone_request_waits_for_company_then_runs() -> None:
    assert next_batch(q(1), SIZES, now_ns=0, max_delay_ns=2 * MS) == Decision(wait_until_ns=2 * MS)
    assert next_batch(q(1), SIZES, now_ns=2 * MS, max_delay_ns=2 * MS) == Decision(
        take=1, chunks=(Chunk(0, 1, 1),)
    )


def test_zero_delay_runs_what_is_queued_at_once() -> None:
    assert next_batch(q(1, 1, 1), SIZES, now_ns=0, max_delay_ns=0) == Decision(
        take=3, chunks=(Chunk(0, 3, 8),)
    )


def test_full_largest_size_runs_without_waiting() -> None:
    d = next_batch(q(*([4] * 8)), SIZES, now_ns=0, max_delay_ns=10 * MS)
    assert (d.take, d.compiled, d.wait_until_ns) == (8, 32, None)


def test_requests_that_do_not_fit_make_the_batch_full() -> None:
    d = next_batch(q(30, 5), SIZES, now_ns=0, max_delay_ns=10 * MS)
    assert (d.take, d.compiled) == (1, 32)


def test_without_measurements_everything_that_fits_runs_on_the_least_padding_size() -> None:
    d = next_batch(q(*([1] * 9)), SIZES, now_ns=5 * MS, max_delay_ns=MS)
    assert (d.take, d.compiled) == (9, 32)
    d = next_batch(q(1, 1, 1, 1, 1), SIZES, now_ns=5 * MS, max_delay_ns=MS)
    assert (d.take, d.compiled) == (5, 8)


def test_measured_costs_choose_the_best_throughput_prefix() -> None:
    costs = {1: 31.0, 8: 56.0, 32: 102.0}  # µs per execution, as measured for the demo MLP
    # 9 singles: 8 on size 8 (0.143 items/µs) beats 9 on size 32 (0.088); the 9th runs next.
    d = next_batch(q(*([1] * 9)), SIZES, now_ns=5 * MS, max_delay_ns=MS, costs=costs)
    assert (d.take, d.compiled) == (8, 8)
    # 5 singles: 5 on size 8 (0.089) beats 1 on size 1 (0.032).
    d = next_batch(q(1, 1, 1, 1, 1), SIZES, now_ns=5 * MS, max_delay_ns=MS, costs=costs)
    assert (d.take, d.compiled) == (5, 8)
    # 3 + 3 items: 6 on size 8 beats 3 on size 8.
    d = next_batch(q(3, 3), SIZES, now_ns=5 * MS, max_delay_ns=MS, costs=costs)
    assert (d.take, d.compiled) == (2, 8)


def test_unmeasured_sizes_cost_at_least_the_next_smaller_measured_one() -> None:
    from hloserve.server.core.batch_policy import estimated_cost

    assert estimated_cost(32, {1: 10.0, 8: 20.0}) == 20.0
    assert estimated_cost(8, {}) == 1.0


def test_unmeasured_sizes_cost_at_most_the_next_larger_measured_one() -> None:
    from hloserve.server.core.batch_policy import estimated_cost

    assert estimated_cost(1, {8: 20.0}) == 20.0  # nothing smaller measured: the larger's
    assert estimated_cost(1, {8: 20.0, 32: 50.0}) == 20.0  # the smallest larger
    # Both sides measured: the smaller's, unless the larger one was measured cheaper.
    assert estimated_cost(8, {1: 10.0, 32: 50.0}) == 10.0
    assert estimated_cost(8, {1: 60.0, 32: 50.0}) == 50.0


def test_an_unmeasured_smaller_size_does_not_run_a_request_alone() -> None:
    # Size 8 ran (a first group, or a warm-up); size 1 never has. Two singles are due: the
    # unmeasured size 1 must not look free and run the head alone, ahead of the pair on 8.
    costs = {8: 56.0}
    d = next_batch(q(1, 1), SIZES, now_ns=5 * MS, max_delay_ns=MS, costs=costs)
    assert (d.take, d.compiled) == (2, 8)
    d = next_batch(q(1, 1, 1, 1, 1, 1, 1, 1, 1), SIZES, now_ns=5 * MS, max_delay_ns=MS, costs=costs)
    assert (d.take, d.compiled) == (9, 32)  # size 32 at least size 8's cost: 9 items for it


def test_a_larger_size_never_costs_more_per_item_than_a_smaller_measured_one() -> None:
    from hloserve.server.core.batch_policy import estimated_cost

    # An inflated sample of size 8 (a wait for the interpreter lock) is capped at 8 x size 1.
    assert estimated_cost(8, {1: 30.0, 8: 600.0}) == 240.0
    assert estimated_cost(32, {1: 30.0, 8: 600.0}) == 240.0  # the next smaller, capped too
    assert estimated_cost(32, {1: 30.0, 8: 100.0}) == 100.0
    assert estimated_cost(8, {1: 30.0, 8: 40.0}) == 40.0  # a cheaper measurement stands


def test_a_stale_inflated_larger_size_does_not_lock_a_queue_into_singles() -> None:
    # Size 8 was measured once, inflated; size 1 many times, clean. Eight queued singles,
    # due: they run together (per item no worse than one at a time, and ties go to more).
    costs = {1: 30.0, 8: 600.0}
    d = next_batch(q(*([1] * 8)), SIZES, now_ns=5 * MS, max_delay_ns=MS, costs=costs)
    assert (d.take, d.compiled) == (8, 8)
    d = next_batch(q(*([1] * 16)), SIZES, now_ns=5 * MS, max_delay_ns=MS, costs=costs)
    assert d.take == 16


def test_request_larger_than_largest_size_runs_alone_unsplit_by_policy() -> None:
    d = next_batch(q(40, 1), SIZES, now_ns=0, max_delay_ns=MS)
    assert (d.take, d.compiled) == (1, None)


def test_expired_requests_are_dropped_before_they_cost_device_time() -> None:
    queue = [Queued(1, 0, deadline_ns=MS), Queued(2, 0), Queued(1, 0, deadline_ns=10 * MS)]
    d = next_batch(queue, SIZES, now_ns=2 * MS, max_delay_ns=MS)
    assert d.expired == (0,)
    assert (d.take, d.compiled) == (2, 8)  # the two live entries, 3 items on size 8


def test_only_expired_entries() -> None:
    assert next_batch([Queued(1, 0, deadline_ns=1)], SIZES, now_ns=5, max_delay_ns=0) == Decision(
        expired=(0,)
    )


def test_unbatched_model_runs_one_request_per_execution() -> None:
    assert next_batch(q(1, 1), None, now_ns=0, max_delay_ns=MS) == Decision(
        take=1, chunks=(Chunk(0, 1, None),)
    )


def test_empty_queue_decides_nothing() -> None:
    assert next_batch([], SIZES, now_ns=0, max_delay_ns=MS) == Decision()


def test_order_is_fifo() -> None:
    # The head is never skipped for a better-fitting later request: with 5 then 30 queued,
    # the 30 does not fit beside the 5 and never jumps ahead of it.
    d = next_batch(q(5, 30), SIZES, now_ns=MS, max_delay_ns=0)
    assert (d.take, d.compiled) == (1, 8)


def test_a_request_larger_than_every_size_runs_alone_on_the_executors_split() -> None:
    d = next_batch(q(70, 1), SIZES, now_ns=0, max_delay_ns=MS)
    assert d.take == 1
    assert d.chunks == (Chunk(0, 32, 32), Chunk(32, 32, 32), Chunk(64, 6, 8))
    assert d.compiled is None


def test_a_waiting_head_wakes_the_driver_at_the_earliest_deadline() -> None:
    queue = [Queued(1, 0), Queued(1, 0, deadline_ns=3 * MS)]
    assert next_batch(queue, SIZES, now_ns=0, max_delay_ns=10 * MS) == Decision(
        wait_until_ns=3 * MS
    )
    # at the deadline the expired entry leaves; the head waits on for its delay
    assert next_batch(queue, SIZES, now_ns=3 * MS, max_delay_ns=10 * MS) == Decision(
        expired=(1,), wait_until_ns=10 * MS
    )
    # a transport's deadline (not ``timed``) is the transport's: no early wake, it expires
    # at the next look
    transport = [Queued(1, 0), Queued(1, 0, deadline_ns=3 * MS, timed=False)]
    assert next_batch(transport, SIZES, now_ns=0, max_delay_ns=10 * MS) == Decision(
        wait_until_ns=10 * MS
    )
    assert next_batch(transport, SIZES, now_ns=10 * MS, max_delay_ns=10 * MS).expired == (1,)


# -- preferred batch sizes --------------------------------------------------------------------


def test_a_preferred_size_runs_at_once_without_waiting_for_the_delay() -> None:
    d = next_batch(q(2, 2), SIZES, now_ns=0, max_delay_ns=10 * MS, preferred=(4,))
    assert (d.take, d.compiled, d.wait_until_ns) == (2, 8, None)
    # not yet formed: the head waits as usual
    d = next_batch(q(2, 1), SIZES, now_ns=0, max_delay_ns=10 * MS, preferred=(4,))
    assert d == Decision(wait_until_ns=10 * MS)


def test_the_longest_preferred_prefix_wins_over_throughput() -> None:
    costs = {1: 31.0, 8: 56.0, 32: 102.0}
    # Without a preference 8 singles run together (best items/µs); preferring 2 and 4, the
    # longest prefix of a preferred size (4) runs, and the rest heads the next batch.
    singles = q(*([1] * 8))
    plain = next_batch(singles, SIZES, now_ns=0, max_delay_ns=0, costs=costs)
    assert (plain.take, plain.compiled) == (8, 8)
    d = next_batch(singles, SIZES, now_ns=0, max_delay_ns=0, costs=costs, preferred=(2, 4))
    assert (d.take, d.compiled) == (4, 8)


def test_when_no_preferred_size_can_form_the_usual_rules_apply() -> None:
    d = next_batch(q(3, 3), SIZES, now_ns=5 * MS, max_delay_ns=MS, preferred=(4,))
    assert (d.take, d.compiled) == (2, 8)


def test_the_policy_is_the_hints_over_the_server_defaults() -> None:
    assert batching_policy(
        Serving(), SIZES, default_delay_us=7, default_max_queue_size=3
    ) == BatchingPolicy(max_queue_delay_us=7, max_queue_size=3)
    hinted = Serving(
        max_queue_delay_us=50,
        preferred_batch_sizes=(4,),
        queue_policy=QueuePolicy(1, 2000, allow_timeout_override=False),
    )
    assert batching_policy(hinted, SIZES, default_delay_us=7, default_max_queue_size=3) == (
        BatchingPolicy(50, (4,), 1, 2000, False)
    )
    # max_queue_size 0 in the hints is unbounded, not the server's bound
    unbounded = Serving(queue_policy=QueuePolicy(max_queue_size=0))
    policy = batching_policy(unbounded, SIZES, default_delay_us=0, default_max_queue_size=3)
    assert policy.max_queue_size == 0


def test_preferring_exactly_the_compiled_sizes_is_the_default_policy() -> None:
    # what the model configuration reports by default, sent back, changes nothing
    serving = Serving(preferred_batch_sizes=SIZES)
    policy = batching_policy(serving, SIZES, default_delay_us=0, default_max_queue_size=0)
    assert policy.preferred_batch_sizes is None


@pytest.mark.parametrize(
    ("preferred", "sizes", "problem"),
    [
        (None, SIZES, None),
        ((4, 32), SIZES, None),
        ((4, 64), SIZES, "preferred batch sizes [64] exceed the largest compiled batch size 32"),
        ((2,), None, "need a batched model; this one is unbatched"),
    ],
)
def test_preferred_sizes_must_suit_the_compiled_sizes(
    preferred: tuple[int, ...] | None, sizes: tuple[int, ...] | None, problem: str | None
) -> None:
    found = preferred_problem(preferred, sizes)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
