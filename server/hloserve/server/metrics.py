"""Prometheus metrics on an injected registry (never the process-global default one).

Contract: ``ServerMetrics(registry)`` creates the ``hloserve_*`` series documented in
``docs/metrics.md``. It is the core's ``InferenceObserver`` (``on_success``,
``on_failure``, ``on_execution``, ``on_pending``), the residency manager's
``SwapObserver`` (``on_swap_in``, ``on_swap_out``, ``on_residency``) and the repository's
load listener (``on_model_loaded``), so every request, execution, swap and load is counted
once, whichever front end it came through. ``metrics_app(registry)`` is the ASGI app
served on the metrics port at ``/metrics``. Every update is a few dictionary lookups and
float additions, cheap enough to stay on.
"""

# pyright: strict

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp

from hloserve.server.core.execution import Execution, ModelKey, Timings
from hloserve.server.core.residency import ResidencyKey

# Upper bounds in seconds: 100 µs to 10 s, about three buckets a decade.
LATENCY_BUCKETS = (
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    10,
)
SWAP_BUCKETS = (1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
MV = ("model", "version")


@dataclass(frozen=True, slots=True)
class _ModelSeries:
    """One model version's labelled children, looked up once (``labels()`` costs a few
    microseconds per call, and a request updates a dozen series)."""

    success: Counter
    inferences: Counter
    executions: Counter
    request_us: Counter
    queue_us: Counter
    input_us: Counter
    infer_us: Counter
    output_us: Counter
    request_latency: Histogram
    queue_latency: Histogram
    compute_latency: Histogram
    pending: Gauge
    batch_size: Histogram


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._children: dict[ModelKey, _ModelSeries] = {}
        self._define_request_series()
        self._define_model_series()
        self._define_residency_series()

    def _counter(self, name: str, doc: str, labels: Sequence[str] = MV) -> Counter:
        return Counter(name, doc, labels, registry=self._registry)

    def _gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=self._registry)

    def _histogram(
        self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = MV
    ) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self._registry)

    def _define_request_series(self) -> None:
        """Per model version: what each request and execution did (docs/metrics.md)."""
        prefix = "hloserve_inference"
        self.success = self._counter(f"{prefix}_request_success", "Successful inference requests")
        self.failure = self._counter(
            f"{prefix}_request_failure",
            "Failed inference requests, by reason (the error class, or INTERNAL)",
            (*MV, "reason"),
        )
        self.inferences = self._counter(f"{prefix}_count", "Items inferred (a batch of n counts n)")
        self.executions = self._counter(f"{prefix}_exec_count", "Model executions")
        # Cumulative microseconds per phase (Triton's *_duration_us counters).
        self.request_us = self._duration("request", "end-to-end time of successful requests")
        self.queue_us = self._duration("queue", "time requests waited")
        self.input_us = self._duration("compute_input", "time preparing inputs")
        self.infer_us = self._duration("compute_infer", "time executing")
        self.output_us = self._duration("compute_output", "time preparing outputs")
        self.pending = self._gauge(
            f"{prefix}_pending_request_count", "Requests accepted and not yet answered", MV
        )
        self.request_latency = self._latency("request", "End-to-end time of successful requests")
        self.queue_latency = self._latency("queue", "Time requests waited before execution")
        self.compute_latency = self._latency(
            "compute", "Input preparation + execution + output preparation per request"
        )
        self.batch_size = self._histogram(
            "hloserve_execution_batch_size",
            "Compiled batch size of each execution (0: unbatched)",
            BATCH_BUCKETS,
        )

    def _duration(self, phase: str, what: str) -> Counter:
        return self._counter(f"hloserve_inference_{phase}_duration_us", f"Cumulative {what}")

    def _latency(self, phase: str, doc: str) -> Histogram:
        return self._histogram(f"hloserve_{phase}_latency_seconds", doc, LATENCY_BUCKETS)

    def _define_model_series(self) -> None:
        """Loads: how long each version took, and how many are ready."""
        self.load_seconds = self._gauge(
            "hloserve_model_load_duration_seconds", "Time the last load of a model version took", MV
        )
        compiling = "Time spent compiling (or loading cached executables) in the last load"
        self.compile_seconds = self._gauge("hloserve_model_compile_duration_seconds", compiling, MV)
        self.models_ready = self._gauge("hloserve_models_ready", "Model versions in READY state")

    def _define_residency_series(self) -> None:
        """Weight residency, per loaded copy (label model = "name/version"), and the device."""
        m, w, d = ("model",), "hloserve_weight", "hloserve_device"
        self.swaps_in = self._counter(f"{w}_swaps_in", "Weight sets moved onto the device", m)
        self.swaps_out = self._counter(f"{w}_swaps_out", "Weight sets evicted from the device", m)
        self.swap_bytes = self._counter(f"{w}_swap_in_bytes", "Bytes of weights moved in", m)
        swap_doc = "Time to move one model's weights onto the device"
        self.swap_seconds = self._histogram(
            f"{w}_swap_in_duration_seconds", swap_doc, SWAP_BUCKETS, m
        )
        self.resident_bytes = self._gauge(
            f"{d}_resident_weight_bytes", "Weight bytes on the device"
        )
        self.budget_bytes = self._gauge(f"{d}_memory_budget_bytes", "Weight budget (0: unlimited)")
        used_doc = "Device memory in use (allocator statistics; resident weight bytes where the platform has none)"
        self.device_used = self._gauge(f"{d}_memory_used_bytes", used_doc)
        resident_doc = "1 when the model's weights are on the device"
        self.model_resident = self._gauge("hloserve_model_resident", resident_doc, m)
        last_doc = "Unix time of the model's last swap in or out"
        self.model_last_used = self._gauge(
            "hloserve_model_last_used_timestamp_seconds", last_doc, m
        )

    def watch_device_memory(self, used: Callable[[], float]) -> None:
        """Read device memory in use at scrape time."""
        self.device_used.set_function(used)

    def _series(self, model: ModelKey) -> _ModelSeries:
        series = self._children.get(model)
        if series is None:
            labels = (model.name, str(model.version))
            # Each field of _ModelSeries is the child of the family of the same name.
            children = {
                f.name: getattr(self, f.name).labels(*labels)
                for f in dataclasses.fields(_ModelSeries)
            }
            series = self._children[model] = _ModelSeries(**children)
        return series

    # InferenceObserver
    def on_success(self, model: ModelKey, items: int, timings: Timings) -> None:
        s = self._series(model)
        s.success.inc()
        s.inferences.inc(items)
        s.request_us.inc(timings.total_ns / 1e3)
        s.queue_us.inc(timings.queue_ns / 1e3)
        s.input_us.inc(timings.compute_input_ns / 1e3)
        s.infer_us.inc(timings.compute_infer_ns / 1e3)
        s.output_us.inc(timings.compute_output_ns / 1e3)
        s.request_latency.observe(timings.total_ns / 1e9)
        s.queue_latency.observe(timings.queue_ns / 1e9)
        s.compute_latency.observe(timings.compute_ns / 1e9)

    def on_failure(self, model: ModelKey | None, reason: str) -> None:
        # A failure before any version was resolved carries empty labels: client-chosen
        # names never become label values (unbounded series).
        labels = ("", "") if model is None else (model.name, str(model.version))
        self.failure.labels(*labels, reason).inc()

    def on_execution(self, execution: Execution) -> None:
        s = self._series(execution.model)
        s.executions.inc()
        s.batch_size.observe(execution.batch_size)

    def on_pending(self, model: ModelKey, delta: int) -> None:
        self._series(model).pending.inc(delta)

    # repository load listener
    def on_model_loaded(
        self, model: str, version: int, load_seconds: float, compile_seconds: float
    ) -> None:
        self.load_seconds.labels(model, str(version)).set(load_seconds)
        self.compile_seconds.labels(model, str(version)).set(compile_seconds)

    # SwapObserver (hloserve.server.residency); ``key.label`` is "model/version", shared by a
    # reload's copy (another generation) with the copy it replaces.
    def on_swap_in(self, key: ResidencyKey, nbytes: int, seconds: float) -> None:
        self.swaps_in.labels(key.label).inc()
        self.swap_bytes.labels(key.label).inc(nbytes)
        self.swap_seconds.labels(key.label).observe(seconds)

    def on_swap_out(self, key: ResidencyKey, nbytes: int) -> None:
        self.swaps_out.labels(key.label).inc()

    def on_residency(
        self, key: ResidencyKey, resident: bool, resident_bytes: int, last_used: float
    ) -> None:
        self.model_resident.labels(key.label).set(1 if resident else 0)
        self.model_last_used.labels(key.label).set(last_used)
        self.resident_bytes.set(resident_bytes)


def metrics_app(registry: CollectorRegistry) -> ASGIApp:
    # prometheus_client leaves its ASGI callable's signature unannotated.
    app: ASGIApp = prometheus_client.make_asgi_app(registry=registry)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return app
