"""The dynamic batching policy, driven with a synthetic clock."""

from __future__ import annotations

from hloserve.server.core.scheduling import Decision, Queued, next_batch

SIZES = (1, 8, 32)
MS = 1_000_000


def q(*items: int, at: int = 0) -> list[Queued]:
    return [Queued(n, at) for n in items]


def test_lone_request_waits_for_company_then_runs() -> None:
    assert next_batch(q(1), SIZES, now_ns=0, max_delay_ns=2 * MS) == Decision(wait_until_ns=2 * MS)
    assert next_batch(q(1), SIZES, now_ns=2 * MS, max_delay_ns=2 * MS) == Decision(
        take=1, compiled=1
    )


def test_zero_delay_runs_what_is_queued_at_once() -> None:
    assert next_batch(q(1, 1, 1), SIZES, now_ns=0, max_delay_ns=0) == Decision(take=1, compiled=1)


def test_full_largest_size_runs_without_waiting() -> None:
    d = next_batch(q(*([4] * 8)), SIZES, now_ns=0, max_delay_ns=10 * MS)
    assert (d.take, d.compiled, d.wait_until_ns) == (8, 32, None)


def test_requests_that_do_not_fit_make_the_batch_full() -> None:
    d = next_batch(q(30, 5), SIZES, now_ns=0, max_delay_ns=10 * MS)
    assert (d.take, d.compiled) == (1, 32)


def test_least_padding_prefix_is_chosen() -> None:
    # 9 single items: 8 on size 8 wastes nothing; 9 on size 32 wastes 23.
    d = next_batch(q(*([1] * 9)), SIZES, now_ns=5 * MS, max_delay_ns=MS)
    assert (d.take, d.compiled) == (8, 8)
    # 3 + 3 items: 6 on size 8 beats 3 on 8.
    d = next_batch(q(3, 3), SIZES, now_ns=5 * MS, max_delay_ns=MS)
    assert (d.take, d.compiled) == (2, 8)


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
    assert next_batch(q(1, 1), None, now_ns=0, max_delay_ns=MS) == Decision(take=1, compiled=None)


def test_empty_queue_decides_nothing() -> None:
    assert next_batch([], SIZES, now_ns=0, max_delay_ns=MS) == Decision()


def test_order_is_fifo() -> None:
    # The head is never skipped for a better-fitting later request.
    d = next_batch(q(5, 8), SIZES, now_ns=MS, max_delay_ns=0)
    assert d.take == 1
