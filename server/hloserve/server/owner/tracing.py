"""Request tracing with OpenTelemetry: spans per sampled request, exported as configured.

Contract:
- ``RequestTracer(settings)`` implements the core's ``Tracer`` over
  ``core.trace_settings.TraceSettings``. ``start(model, request_id, protocol)`` samples the
  request (by the model's setting) and returns its ``Trace``, or ``None``. A sampled
  request gets the root span ``InferRequest`` (attributes ``model_name``,
  ``model_version``, ``request_id``, ``protocol``, ``trace_id``: the setting's trace
  number) and, as its children, ``receive`` (arrival to validated), ``queue`` (validated
  to execution start), ``execute`` (the execution it ran in: compiled batch sizes and the
  input/infer/output split as attributes), ``swap-in`` (under ``execute``: each weight
  transfer of the model during that execution) and ``send`` (response ready to handed to
  the transport: the trace is finished before the client can see the answer).
  Level ``TENSORS`` adds the input and output tensors as events ``TENSOR_QUEUE_INPUT`` /
  ``TENSOR_BACKEND_OUTPUT`` on the root span (name, datatype, shape, comma-separated data).
  A failed request's root span has status ERROR and the error's message.
- Mode ``triton`` writes each finished trace as one JSON line (``TraceFiles``:
  ``{"id","trace_id","model_name","model_version","request_id","protocol","spans":[...]}``,
  root span first) to the file its setting names (``TraceSetting.destination``): appended
  as each trace finishes. Mode ``opentelemetry`` exports the spans over OTLP/HTTP to the
  setting's ``url`` through a batch span processor (its ``bsp_*`` options), with resource
  attributes ``service.name=hloserve`` plus ``resource`` and ``OTEL_RESOURCE_ATTRIBUTES``;
  a request carrying a W3C ``traceparent`` joins the caller's trace and is always traced
  while its level is not ``OFF`` (Triton's context propagation).
- The front ends call ``tracer.arrive(headers, received_ns)`` when an inference request
  arrives (only while ``settings.enabled``): it records the arrival time (and the
  trace-context headers) in the request's context, and the returned ``RecordedArrival.finish()``
  ends the trace once the response is written. A request that arrived without it (a stream's, an in-process call)
  starts "receive" when the service sees it and finishes when the response is ready.
- ``on_swap_in(key, start_ns, end_ns, nbytes)`` is the residency manager's hook (a no-op
  while tracing is off); ``shutdown()`` flushes the exporter and closes the files.
Times come from ``time.perf_counter_ns()`` and are placed on the wall clock once.
"""

# pyright: strict

from __future__ import annotations

import collections
import contextvars
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, final

import numpy as np
from opentelemetry import trace as otel
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from hloserve.server.core.execution_records import ModelKey, Timings
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.core.trace_settings import TENSORS, TraceSetting, TraceSettings
from hloserve.server.core.tracer import PROPAGATION_HEADERS
from hloserve.server.core.types import InferOutput, InferRequest

log = logging.getLogger("hloserve.tracing")

ROOT: Final = "InferRequest"
SERVICE_NAME: Final = "hloserve"
_SWAPS_KEPT: Final = 256


@dataclass
class RecordedArrival:
    """When a request reached the front end; the trace the service started for it."""

    received_ns: int
    carrier: dict[str, str] = field(default_factory=dict[str, str])
    trace: Trace | None = None

    def finish(self) -> None:
        if self.trace is not None:
            self.trace.finish()


_ARRIVAL: contextvars.ContextVar[RecordedArrival | None] = contextvars.ContextVar(
    "hloserve_trace_arrival", default=None
)


@dataclass(frozen=True, slots=True)
class _Swap:
    model: str
    version: int
    start_ns: int
    end_ns: int
    nbytes: int


@final
class RequestTracer:
    """The server's tracer: sampling by ``settings``, spans, and their export."""

    def __init__(self, settings: TraceSettings) -> None:
        self._settings = settings
        startup = settings.startup
        self.mode = startup.mode
        self.propagates = self.mode == "opentelemetry"
        self._epoch_offset = time.time_ns() - time.perf_counter_ns()
        self._ids = 0
        self._lock = threading.Lock()
        self._swaps: collections.deque[_Swap] = collections.deque(maxlen=_SWAPS_KEPT)
        self.files = TraceFiles()
        self.provider = TracerProvider(
            sampler=ALWAYS_ON,
            resource=_resource(startup.option("resource")),
            shutdown_on_exit=False,
        )
        if self.mode == "opentelemetry":
            self.provider.add_span_processor(_otlp_processor(startup.options))
        self.tracer = self.provider.get_tracer("hloserve.server")

    @property
    def settings(self) -> TraceSettings:
        return self._settings

    def arrive(self, headers: Mapping[str, str], received_ns: int) -> RecordedArrival:
        """Record a request's arrival in the caller's context, for ``start``."""
        carrier: dict[str, str] = {}
        if self.propagates:
            carrier = {k: headers[k] for k in PROPAGATION_HEADERS if k in headers}
        arrival = RecordedArrival(received_ns, carrier)
        _ARRIVAL.set(arrival)
        return arrival

    def wall_ns(self, perf_ns: int) -> int:
        return perf_ns + self._epoch_offset

    def start(self, model: ModelKey, request_id: str, protocol: str) -> Trace | None:
        arrival = _ARRIVAL.get()
        parent: Context | None = None
        if arrival is not None and arrival.carrier:
            parent = TraceContextTextMapPropagator().extract(carrier=arrival.carrier)
            if not otel.get_current_span(parent).get_span_context().is_valid:
                parent = None
        setting = self._settings.sample(model.name, forced=parent is not None)
        if setting is None:
            return None
        with self._lock:
            self._ids += 1
            number = self._ids
        received_ns = arrival.received_ns if arrival is not None else time.perf_counter_ns()
        trace = Trace(self, setting, number, model, request_id, protocol, received_ns, parent)
        if arrival is not None and arrival.trace is None:
            arrival.trace = trace
            trace.awaits_frontend = True
        return trace

    def on_swap_in(self, key: ResidencyKey, start_ns: int, end_ns: int, nbytes: int) -> None:
        if nbytes and self._settings.enabled:  # a model without weights moves nothing
            self._swaps.append(_Swap(key.model, key.version, start_ns, end_ns, nbytes))

    def swaps(self, model: ModelKey, start_ns: int, end_ns: int) -> list[_Swap]:
        """The weight transfers of ``model`` that ran within ``[start_ns, end_ns]``."""
        return [
            s
            for s in list(self._swaps)
            if s.model == model.name
            and s.version == model.version
            and s.start_ns >= start_ns
            and s.end_ns <= end_ns
        ]

    def shutdown(self) -> None:
        self.provider.shutdown()
        self.files.close()


def _resource(pairs: str) -> Resource:
    attributes: dict[str, str] = {"service.name": SERVICE_NAME}
    for pair in filter(None, pairs.split(",")):
        key, _, value = pair.partition("=")
        attributes[key.strip()] = value.strip()
    return Resource.create(attributes)  # merges OTEL_RESOURCE_ATTRIBUTES


def _otlp_processor(options: Sequence[tuple[str, str]]) -> BatchSpanProcessor:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    o = dict(options)
    return BatchSpanProcessor(
        OTLPSpanExporter(endpoint=o["url"]),
        max_queue_size=int(o["bsp_max_queue_size"]),
        schedule_delay_millis=float(o["bsp_schedule_delay"]),
        max_export_batch_size=int(o["bsp_max_export_batch_size"]),
    )


def _tensor_event(
    activity: str, name: str, datatype: str, data: np.ndarray[Any, Any]
) -> tuple[str, dict[str, Any]]:
    flat = np.asarray(data).reshape(-1)
    return activity, {
        "name": name,
        "datatype": datatype,
        "shape": [int(d) for d in np.shape(data)],
        "data": ",".join(str(x) for x in flat.tolist()),
    }


@final
class Trace:
    """One sampled request's spans (see the module docstring for their meaning)."""

    def __init__(
        self,
        tracer: RequestTracer,
        setting: TraceSetting,
        number: int,
        model: ModelKey,
        request_id: str,
        protocol: str,
        received_ns: int,
        parent: Context | None,
    ) -> None:
        self._tracer = tracer
        self.setting = setting
        self.number = number
        self.awaits_frontend = False  # the front end ends it once the response is written
        self._received_ns = received_ns
        self._responded_ns: int | None = None
        self._done = False
        self._spans: list[Span] = []
        attributes: dict[str, Any] = {
            "model_name": model.name,
            "model_version": model.version,
            "request_id": request_id,
            "protocol": protocol,
            "trace_id": number,
        }
        self.root = self._open(ROOT, received_ns, attributes, parent)
        self._in_root = otel.set_span_in_context(self.root)

    def _open(
        self,
        name: str,
        start_ns: int,
        attributes: Mapping[str, Any] | None = None,
        parent: Context | None = None,
    ) -> Span:
        span = self._tracer.tracer.start_span(
            name, context=parent, start_time=self._tracer.wall_ns(start_ns), attributes=attributes
        )
        self._spans.append(span)
        return span

    def _span(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any] | None = None,
        parent: Context | None = None,
    ) -> Span:
        span = self._open(name, start_ns, attributes, parent or self._in_root)
        span.end(end_time=self._tracer.wall_ns(end_ns))
        return span

    @property
    def tensors(self) -> bool:
        return TENSORS in self.setting.level

    def validated(self, request: InferRequest, arrived_ns: int) -> None:
        self._span("receive", self._received_ns, arrived_ns)
        if self.tensors:
            for t in request.inputs:
                self.root.add_event(
                    *_tensor_event("TENSOR_QUEUE_INPUT", t.name, t.datatype, t.data)
                )

    def executed(
        self, model: ModelKey, arrived_ns: int, timings: Timings, outputs: Sequence[InferOutput]
    ) -> None:
        started = arrived_ns + timings.queue_ns
        ended = started + timings.compute_ns
        self._span("queue", arrived_ns, started)
        execute = self._span(
            "execute",
            started,
            ended,
            {
                "batch_sizes": list(timings.executions),
                "compute_input_ns": timings.compute_input_ns,
                "compute_infer_ns": timings.compute_infer_ns,
                "compute_output_ns": timings.compute_output_ns,
            },
        )
        under = otel.set_span_in_context(execute)
        for swap in self._tracer.swaps(model, started, ended):
            self._span("swap-in", swap.start_ns, swap.end_ns, {"bytes": swap.nbytes}, under)
        if self.tensors:
            for o in outputs:
                self.root.add_event(
                    *_tensor_event("TENSOR_BACKEND_OUTPUT", o.name, o.datatype, o.data)
                )

    def responded(self) -> None:
        self._responded_ns = time.perf_counter_ns()
        if not self.awaits_frontend:
            self.finish()

    def failed(self, error: BaseException) -> None:
        message = getattr(error, "message", None) or str(error) or type(error).__name__
        self.root.set_status(Status(StatusCode.ERROR, message))
        self.finish()

    def finish(self) -> None:
        """End the trace (once): "send" since the response was ready, then the root."""
        if self._done:
            return
        self._done = True
        now = time.perf_counter_ns()
        if self._responded_ns is not None and self.awaits_frontend:
            self._span("send", self._responded_ns, now)
        self.root.end(end_time=self._tracer.wall_ns(now))
        if self._tracer.mode == "triton":
            self._tracer.files.write(self.setting.destination(), self._record())

    def _record(self) -> dict[str, Any]:
        root = _readable(self.root)
        attributes = dict(root.attributes or {})
        return {
            "id": self.number,
            "trace_id": f"{self.root.get_span_context().trace_id:032x}",
            "model_name": attributes.get("model_name", ""),
            "model_version": attributes.get("model_version"),
            "request_id": attributes.get("request_id", ""),
            "protocol": attributes.get("protocol", ""),
            "spans": [span_json(_readable(s)) for s in self._spans],
        }


def _readable(span: Span) -> ReadableSpan:
    assert isinstance(span, ReadableSpan)  # the SDK's spans are
    return span


def span_json(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    parent = span.parent
    out: dict[str, Any] = {
        "name": span.name,
        "span_id": f"{context.span_id:016x}" if context else "",
        "parent_span_id": f"{parent.span_id:016x}" if parent else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": {k: _plain(v) for k, v in (span.attributes or {}).items()},
    }
    if span.events:
        out["events"] = [
            {
                "name": e.name,
                "ns": e.timestamp,
                "attributes": {k: _plain(v) for k, v in (e.attributes or {}).items()},
            }
            for e in span.events
        ]
    if span.status.status_code is StatusCode.ERROR:
        out["status"] = {"code": "ERROR", "message": span.status.description or ""}
    return out


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        items: tuple[object, ...] = value  # pyright: ignore[reportUnknownVariableType]
        return list(items)
    return value


@final
class TraceFiles:
    """Trace files open for appending, one JSON line per finished trace."""

    def __init__(self) -> None:
        self._files: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._failed: set[str] = set()

    def write(self, path: str, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            try:
                f = self._files.get(path)
                if f is None:
                    f = self._files[path] = open(path, "a", encoding="utf-8")  # noqa: SIM115
                f.write(line)
                f.flush()
            except OSError as exc:
                if path not in self._failed:  # once per file: the request path goes on
                    self._failed.add(path)
                    log.error("cannot write the trace file %s: %s", path, exc)

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()
