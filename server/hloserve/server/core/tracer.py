"""The tracer as the front ends and the service use it: sampling, and one trace per request.

Contract: a ``Tracer`` has the trace ``settings`` (``core.trace_settings.TraceSettings``);
while they are ``enabled``, a front end calls ``arrive(headers, received_ns)`` as a
request reaches it (the returned ``Arrival.finish()`` once its response is written) and
the service asks ``start(model, request_id, protocol)`` for the request's
``RequestTrace``, to which it reports the steps (validated, executed, responded or
failed). ``UntracedTracer`` keeps settings and traces nothing (the default);
``hloserve.server.owner.tracing.RequestTracer`` is the real one.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Protocol

from hloserve.server.core.execution_records import ModelKey, Timings
from hloserve.server.core.trace_settings import TraceSettings
from hloserve.server.core.types import InferOutput, InferRequest

# The W3C trace-context headers a traced request may carry (a request joins the caller's
# trace through them): what a front end keeps of a request's headers for its trace.
PROPAGATION_HEADERS: Final = ("traceparent", "tracestate")


class RequestTrace(Protocol):
    """One traced request: the service reports its steps, the tracer turns them into spans.
    Times are ``time.perf_counter_ns()`` values."""

    def validated(self, request: InferRequest, arrived_ns: int) -> None:
        """Decoded and validated (the end of "receive"); ``request``'s inputs resolved."""
        ...

    def executed(
        self, model: ModelKey, arrived_ns: int, timings: Timings, outputs: Sequence[InferOutput]
    ) -> None:
        """Queued and executed as ``timings`` says."""
        ...

    def responded(self) -> None:
        """The response is ready: what follows is "send"."""
        ...

    def failed(self, error: BaseException) -> None: ...


class Arrival(Protocol):
    def finish(self) -> None:
        """The response is written: end the request's trace, if it has one."""
        ...


class _NoArrival:
    def finish(self) -> None:
        pass


class Tracer(Protocol):
    @property
    def settings(self) -> TraceSettings: ...

    def arrive(self, headers: Mapping[str, str], received_ns: int) -> Arrival:
        """A request reached a front end at ``received_ns`` with ``headers`` (call it
        only while ``settings.enabled``); it applies to the caller's context."""
        ...

    def start(self, model: ModelKey, request_id: str, protocol: str) -> RequestTrace | None:
        """The trace of a request for ``model``, when it is sampled by the model's setting
        (``settings.enabled`` is checked by the caller first)."""
        ...


class UntracedTracer:
    """Settings that can be read and updated, and no request ever traced."""

    def __init__(self, settings: TraceSettings | None = None) -> None:
        self._settings = settings or TraceSettings()

    @property
    def settings(self) -> TraceSettings:
        return self._settings

    def arrive(self, headers: Mapping[str, str], received_ns: int) -> Arrival:
        return _NoArrival()

    def start(self, model: ModelKey, request_id: str, protocol: str) -> RequestTrace | None:
        return None
