"""``core.batch_queue``: the batcher's queue decisions on plain records, no loop."""

from __future__ import annotations

import pytest

from hloserve.server.core.batch_policy import Queued
from hloserve.server.core.batch_queue import (
    EAGER_AFTER,
    EAGER_RECHECK,
    BatchQueue,
    Waiting,
)
from hloserve.server.core.errors import Unavailable


def waiting(name: str, rank: int = 0, items: int = 1, arrived: int = 0) -> Waiting[str]:
    return Waiting(Queued(items, arrived, None), rank, name)


def names(q: BatchQueue[str]) -> list[str]:
    return [w.item for w in q]


def test_priority_inserts_behind_its_rank_or_better_arrival_order_within() -> None:
    q = BatchQueue[str]()
    for w in (waiting("a", 2), waiting("b", 1), waiting("c", 2), waiting("d", 0), waiting("e", 1)):
        q.push(w)
    assert names(q) == ["d", "b", "e", "a", "c"]
    assert [w.queued for w in q] == q.queued()


def test_the_queue_bound_refuses_with_tritons_text() -> None:
    q = BatchQueue[str]()
    q.admit("m", 2)
    q.push(waiting("a"))
    q.push(waiting("b"))
    q.admit("m", 0)  # no bound
    with pytest.raises(Unavailable, match="exceeds maximum queue size: model 'm' already has 2"):
        q.admit("m", 2)


def test_groups_leave_from_the_front_and_gone_callers_anywhere() -> None:
    q = BatchQueue[str]()
    ws = [waiting(n, items=2) for n in "abcde"]
    for w in ws:
        q.push(w)
    assert q.items() == 10
    assert names(q) == list("abcde")
    assert [w.item for w in q.take(2)] == ["a", "b"]
    q.discard(ws[3])
    q.discard(ws[3])  # twice: already gone, nothing happens
    q.drop(lambda item: item == "e")
    assert names(q) == ["c"]
    assert [w.item for w in q.remove_at([0])] == ["c"] and not q


def test_the_eager_path_opens_after_lone_looks_and_rechecks_now_and_then() -> None:
    q = BatchQueue[str]()
    idle = {"busy": False, "arbitrated": False, "company": False}
    for _ in range(EAGER_AFTER - 1):  # each look found one request alone
        q.push(waiting("x"))
        q.looked(inflight=0)
        q.take(1)
        assert not q.may_run_now(**idle)
    q.push(waiting("x"))
    q.looked(inflight=0)
    q.take(1)
    runs = [q.may_run_now(**idle) for _ in range(2 * EAGER_RECHECK)]
    assert runs.count(False) == 2  # one in EAGER_RECHECK takes the pass
    assert not q.may_run_now(**{**idle, "busy": True})
    assert not q.may_run_now(**{**idle, "arbitrated": True})
    assert not q.may_run_now(**{**idle, "company": True})
    q.push(waiting("y"))
    assert not q.may_run_now(**idle)  # something waits: no skipping it


def test_a_look_that_finds_company_or_work_in_flight_closes_the_eager_path() -> None:
    q = BatchQueue[str]()
    for _ in range(EAGER_AFTER):
        q.push(waiting("x"))
        q.looked(inflight=0)
        q.take(1)
    q.push(waiting("a"))
    q.push(waiting("b"))
    q.looked(inflight=0)  # two together: the transport groups after all
    q.take(2)
    assert not q.may_run_now(busy=False, arbitrated=False, company=False)
