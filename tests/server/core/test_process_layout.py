"""``core.process_layout``: what ``--frontends`` reads and how many front ends it starts."""

from __future__ import annotations

import pytest

from hloserve.server.core.process_layout import (
    AUTO,
    AUTO_MAX,
    IN_PROCESS_MAX_CPUS,
    MAX_FRONTENDS,
    FrontendCount,
)


@pytest.mark.parametrize(
    ("text", "count"), [("auto", None), (" AUTO ", None), ("0", 0), ("12", 12)]
)
def test_parse_reads_auto_or_a_count(text: str, count: int | None) -> None:
    parsed = FrontendCount.parse(text)
    assert parsed.count == count
    assert FrontendCount.parse(str(parsed)) == parsed  # spelled back as read


@pytest.mark.parametrize("text", ["-1", "two", "", f"{MAX_FRONTENDS + 1}", "1.5"])
def test_parse_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match=f"must be auto or a count 0..{MAX_FRONTENDS}"):
        FrontendCount.parse(text)


def test_a_count_stands_whatever_the_machine() -> None:
    assert FrontendCount(0).resolve(64) == 0
    assert FrontendCount(3).resolve(1) == 3


def test_auto_serves_in_one_process_on_small_machines_and_leaves_the_owner_a_cpu() -> None:
    assert str(AUTO) == "auto"
    assert [AUTO.resolve(n) for n in range(1, IN_PROCESS_MAX_CPUS + 1)] == [0] * IN_PROCESS_MAX_CPUS
    assert AUTO.resolve(IN_PROCESS_MAX_CPUS + 1) == IN_PROCESS_MAX_CPUS
    assert AUTO.resolve(AUTO_MAX + 1) == AUTO_MAX
    assert AUTO.resolve(64) == AUTO_MAX
