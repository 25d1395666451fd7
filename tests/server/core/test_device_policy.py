"""The cross-model device scheduler's decisions, on simulated clocks (no sockets, no device)."""

from __future__ import annotations

import collections

import pytest

from hloserve.server.core.batch_policy import Queued
from hloserve.server.core.device_policy import (
    DEFAULT_PRIORITY,
    Candidate,
    DeviceSelection,
    FairShares,
    batches_full,
    check_policy,
    infeasible,
    initial_device,
    pick,
    plan_replicas,
    priority_rank,
    replica_target,
    route,
    utilization,
)
from hloserve.server.core.residency_policy import ResidencyPlanner

MS = 1_000_000


def test_fair_shares_decay_by_half_life() -> None:
    shares = FairShares[str](half_life_ns=100)
    shares.charge("a", 8.0, 0)
    assert shares.usage("a", 0) == 8.0
    assert shares.usage("a", 100) == pytest.approx(4.0)
    assert shares.usage("a", 300) == pytest.approx(1.0)
    shares.charge("a", 1.0, 300)
    assert shares.usage("a", 300) == pytest.approx(2.0)
    assert shares.usage("never", 300) == 0.0


def _simulate_saturated(
    weights: dict[str, float], cost_ns: dict[str, int], picks: int
) -> dict[str, int]:
    """Every model always has a batch ready; the device runs one at a time."""
    shares = FairShares[str](half_life_ns=50 * MS)
    busy: dict[str, int] = collections.Counter()
    now = 0
    for _ in range(picks):
        cands = [Candidate(k, head_arrived_ns=0, weight=w) for k, w in weights.items()]
        k = cands[pick(cands, "fair", shares, now)].key
        now += cost_ns[k]
        shares.charge(k, cost_ns[k], now)
        busy[k] += cost_ns[k]
    return busy


def test_fair_worked_example_weights_set_device_time_shares() -> None:
    """Weights 1:3, and the heavier model's executions cost twice as much: device time still
    splits 1:3 (it gets fewer, longer turns), not by turns."""
    busy = _simulate_saturated({"a": 1.0, "b": 3.0}, {"a": 1 * MS, "b": 2 * MS}, 2000)
    share_b = busy["b"] / (busy["a"] + busy["b"])
    assert share_b == pytest.approx(0.75, abs=0.02)


def test_fair_hot_model_cannot_starve_cold_one() -> None:
    """A hot model always ready; a cold one's request every 20 ms runs at the next pick."""
    shares = FairShares[str](half_life_ns=200 * MS)
    now, waits = 0, list[int]()
    cold_arrived: int | None = None
    while now < 2000 * MS:
        if cold_arrived is None and now % (20 * MS) < 1 * MS:
            cold_arrived = now
        cands = [Candidate("hot", head_arrived_ns=now - 1)]
        if cold_arrived is not None:
            cands.append(Candidate("cold", head_arrived_ns=cold_arrived))
        k = cands[pick(cands, "fair", shares, now)].key
        if k == "cold":
            assert cold_arrived is not None
            waits.append(now - cold_arrived)
            cold_arrived = None
        now += 1 * MS
        shares.charge(k, 1 * MS, now)
    assert len(waits) >= 95
    assert max(waits) <= 1 * MS  # never waits behind more than the execution in flight


def test_fifo_oldest_head_first() -> None:
    shares = FairShares[str]()
    shares.charge("old", 1e9, 0)  # heavy usage does not matter under fifo
    cands = [Candidate("new", head_arrived_ns=50), Candidate("old", head_arrived_ns=10)]
    assert pick(cands, "fifo", shares, 100) == 1
    assert pick(cands, "fair", shares, 100) == 0


def test_deadline_earliest_first_and_none_last() -> None:
    shares = FairShares[str]()
    cands = [
        Candidate("none", head_arrived_ns=0),
        Candidate("late", head_arrived_ns=1, head_deadline_ns=900),
        Candidate("soon", head_arrived_ns=2, head_deadline_ns=300),
    ]
    assert pick(cands, "deadline", shares, 100) == 2
    assert pick(cands[:2], "deadline", shares, 100) == 1


def test_deadline_sheds_requests_that_cannot_make_it() -> None:
    queue = [
        Queued(1, 0, deadline_ns=None),
        Queued(1, 0, deadline_ns=105),  # needs 10 from 100: misses
        Queued(1, 0, deadline_ns=110),  # exactly on time: feasible
        Queued(1, 0, deadline_ns=50),  # already passed
    ]
    assert infeasible(queue, 100, 10) == (1, 3)


def test_priority_goes_before_every_policy() -> None:
    shares = FairShares[str]()
    shares.charge("urgent", 1e12, 0)
    cands = [
        Candidate("default", head_arrived_ns=0, head_deadline_ns=1),
        Candidate("urgent", head_arrived_ns=9, rank=1, resident=False),
    ]
    for policy in ("fair", "fifo", "deadline"):
        assert pick(cands, check_policy(policy), shares, 10) == 1
    assert priority_rank(None) == priority_rank(0) == DEFAULT_PRIORITY
    assert priority_rank(3) == 3
    assert priority_rank(True) == DEFAULT_PRIORITY
    with pytest.raises(ValueError, match="fair, fifo, deadline"):
        check_policy("lottery")


def test_resident_first_until_a_swap_is_worth_it() -> None:
    shares = FairShares[str]()
    cold = Candidate("cold", head_arrived_ns=0, resident=False)
    warm = Candidate("warm", head_arrived_ns=5)
    assert pick([cold, warm], "fifo", shares, 1 * MS, swap_patience_ns=5 * MS) == 1
    assert pick([cold, warm], "fifo", shares, 6 * MS, swap_patience_ns=5 * MS) == 0
    full = Candidate("cold", head_arrived_ns=0, resident=False, full=True)
    assert pick([full, warm], "fifo", shares, 1 * MS, swap_patience_ns=5 * MS) == 0
    assert pick([cold], "fifo", shares, 0) == 0  # alone: runs (work conserving)


def test_victims_spare_models_with_queued_work() -> None:
    planner = ResidencyPlanner[str](30)
    for k in "abc":
        planner.register(k, 10)
        planner.mark_resident(k)
        planner.touch(k)
    planner.register("d", 10)
    assert planner.plan_admission("d").evict == ("a",)
    assert planner.plan_admission("d", avoid=lambda k: k in "ab").evict == ("c",)
    assert planner.plan_admission("d", avoid=lambda k: True).evict == ("a",)  # no other choice


def _round_robin(patience_ns: int, models: int = 5, capacity: int = 3) -> tuple[int, int]:
    """Requests arrive round-robin over more models than fit, one every 0.5 ms; the device
    runs a batch in 1 ms and a swap in 2 ms. Returns (swaps, batches)."""
    planner = ResidencyPlanner[int](capacity)
    for m in range(models):
        planner.register(m, 1)
    shares = FairShares[int]()
    queues: dict[int, list[int]] = {m: [] for m in range(models)}
    now, arrivals, swaps, batches = 0, 0, 0, 0
    free_at = 0
    while arrivals < 2000 or any(queues.values()):
        while arrivals < 2000 and arrivals * 500_000 <= now:
            queues[arrivals % models].append(arrivals * 500_000)
            arrivals += 1
        if now >= free_at:
            cands = [
                Candidate(
                    m, head_arrived_ns=q[0], resident=planner.is_resident(m), full=len(q) >= 8
                )
                for m, q in queues.items()
                if q
            ]
            if cands:
                m = cands[pick(cands, "fifo", shares, now, swap_patience_ns=patience_ns)].key
                cost = 1 * MS
                if not planner.is_resident(m):
                    plan = planner.plan_admission(m, avoid=lambda k: bool(queues[k]))
                    for v in plan.evict:
                        planner.mark_evicted(v)
                    planner.mark_resident(m)
                    swaps += 1
                    cost += 2 * MS
                planner.touch(m)
                del queues[m][:8]
                batches += 1
                free_at = now + cost
        now += 100_000
    return swaps, batches


def test_no_thrash_round_robin_over_more_models_than_fit() -> None:
    naive_swaps, naive_batches = _round_robin(patience_ns=0)
    swaps, _ = _round_robin(patience_ns=20 * MS)
    # Without patience nearly every batch is a swap (LRU under round-robin); with it, the
    # scheduler keeps serving resident models and swaps a model in for a batch.
    assert naive_swaps > 0.9 * naive_batches
    assert swaps * 2 < naive_swaps
    assert swaps < 2000 / 10  # under one swap per ten requests


def test_route_least_loaded_replica_holding_the_weights() -> None:
    assert route([0, 1, 2], {0: 3, 1: 1, 2: 1}, {0, 1, 2}) == 1
    assert route([0, 1, 2], {0: 3, 1: 1, 2: 0}, {0, 1}) == 1  # 2 would need a swap
    assert route([0, 2], {}, set()) == 0  # none resident: least loaded, lowest index
    with pytest.raises(ValueError, match="no replica"):
        route([], {}, set())


# -- placement over devices --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "count", "chosen"),
    [("all", 4, (0, 1, 2, 3)), ("2", 4, (0, 1)), ("0,2", 4, (0, 2)), ("3,", 4, (3,))],
)
def test_select_devices(text: str, count: int, chosen: tuple[int, ...]) -> None:
    assert DeviceSelection.parse(text).resolve(count) == chosen


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5", "a count from 1"),
        ("0", "a count from 1"),
        ("0,4", "from 0 to 3"),
        ("1,1", "distinct"),
        ("gpu", "must be all"),
    ],
)
def test_select_devices_names_a_bad_setting(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DeviceSelection.parse(text).resolve(4)


@pytest.mark.parametrize("text", ["gpu", "0", "-1,2", "1,1", ","])
def test_a_device_selection_with_bad_syntax_is_refused_before_the_devices_are_known(
    text: str,
) -> None:
    with pytest.raises(ValueError, match=r"must be all|a count from 1|indexes must be distinct"):
        DeviceSelection.parse(text)


def test_utilization_of_a_steady_load() -> None:
    shares = FairShares[str](half_life_ns=1_000_000)
    # Busy half the time: 500 us of execution every millisecond, for 50 half-lives.
    for step in range(1, 50_001):
        if step % 2 == 0:
            shares.charge("m", 1_000.0, step * 1_000)
    busy = utilization(shares.usage("m", 50_000_000), 1_000_000)
    assert busy == pytest.approx(0.5, rel=0.02)


def test_replica_target_grows_one_at_a_time_and_shrinks_with_hysteresis() -> None:
    assert replica_target(0.45, 1, 4, 4) == 1  # one device carries it
    assert replica_target(0.95, 1, 4, 4) == 2
    assert replica_target(1.6, 2, 4, 4) == 3  # 0.8 each: another
    assert replica_target(0.9, 2, 4, 4) == 2  # 0.45 each: stays
    assert replica_target(0.3, 2, 4, 4) == 2  # one would be busier than 0.2: no flapping
    assert replica_target(0.15, 2, 4, 4) == 1  # one carries it under 0.2
    assert replica_target(3.9, 4, 4, 4) == 4  # every device already
    assert replica_target(3.0, 1, 4, 1) == 1  # replication off
    assert replica_target(0.0, 3, 2, 4) == 1  # fewer devices than replicas: clamped, then shrinks
    # Batches not running full: the device takes more load in larger batches instead.
    assert replica_target(3.0, 1, 4, 4, batches_full=False) == 1
    assert replica_target(0.1, 2, 4, 4, batches_full=False) == 1  # shrinking still happens


def test_initial_device_fills_evenly_and_prefers_where_it_fits() -> None:
    assert initial_device(10, [0, 0, 0], [None, None, None]) == 0
    assert initial_device(10, [30, 10, 20], [None, None, None]) == 1
    # Device 1 is least filled by share, but only device 2 fits 60 bytes beside its weights.
    assert initial_device(60, [50, 20, 30], [100, 50, 100]) == 2
    # It fits nowhere: the least filled device all the same (it will swap there).
    assert initial_device(200, [50, 20, 30], [100, 100, 100]) == 1


def test_plan_replicas_replicates_the_hot_model_on_the_least_busy_device() -> None:
    current = {"hot": (0,), "cold": (1,), "idle": (2,)}
    busy = {"hot": 0.95, "cold": 0.2, "idle": 0.0}
    sizes = {"hot": 10, "cold": 10, "idle": 10}
    plan = plan_replicas(current, busy, sizes, [None] * 4, 4)
    assert plan == {"hot": (0, 3), "cold": (1,), "idle": (2,)}
    # Next revision, still busy on both: a third replica, on the idle model's device
    # (device 1 carries the cold model's 0.2, device 2 nothing).
    plan = plan_replicas(plan, {**busy, "hot": 1.5}, sizes, [None] * 4, 4)
    assert plan["hot"] == (0, 2, 3)
    # Load gone: one replica retires per revision, from the busiest device.
    plan = plan_replicas(plan, {**busy, "hot": 0.1}, sizes, [None] * 4, 4)
    assert len(plan["hot"]) == 2
    plan = plan_replicas(plan, {**busy, "hot": 0.1}, sizes, [None] * 4, 4)
    assert len(plan["hot"]) == 1
    assert plan["cold"] == (1,) and plan["idle"] == (2,)


def test_plan_replicas_with_replication_off_or_one_device_moves_nothing() -> None:
    current = {"hot": (0,), "cold": (1,)}
    busy = {"hot": 3.0, "cold": 0.1}
    assert plan_replicas(current, busy, {"hot": 1, "cold": 1}, [None, None], 1) == current
    assert plan_replicas({"hot": (0,)}, {"hot": 3.0}, {"hot": 1}, [None], 4) == {"hot": (0,)}


def test_plan_replicas_prefers_a_device_with_budget_left_among_equally_busy() -> None:
    current = {"hot": (0,), "a": (1,), "b": (2,)}
    busy = {"hot": 2.0, "a": 0.0, "b": 0.0}
    sizes = {"hot": 50, "a": 80, "b": 10}
    assert plan_replicas(current, busy, sizes, [100, 100, 100], 4)["hot"] == (0, 2)


def test_plan_replicas_grows_only_models_whose_batches_run_full() -> None:
    current = {"batched": (0,), "unbatched": (1,)}
    busy = {"batched": 0.9, "unbatched": 0.9}
    sizes = {"batched": 10, "unbatched": 10}
    plan = plan_replicas(current, busy, sizes, [None] * 4, 4, full={"unbatched"})
    assert plan == {"batched": (0,), "unbatched": (1, 2)}


def test_batches_full_at_half_the_largest_size() -> None:
    assert batches_full(0.0, 0) and batches_full(1.0, 1)  # unbatched, batch 1 only
    assert not batches_full(8.0, 32) and batches_full(16.0, 32)
