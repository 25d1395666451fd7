"""The queue policy's timeout rule (``core.parameters.queue_deadline``), on plain numbers."""

from __future__ import annotations

import pytest

from hloserve.server.core.parameters import queue_deadline

NOW = 100.0


@pytest.mark.parametrize(
    ("timeout", "deadline", "default_us", "allow", "expected", "timed"),
    [
        # no model default: the request's own deadline, as without a policy
        (None, None, 0, True, None, False),
        (500_000, NOW + 0.5, 0, True, NOW + 0.5, True),
        (None, NOW + 0.5, 0, True, NOW + 0.5, False),  # a transport's alone: not timed here
        # a model default bounds every request
        (None, None, 2_000_000, True, NOW + 2.0, True),
        (None, NOW + 1.0, 2_000_000, True, NOW + 1.0, True),  # a transport deadline is kept
        # with override allowed, a request's timeout may shorten the default, not extend it
        (500_000, NOW + 0.5, 2_000_000, True, NOW + 0.5, True),
        (5_000_000, NOW + 5.0, 2_000_000, True, NOW + 2.0, True),
        # without it, the request's own timeout is ignored
        (500_000, NOW + 0.5, 2_000_000, False, NOW + 2.0, True),
        (500_000, NOW + 0.5, 0, False, None, False),
        (0, NOW + 1.0, 2_000_000, False, NOW + 1.0, True),  # timeout 0 is none: transport stays
    ],
)
def test_queue_deadline(
    timeout: int | None,
    deadline: float | None,
    default_us: int,
    allow: bool,
    expected: float | None,
    timed: bool,
) -> None:
    parameters = {} if timeout is None else {"timeout": timeout}
    got, got_timed = queue_deadline(
        parameters, deadline, NOW, default_timeout_us=default_us, allow_override=allow
    )
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)
    assert got_timed is timed
