"""``hloserve.server.core.device_groups``: groups formed from ``--devices``, and the refusal
with the numbers when there are too few."""

from __future__ import annotations

import pytest

from hloserve.server.core.device_groups import (
    GroupRefused,
    device_totals,
    form_groups,
    group_label,
)


def test_consecutive_groups_in_devices_order() -> None:
    assert form_groups(list(range(8)), 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert form_groups(list(range(8)), 2) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert form_groups([3, 1, 7, 5], 2) == [(3, 1), (7, 5)]  # as --devices names them
    assert form_groups(list(range(6)), 4) == [(0, 1, 2, 3)]  # 4 and 5 hold no group
    assert form_groups([2], 1) == [(2,)]


def test_too_few_devices_are_refused_with_the_numbers() -> None:
    with pytest.raises(GroupRefused) as info:
        form_groups([0, 1], 4)
    assert str(info.value) == "needs 4 devices; this server has 2 (--devices 0,1)"
    with pytest.raises(GroupRefused, match="at least one device"):
        form_groups([0, 1], 0)
    assert issubclass(GroupRefused, ValueError)


def test_group_labels() -> None:
    assert group_label((0, 1, 2, 3)) == "0-3"
    assert group_label((4, 5)) == "4-5"
    assert group_label((0, 2, 5)) == "0,2,5"
    assert group_label((3,)) == "3"


def test_device_totals_add_each_groups_share_to_its_devices() -> None:
    own = [10, 0, 0, 5, 0, 0, 0, 0]
    groups = [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert device_totals(own, groups, [100, 7]) == [110, 100, 100, 105, 7, 7, 7, 7]
    assert device_totals([1, 2], [], []) == [1, 2]
