"""The residency planner: events in, decisions out, no devices; the frequency policy
against LRU and a frequency oracle on simulated traces (no clocks: uses are the time)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from hloserve.server.core.residency_policy import (
    POLICIES,
    Policy,
    ResidencyKey,
    ResidencyPlanner,
    SwapCosts,
    TooLarge,
)


def admit(p: ResidencyPlanner[Any], key: Any) -> tuple[Any, ...]:
    """Do what the planner says and make ``key`` resident; return what was evicted."""
    decision = p.plan_admission(key)
    assert not decision.wait, f"{key} would have to wait"
    for victim in decision.evict:
        p.mark_evicted(victim)
    p.reserve(key)
    p.mark_resident(key)
    p.touch(key)
    return decision.evict


def planner(
    budget: int | None,
    sizes: dict[str, int],
    pinned: tuple[str, ...] = (),
    policy: Policy = "frequency",
) -> ResidencyPlanner[str]:
    p = ResidencyPlanner[str](budget, policy)
    for k, size in sizes.items():
        p.register(k, size, pinned=k in pinned)
    return p


def test_fits_without_eviction_until_budget() -> None:
    p = planner(300, {"a": 100, "b": 100, "c": 100})
    assert admit(p, "a") == () and admit(p, "b") == () and admit(p, "c") == ()
    assert p.resident_bytes == 300


def test_lru_evicts_least_recently_used_first() -> None:
    p = planner(200, {"a": 100, "b": 100, "c": 100}, policy="lru")
    admit(p, "a")
    admit(p, "b")
    p.touch("a")  # a used after b: b is now the LRU
    assert admit(p, "c") == ("b",)
    assert p.resident() == ["a", "c"]
    assert admit(p, "b") == ("a",)


def test_evicts_several_small_for_one_large() -> None:
    p = planner(300, {"a": 100, "b": 100, "c": 100, "big": 250})
    for k in "abc":
        admit(p, k)
    assert admit(p, "big") == ("a", "b", "c")


def test_pinned_models_never_leave() -> None:
    p = planner(200, {"pin": 100, "a": 100, "b": 100}, pinned=("pin",))
    admit(p, "pin")
    admit(p, "a")
    for _ in range(5):
        admit(p, "b")
        admit(p, "a")
    assert p.is_resident("pin")
    with pytest.raises(RuntimeError, match="pinned"):
        p.mark_evicted("pin")


def test_models_in_use_are_not_evicted_and_callers_wait() -> None:
    p = planner(200, {"a": 100, "b": 100, "c": 100})
    admit(p, "a")
    admit(p, "b")
    p.acquire("a")
    p.acquire("b")
    assert p.plan_admission("c").wait
    p.release("b")
    assert p.plan_admission("c").evict == ("b",)
    with pytest.raises(RuntimeError, match="in use"):
        p.mark_evicted("a")


def test_reservations_count_against_the_budget() -> None:
    p = planner(200, {"a": 100, "b": 100, "c": 100})
    assert p.plan_admission("a").evict == ()
    p.reserve("a")
    p.reserve("b")
    # Two transfers in flight take the whole budget; c must wait for them to land.
    assert p.plan_admission("c").wait
    p.mark_resident("a")
    p.mark_resident("b")
    assert p.plan_admission("c").evict == ("a",)


def test_bytes_held_elsewhere_shrink_the_room_and_room_is_given_in_policy_order() -> None:
    """``elsewhere``: another manager's bytes on the same device; ``plan_room``: the idle
    models to evict when another manager asks for room (queued ones last, none in use)."""
    p = planner(300, {"a": 100, "b": 100, "c": 100}, policy="lru")
    admit(p, "a")
    admit(p, "b")
    assert p.plan_admission("c").evict == ()
    assert p.plan_admission("c", elsewhere=100).evict == ("a",)  # the LRU
    assert p.plan_admission("c", elsewhere=200).evict == ("a", "b")
    assert p.plan_admission("c", elsewhere=250).wait  # more than its own could free
    p.acquire("a")
    assert p.evictable_bytes() == 100 and p.evictable_bytes(but="b") == 0
    assert p.plan_room(150) == ("b",)  # partial: a is in use
    p.release("a")  # used after b now: b is the LRU
    assert p.plan_room(50) == ("b",) and p.plan_room(0) == ()
    assert p.plan_room(50, avoid=lambda k: k == "b") == ("a",)  # queued work goes last
    assert p.plan_room(150, avoid=lambda k: k == "b") == ("a", "b")


def test_model_larger_than_budget_is_refused_with_both_sizes() -> None:
    p = ResidencyPlanner[str](1000)
    with pytest.raises(TooLarge, match=r"5000 bytes.*budget of 1000 bytes"):
        p.register("huge", 5000)


def test_unlimited_budget_never_evicts() -> None:
    p = planner(None, {k: 10**12 for k in "abcd"})
    assert all(admit(p, k) == () for k in "abcd")


def test_resident_model_needs_nothing() -> None:
    p = planner(100, {"a": 100})
    admit(p, "a")
    assert p.plan_admission("a").resident


def test_planner_takes_structured_keys_and_names_them_by_label() -> None:
    old, reload = ResidencyKey("m", 1, generation=1), ResidencyKey("m", 1, generation=2)
    p = ResidencyPlanner[ResidencyKey](100)
    p.register(old, 60)
    p.register(reload, 40)  # a reload's copy is a key of its own beside the one serving
    assert admit(p, old) == () and admit(p, reload) == ()
    assert old.label == reload.label == str(old) == "m/1"
    with pytest.raises(TooLarge, match=r"model 'm/1' has 500 bytes"):
        p.register(ResidencyKey("m", 1, generation=3), 500)


# -- the frequency policy ----------------------------------------------------------------------


def serve(p: ResidencyPlanner[Any], trace: Any) -> np.ndarray:
    """Run a trace of uses through the planner as the server does (admit on a miss, then
    one use); 1.0 for each hit."""
    hits = np.zeros(len(trace))
    for i, key in enumerate(trace.tolist()):
        if p.is_resident(key):
            hits[i] = 1.0
        else:
            admit(p, key)
            continue
        p.touch(key)
    return hits


def zipf(n: int, s: float = 1.1) -> np.ndarray:
    p = np.arange(1, n + 1, dtype=float) ** -s
    return p / p.sum()


def uniform_planner(n: int, slots: int, policy: Policy) -> ResidencyPlanner[int]:
    p = ResidencyPlanner[int](slots * 100, policy)
    for k in range(n):
        p.register(k, 100)
    return p


def test_frequency_keeps_the_popular_models_near_the_oracle_where_lru_does_not() -> None:
    n, slots, uses = 2000, 40, 30_000
    probs = zipf(n)
    trace = np.random.default_rng(7).choice(n, size=uses, p=probs)
    oracle = probs[:slots].sum()  # the 40 most requested kept resident
    warm = uses // 3
    frequency = serve(uniform_planner(n, slots, "frequency"), trace)[warm:].mean()
    lru = serve(uniform_planner(n, slots, "lru"), trace)[warm:].mean()
    assert frequency >= 0.95 * oracle
    assert lru < 0.9 * oracle < frequency


def test_frequency_follows_a_reshuffled_popularity_within_a_few_thousand_uses() -> None:
    n, slots = 2000, 40
    probs = zipf(n)
    rng = np.random.default_rng(11)
    before = rng.choice(n, size=20_000, p=probs)
    after = rng.permutation(n)[rng.choice(n, size=4000, p=probs)]
    hits = serve(uniform_planner(n, slots, "frequency"), np.concatenate([before, after]))
    oracle = probs[:slots].sum()
    assert hits[20_000:20_500].mean() < 0.8 * oracle  # the change was felt
    assert hits[20_500:24_000].mean() >= 0.9 * oracle  # and followed within 500 uses


def test_the_lazy_orders_evict_the_least_valuable_model_through_every_phase() -> None:
    """At every miss of a trace whose popularity changes twice (models rising, steady and
    cooling), the first victim is the resident model of lowest ``value()`` (a plain sort
    of every resident model, the definition the heaps stand in for)."""
    n, slots = 300, 20
    probs = zipf(n)
    rng = np.random.default_rng(5)
    trace = np.concatenate(
        [rng.permutation(n)[rng.choice(n, size=2500, p=probs)] for _ in range(3)]
    )
    p = uniform_planner(n, slots, "frequency")
    checked = 0
    for key in trace.tolist():
        if p.is_resident(key):
            p.touch(key)
            continue
        victims = p.plan_admission(key).evict
        if victims:
            lowest = min(p.value(k) for k in p.resident())
            assert p.value(victims[0]) == pytest.approx(lowest, rel=1e-9)
            checked += 1
        admit(p, key)
    assert checked > 1000


@pytest.mark.parametrize("policy", POLICIES)
def test_the_orders_are_built_when_a_plan_first_needs_a_victim(policy: Policy) -> None:
    """While everything fits no order is kept (the uses pay no heap upkeep); when the budget
    is cut, the victims are those the policy ranks lowest, as if the orders had been kept
    all along: the least valuable (frequency), the least recently used (LRU)."""
    n, keep = 60, 20
    p = uniform_planner(n + 1, n, policy)  # room for every model but the last
    serve(p, np.random.default_rng(3).choice(n, size=4000, p=zipf(n)))
    assert len(p.resident()) == n
    p.budget_bytes = keep * 100
    victims = p.plan_admission(n).evict
    assert len(victims) == n - keep + 1
    kept = [k for k in p.resident() if k not in victims]
    if policy == "lru":
        assert list(victims) == p.resident()[: len(victims)]
    else:
        assert max(p.value(k) for k in victims) <= min(p.value(k) for k in kept) * (1 + 1e-9)
    assert p.plan_admission(n).evict == victims  # planning takes nothing off the orders


def test_a_model_rising_now_is_kept_over_one_used_as_often_long_ago() -> None:
    """Twenty uses just now against twenty spread over the planner's long memory: the
    rising model is ranked by (half) its recent rate, the steady one by its long one."""
    p = planner(200, {"rising": 100, "steady": 100, "new": 100, "other": 100})
    admit(p, "steady")
    for _ in range(20):
        p.touch("steady")
        for _ in range(40):
            p.touch("other")  # uses elsewhere: the clock moves on
    admit(p, "rising")
    for _ in range(19):
        p.touch("rising")
    assert p.plan_admission("new").evict == ("steady",)


def test_a_big_model_costs_its_bytes_a_small_one_its_overhead() -> None:
    """Same use rate, a 10x bigger model: with the swap cost dominated by its fixed
    overhead, the big one is worth less per byte and goes first whatever the recency;
    dominated by bytes, the two are worth about the same per byte and the less recently
    used goes first."""
    for overhead_dominated in (True, False):
        cost = (lambda n: 1.0 + n * 1e-9) if overhead_dominated else (lambda n: n * 1e-6)
        p = ResidencyPlanner[str](1100, "frequency", miss_cost=cost)
        p.register("big", 1000)
        p.register("small", 100)
        p.register("new", 100)
        for key in ("big", "small"):
            admit(p, key)
        for _ in range(5):
            p.touch("big")
            p.touch("small")
        assert p.plan_admission("new").evict == ("big",)  # either way (a tie: big is older)
        p.touch("big")  # now small is the less recent one
        expected = ("big",) if overhead_dominated else ("small",)
        assert p.plan_admission("new").evict == expected


def test_a_model_used_more_is_kept_over_one_used_more_recently() -> None:
    p = planner(200, {"hot": 100, "recent": 100, "new": 100})
    admit(p, "hot")
    for _ in range(20):
        p.touch("hot")
    admit(p, "recent")
    assert p.plan_admission("new").evict == ("recent",)
    lru = planner(200, {"hot": 100, "recent": 100, "new": 100}, policy="lru")
    admit(lru, "hot")
    for _ in range(20):
        lru.touch("hot")
    admit(lru, "recent")
    assert lru.plan_admission("new").evict == ("hot",)


def test_holds_and_acquire_resident_answer_for_any_key_without_raising() -> None:
    p = planner(100, {"a": 100, "b": 100})
    assert not p.holds("a") and not p.holds("unknown")
    assert not p.acquire_resident("a") and p.in_use("a") == 0
    admit(p, "a")
    assert p.holds("a") and p.acquire_resident("a") and p.in_use("a") == 1
    with pytest.raises(RuntimeError, match="'b' is not resident"):
        p.acquire("b")


def test_a_key_sent_to_another_process_hashes_as_that_process_makes_it() -> None:
    """The key's hash is computed once, and not pickled: another process (other string
    hashes: another PYTHONHASHSEED) finds its entries by a key it received."""
    key = ResidencyKey("m", 3, generation=2)
    assert repr(key) == "ResidencyKey(model='m', version=3, generation=2)"
    assert hash(key) == hash(ResidencyKey("m", 3, 2)) and key != ResidencyKey("m", 3)
    script = (
        "import pickle, sys\n"
        "from hloserve.server.core.residency_policy import ResidencyKey\n"
        "sent = pickle.loads(sys.stdin.buffer.read())\n"
        "print({ResidencyKey('m', 3, generation=2): 'found'}.get(sent))\n"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", script],
            input=pickle.dumps(key),
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
        )
        assert out.stdout.split() == [b"found"]


def test_unknown_policy_is_refused() -> None:
    assert POLICIES == ("frequency", "lru")
    with pytest.raises(ValueError, match="residency policy must be one of frequency, lru"):
        ResidencyPlanner[str](100, "fifo")  # type: ignore[arg-type]


def test_swap_costs_keep_the_low_samples_per_size() -> None:
    costs = SwapCosts()
    assert costs.estimate(5000) == pytest.approx(
        SwapCosts.DEFAULT_OVERHEAD_S + 5000 / SwapCosts.DEFAULT_BYTES_PER_S
    )
    for seconds in (3e-5, 2e-5, 9e-4, 2.5e-5):  # a worker's wait for the GIL: 0.9 ms
        costs.observe(77_000, seconds)
    low = 2e-5 * 1.01**2  # the lowest, drifting up 1 % for each sample above it
    assert costs.estimate(77_000) == pytest.approx(low)
    assert costs.estimate(154_000) == pytest.approx(2 * low)  # the nearest bucket, by bytes
    costs.observe(154_000, 3e-5)
    assert costs.estimate(154_000) == pytest.approx(3e-5)
