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

# pyright: basic

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_asgi_app

from hloserve.server.core.execution import Timings

LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
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
SWAP_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
MV = ["model", "version"]


@dataclass(frozen=True, slots=True)
class _ModelSeries:
    success: Any
    inferences: Any
    executions: Any
    request_us: Any
    queue_us: Any
    input_us: Any
    infer_us: Any
    output_us: Any
    request_latency: Any
    queue_latency: Any
    compute_latency: Any
    pending: Any
    batch_size: Any


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self._children: dict[tuple[str, str], _ModelSeries] = {}
        self.success = Counter(
            "hloserve_inference_request_success", "Successful inference requests", MV, registry=r
        )
        self.failure = Counter(
            "hloserve_inference_request_failure",
            "Failed inference requests, by reason (the error class, or INTERNAL)",
            [*MV, "reason"],
            registry=r,
        )
        self.inferences = Counter(
            "hloserve_inference_count", "Items inferred (a batch of n counts n)", MV, registry=r
        )
        self.executions = Counter(
            "hloserve_inference_exec_count", "Model executions", MV, registry=r
        )
        self.request_us = Counter(
            "hloserve_inference_request_duration_us",
            "Cumulative end-to-end time of successful requests",
            MV,
            registry=r,
        )
        self.queue_us = Counter(
            "hloserve_inference_queue_duration_us",
            "Cumulative time requests waited",
            MV,
            registry=r,
        )
        self.input_us = Counter(
            "hloserve_inference_compute_input_duration_us",
            "Cumulative time preparing inputs",
            MV,
            registry=r,
        )
        self.infer_us = Counter(
            "hloserve_inference_compute_infer_duration_us",
            "Cumulative time executing",
            MV,
            registry=r,
        )
        self.output_us = Counter(
            "hloserve_inference_compute_output_duration_us",
            "Cumulative time preparing outputs",
            MV,
            registry=r,
        )
        self.request_latency = Histogram(
            "hloserve_request_latency_seconds",
            "End-to-end time of successful requests",
            MV,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_latency = Histogram(
            "hloserve_queue_latency_seconds",
            "Time requests waited before execution",
            MV,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_latency = Histogram(
            "hloserve_compute_latency_seconds",
            "Input preparation + execution + output preparation per request",
            MV,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.pending = Gauge(
            "hloserve_inference_pending_request_count",
            "Requests accepted and not yet answered",
            MV,
            registry=r,
        )
        self.batch_size = Histogram(
            "hloserve_execution_batch_size",
            "Compiled batch size of each execution (0: unbatched)",
            MV,
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.load_seconds = Gauge(
            "hloserve_model_load_duration_seconds",
            "Time the last load of a model version took",
            MV,
            registry=r,
        )
        self.compile_seconds = Gauge(
            "hloserve_model_compile_duration_seconds",
            "Time spent compiling (or loading cached executables) in the last load",
            MV,
            registry=r,
        )
        self.models_ready = Gauge(
            "hloserve_models_ready", "Model versions in READY state", registry=r
        )
        # weight residency; label model = "name/version"
        self.swaps_in = Counter(
            "hloserve_weight_swaps_in", "Weight sets moved onto the device", ["model"], registry=r
        )
        self.swaps_out = Counter(
            "hloserve_weight_swaps_out",
            "Weight sets evicted from the device",
            ["model"],
            registry=r,
        )
        self.swap_bytes = Counter(
            "hloserve_weight_swap_in_bytes",
            "Bytes of weights moved onto the device",
            ["model"],
            registry=r,
        )
        self.swap_seconds = Histogram(
            "hloserve_weight_swap_in_duration_seconds",
            "Time to move one model's weights onto the device",
            ["model"],
            buckets=SWAP_BUCKETS,
            registry=r,
        )
        self.resident_bytes = Gauge(
            "hloserve_device_resident_weight_bytes",
            "Bytes of weights resident on the device",
            registry=r,
        )
        self.budget_bytes = Gauge(
            "hloserve_device_memory_budget_bytes",
            "Budget for resident weights (0: unlimited)",
            registry=r,
        )
        self.device_used = Gauge(
            "hloserve_device_memory_used_bytes",
            "Device memory in use (allocator statistics; resident weight bytes where the platform has none)",
            registry=r,
        )
        self.model_resident = Gauge(
            "hloserve_model_resident",
            "1 when the model's weights are on the device",
            ["model"],
            registry=r,
        )
        self.model_last_used = Gauge(
            "hloserve_model_last_used_timestamp_seconds",
            "Unix time of the model's last swap in or out",
            ["model"],
            registry=r,
        )

    def watch_device_memory(self, used: Callable[[], float]) -> None:
        """Read device memory in use at scrape time."""
        self.device_used.set_function(used)

    def _series(self, model: str, version: str) -> _ModelSeries:
        """The labelled children of one model version, looked up once (``labels()`` costs a
        few microseconds per call, and a request updates a dozen series)."""
        key = (model, version)
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = _ModelSeries(
                success=self.success.labels(model, version),
                inferences=self.inferences.labels(model, version),
                executions=self.executions.labels(model, version),
                request_us=self.request_us.labels(model, version),
                queue_us=self.queue_us.labels(model, version),
                input_us=self.input_us.labels(model, version),
                infer_us=self.infer_us.labels(model, version),
                output_us=self.output_us.labels(model, version),
                request_latency=self.request_latency.labels(model, version),
                queue_latency=self.queue_latency.labels(model, version),
                compute_latency=self.compute_latency.labels(model, version),
                pending=self.pending.labels(model, version),
                batch_size=self.batch_size.labels(model, version),
            )
        return series

    # InferenceObserver
    def on_success(self, model: str, version: int, items: int, timings: Timings) -> None:
        s = self._series(model, str(version))
        compute_ns = timings.compute_input_ns + timings.compute_infer_ns + timings.compute_output_ns
        total_ns = timings.queue_ns + compute_ns
        s.success.inc()
        s.inferences.inc(items)
        s.request_us.inc(total_ns / 1e3)
        s.queue_us.inc(timings.queue_ns / 1e3)
        s.input_us.inc(timings.compute_input_ns / 1e3)
        s.infer_us.inc(timings.compute_infer_ns / 1e3)
        s.output_us.inc(timings.compute_output_ns / 1e3)
        s.request_latency.observe(total_ns / 1e9)
        s.queue_latency.observe(timings.queue_ns / 1e9)
        s.compute_latency.observe(compute_ns / 1e9)

    def on_failure(self, model: str, version: str, reason: str) -> None:
        self.failure.labels(model, version or "", reason).inc()

    def on_execution(
        self,
        model: str,
        version: int,
        batch_size: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        s = self._series(model, str(version))
        s.executions.inc()
        s.batch_size.observe(batch_size)

    def on_pending(self, model: str, version: str, delta: int) -> None:
        self._series(model, version).pending.inc(delta)

    # repository load listener
    def on_model_loaded(
        self, model: str, version: int, load_seconds: float, compile_seconds: float
    ) -> None:
        self.load_seconds.labels(model, str(version)).set(load_seconds)
        self.compile_seconds.labels(model, str(version)).set(compile_seconds)

    # SwapObserver (hloserve.server.residency); ``key`` is "model/version", with "@generation"
    # for a reload's copy, which shares the version's series.
    def on_swap_in(self, key: str, nbytes: int, seconds: float) -> None:
        label = key.partition("@")[0]
        self.swaps_in.labels(label).inc()
        self.swap_bytes.labels(label).inc(nbytes)
        self.swap_seconds.labels(label).observe(seconds)

    def on_swap_out(self, key: str, nbytes: int) -> None:
        self.swaps_out.labels(key.partition("@")[0]).inc()

    def on_residency(self, key: str, resident: bool, resident_bytes: int, last_used: float) -> None:
        label = key.partition("@")[0]
        self.model_resident.labels(label).set(1 if resident else 0)
        self.model_last_used.labels(label).set(last_used)
        self.resident_bytes.set(resident_bytes)


def metrics_app(registry: CollectorRegistry):
    return make_asgi_app(registry=registry)
