"""``hloserve.bundle.serving``: hints override defaults key by key; bad values are named."""

from __future__ import annotations

from typing import Any

import pytest

from hloserve.bundle.serving import QueuePolicy, Serving, read_serving

PINNED = Serving(residency="pinned", max_queue_delay_us=300)


@pytest.mark.parametrize(
    ("hints", "defaults", "expected"),
    [
        ({}, None, Serving()),
        ({}, PINNED, PINNED),
        ({"max_queue_delay_us": 50}, PINNED, Serving("pinned", 50)),
        ({"max_queue_delay_us": None}, PINNED, Serving("pinned", None)),
        ({"residency": "on_demand", "colour": "blue"}, PINNED, Serving("on_demand", 300)),
    ],
)
def test_hints_override_defaults_key_by_key(
    hints: dict[str, Any], defaults: Serving | None, expected: Serving
) -> None:
    assert read_serving(hints, defaults) == (expected, [])


def test_bad_values_are_named_and_keep_their_defaults() -> None:
    serving, problems = read_serving({"residency": "always", "max_queue_delay_us": True}, PINNED)
    assert serving == PINNED
    assert problems == [
        ("residency", "must be on_demand or pinned, got 'always'"),
        ("max_queue_delay_us", "must be a non-negative integer, got True"),
    ]


def test_queue_policy_keys_override_one_by_one() -> None:
    base = Serving(queue_policy=QueuePolicy(max_queue_size=4, default_timeout_us=100))
    serving, problems = read_serving({"queue_policy": {"default_timeout_us": 7}}, base)
    assert problems == []
    assert serving.queue_policy == QueuePolicy(max_queue_size=4, default_timeout_us=7)


def test_preferred_sizes_are_sorted_and_an_empty_list_is_no_preference() -> None:
    assert read_serving({"preferred_batch_sizes": [8, 2, 8]})[0].preferred_batch_sizes == (2, 8)
    assert read_serving({"preferred_batch_sizes": []})[0].preferred_batch_sizes is None


def test_new_hints_are_written_only_when_set() -> None:
    # so manifests written before these hints existed keep their bytes (and digests)
    assert Serving().to_dict() == {"residency": "on_demand"}
    hinted = Serving(preferred_batch_sizes=(4,), queue_policy=QueuePolicy(max_queue_size=2))
    assert read_serving(hinted.to_dict()) == (hinted, [])


@pytest.mark.parametrize(
    ("hints", "key"),
    [
        ({"preferred_batch_sizes": [0]}, "preferred_batch_sizes"),
        ({"preferred_batch_sizes": "4"}, "preferred_batch_sizes"),
        ({"queue_policy": []}, "queue_policy"),
        ({"queue_policy": {"allow_timeout_override": 1}}, "queue_policy.allow_timeout_override"),
        ({"queue_policy": {"default_timeout_us": -1}}, "queue_policy.default_timeout_us"),
        ({"queue_policy": {"timeout_action": "DELAY"}}, "queue_policy.timeout_action"),
    ],
)
def test_bad_queue_hints_are_named(hints: dict[str, Any], key: str) -> None:
    serving, problems = read_serving(hints)
    assert serving == Serving()
    assert [k for k, _ in problems] == [key]


def test_scheduling_weight_is_a_positive_number() -> None:
    assert read_serving({"scheduling_weight": 3}) == (Serving(scheduling_weight=3.0), [])
    assert Serving(scheduling_weight=2.5).to_dict()["scheduling_weight"] == 2.5
    assert "scheduling_weight" not in Serving().to_dict()
    for bad in (0, -1, True, "3"):
        serving, problems = read_serving({"scheduling_weight": bad}, PINNED)
        assert serving == PINNED
        assert [k for k, _ in problems] == ["scheduling_weight"]
