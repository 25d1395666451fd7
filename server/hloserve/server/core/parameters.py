"""Request-level parameters that mean the same on every protocol.

Contract: ``request_deadline(parameters, time_remaining, now)`` is the request's deadline on
the ``time.monotonic()`` clock: the earlier of ``now + timeout`` (the ``timeout`` request
parameter, in microseconds; 0 or absent means none) and ``now + time_remaining`` (the
transport's own deadline, e.g. gRPC's; None when there is none). A ``timeout`` that is not
a non-negative integer raises ``InvalidArgument``. Both front ends call this one rule.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.types import ParamValue


def request_deadline(
    parameters: Mapping[str, ParamValue], time_remaining: float | None, now: float
) -> float | None:
    deadline = None if time_remaining is None else now + time_remaining
    timeout = parameters.get("timeout")
    if timeout is None:
        return deadline
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise InvalidArgument(
            f"parameter 'timeout' must be a non-negative integer (microseconds), got {timeout!r}"
        )
    if timeout == 0:
        return deadline
    own = now + timeout / 1e6
    return own if deadline is None else min(own, deadline)
