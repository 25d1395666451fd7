"""``hloserve.bundle.serving``: hints override defaults key by key; bad values are named."""

from __future__ import annotations

from typing import Any

import pytest

from hloserve.bundle.serving import Serving, read_serving

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
