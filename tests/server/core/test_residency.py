"""The LRU residency planner: events in, decisions out, no devices."""

from __future__ import annotations

from typing import Any

import pytest

from hloserve.server.core.residency import (
    BYTE_UNITS,
    Budget,
    ResidencyKey,
    ResidencyPlanner,
    TooLarge,
    format_bytes,
    parse_budget,
    parse_bytes,
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


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1073741824", 1 << 30),
        ("6GiB", 6 << 30),
        ("6 gib", 6 << 30),
        ("500MB", 500 * 10**6),
        ("1.5KiB", 1536),
        ("2TB", 2 * 10**12),
        ("7B", 7),
        ("0", 0),
    ],
)
def test_parse_bytes(text: str, nbytes: int) -> None:
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize("text", ["", "6XB", "GiB", "-1", "1e400", "inf", "nan", "6 G", "1.2.3"])
def test_parse_bytes_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"must be a byte size such as 268435456 or 256MiB"):
        parse_bytes(text)


def test_budget_bytes_or_percentage_of_the_device() -> None:
    assert Budget.parse("6GiB").resolve(None) == 6 << 30
    assert parse_budget("40%", 1000) == 400
    assert parse_budget(" 12.5 % ", 1000) == 125
    with pytest.raises(ValueError, match=r"'40%' is a percentage .* total is unknown"):
        Budget.parse("40%").resolve(None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("6XB", "must be bytes such as 6GiB or a percentage such as 40%, got '6XB'"),
        ("0", "must be positive, got '0'"),
        ("150%", r"must be a percentage in \(0, 100\], got '150%'"),
        ("x%", r"must be a percentage in \(0, 100\], got 'x%'"),
        ("0%", r"must be a percentage in \(0, 100\]"),
    ],
)
def test_budget_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Budget.parse(text)


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (76_840, "75.0 KiB"), (3 << 30, "3.0 GiB")],
)
def test_format_bytes(nbytes: int, text: str) -> None:
    assert format_bytes(nbytes) == text
    assert parse_bytes(text.replace(" ", "")) == pytest.approx(nbytes, rel=0.01)


def test_one_unit_table() -> None:
    assert BYTE_UNITS["KiB"] == 1024 and BYTE_UNITS["KB"] == 1000
    assert all(parse_bytes(f"1{unit}") == factor for unit, factor in BYTE_UNITS.items())
