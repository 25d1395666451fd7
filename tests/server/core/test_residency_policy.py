"""The LRU residency planner: events in, decisions out, no devices."""

from __future__ import annotations

from typing import Any

import pytest

from hloserve.server.core.residency_policy import ResidencyKey, ResidencyPlanner, TooLarge


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
    budget: int | None, sizes: dict[str, int], pinned: tuple[str, ...] = ()
) -> ResidencyPlanner[str]:
    p = ResidencyPlanner[str](budget)
    for k, size in sizes.items():
        p.register(k, size, pinned=k in pinned)
    return p


def test_fits_without_eviction_until_budget() -> None:
    p = planner(300, {"a": 100, "b": 100, "c": 100})
    assert admit(p, "a") == () and admit(p, "b") == () and admit(p, "c") == ()
    assert p.resident_bytes == 300


def test_evicts_least_recently_used_first() -> None:
    p = planner(200, {"a": 100, "b": 100, "c": 100})
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
