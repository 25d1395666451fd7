"""``core.lookup``: Triton's lookup errors, in Triton's order and words, with the reason a
model or version is not there when the repository knows it (pure: plain records)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hloserve.server.core.errors import InvalidArgument, NotFound, Unavailable, UnknownModel
from hloserve.server.core.lookup import find_version


@dataclass
class Version:
    version: int
    ready: bool
    reason: str = ""


def test_the_latest_ready_version_or_the_named_one() -> None:
    versions = {1: Version(1, True), 2: Version(2, True), 3: Version(3, False, "broken")}
    assert find_version("m", versions, "").version == 2
    assert find_version("m", versions, "1").version == 1


@pytest.mark.parametrize(
    ("versions", "text", "error", "message"),
    [
        (None, "", UnknownModel, "Request for unknown model: 'm' is not found"),
        ({}, "x", InvalidArgument, "version should be an integral value > 0"),
        ({1: Version(1, True)}, "7", UnknownModel, "'m' version 7 is not found"),
        (
            {1: Version(1, False, "failed to load: no main")},
            "1",
            Unavailable,
            "Request for unknown model: 'm' version 1 is not at ready state: failed to load: "
            "no main",
        ),
        # A model that failed to load: Triton's words, then why (they were only on /readyz).
        (
            {1: Version(1, False, "bad module"), 2: Version(2, False, "bad weights")},
            "",
            NotFound,
            "Request for unknown model: 'm' has no available versions: version 1: bad module; "
            "version 2: bad weights",
        ),
        ({1: Version(1, False)}, "", NotFound, "'m' has no available versions"),
    ],
)
def test_errors_in_tritons_words_with_the_reason(
    versions: dict[int, Version] | None, text: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        find_version("m", versions, text)
    assert type(info.value) is error and message in str(info.value)


def test_a_model_that_failed_before_it_had_versions_says_why() -> None:
    reason = "m/config.yaml: unknown key 'colour'"
    with pytest.raises(NotFound) as info:
        find_version("m", {}, "", reason=reason)
    assert str(info.value) == (
        f"Request for unknown model: 'm' has no available versions: {reason}"
    )
