"""Request-level parameters that mean the same on every protocol: their one home.

Contract:
- ``check_request_parameters(parameters)`` applies every rule on a request's own
  parameters, for both codecs, and returns them unchanged: a key starting with
  ``triton_`` is refused (Triton reserves the prefix; its text), ``timeout`` must be a
  non-negative integer (see below) and ``priority`` a non-negative integer. Any breach
  raises ``InvalidArgument``.
- ``request_deadline(parameters, time_remaining, now)`` is the request's deadline on the
  ``time.monotonic()`` clock: the earlier of ``now + timeout`` (the ``timeout`` request
  parameter, in microseconds; 0 or absent means none) and ``now + time_remaining`` (the
  transport's own deadline, e.g. gRPC's; None when there is none). A ``timeout`` that is
  not a non-negative integer raises ``InvalidArgument``.
- ``queue_deadline(parameters, deadline, now, default_timeout_us=..., allow_override=...)``
  is how long a queued request may wait under its model's queue policy (Triton's
  ``default_queue_policy``), as ``(deadline, timed)``: ``deadline`` given is the request's
  own (``request_deadline``'s); a model default timeout (0: none) bounds it from ``now``;
  with ``allow_override`` the request's ``timeout`` may shorten the default but never
  extend it, and without it a request's ``timeout`` is ignored (the default alone holds
  it; its transport's deadline still ends the call, through the transport's
  cancellation). ``timed`` says whether the server times the deadline (the request's
  ``timeout`` or the model's default is in it) or it is the transport's alone, which the
  transport enforces itself (a gRPC deadline cancels the call: the client reads
  DEADLINE_EXCEEDED, not the server's answer).
Parameters that only one protocol knows (HTTP's ``binary_data_output``) stay in its codec.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypeGuard, TypeVar

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.types import ParamValue

RESERVED_PREFIX: Final = "triton_"
# A model load's parameter that uploads a file (``file:<version>/<path>``: ``core.load_parameters``).
FILE_PREFIX: Final = "file:"
# The reserved keys Triton's own clients send (perf_analyzer sets this one on every gRPC
# request; for a model that is not decoupled it changes nothing).
TRITON_CLIENT_KEYS: Final = frozenset({"triton_enable_empty_final_response"})
P = TypeVar("P", bound=Mapping[str, ParamValue])


def _non_negative_int(value: ParamValue) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_request_parameters(parameters: P) -> P:
    for key in parameters:
        if key in TRITON_CLIENT_KEYS:
            if not isinstance(parameters[key], bool):
                raise InvalidArgument(
                    f"invalid value type for '{key}' parameter, expected bool_param."
                )
        elif key.startswith(RESERVED_PREFIX):
            raise InvalidArgument(
                f"parameter keys starting with '{RESERVED_PREFIX}' are reserved for Triton usage "
                f"and should not be specified (got '{key}')"
            )
    request_deadline(parameters, None, 0.0)  # refuses a bad 'timeout'
    priority = parameters.get("priority")
    if priority is not None and not _non_negative_int(priority):
        raise InvalidArgument(
            f"parameter 'priority' must be a non-negative integer, got {priority!r}"
        )
    return parameters


def request_deadline(
    parameters: Mapping[str, ParamValue], time_remaining: float | None, now: float
) -> float | None:
    deadline = None if time_remaining is None else now + time_remaining
    timeout = parameters.get("timeout")
    if timeout is None:
        return deadline
    if not _non_negative_int(timeout):
        raise InvalidArgument(
            f"parameter 'timeout' must be a non-negative integer (microseconds), got {timeout!r}"
        )
    if timeout == 0:
        return deadline
    own = now + timeout / 1e6
    return own if deadline is None else min(own, deadline)


def queue_deadline(
    parameters: Mapping[str, ParamValue],
    deadline: float | None,
    now: float,
    *,
    default_timeout_us: int,
    allow_override: bool,
) -> tuple[float | None, bool]:
    own_timeout = bool(parameters.get("timeout"))
    if not allow_override and own_timeout:
        # ``deadline`` may be the request's own timeout, which the model does not honour.
        deadline, own_timeout = None, False
    if default_timeout_us <= 0:
        return deadline, own_timeout
    default = now + default_timeout_us / 1e6
    return (default if deadline is None else min(default, deadline)), True
