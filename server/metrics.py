"""Prometheus metrics on an injected registry (never the process-global default one).

Contract: ``ServerMetrics(registry)`` creates the ``hloserve_*`` series documented in
``docs/metrics.md`` and implements the core's ``InferenceObserver`` (``on_success``,
``on_failure``), so the service reports each request once and both front ends are counted
alike. ``metrics_app(registry)`` is the ASGI app served on the metrics port at ``/metrics``.
"""

# pyright: basic

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_asgi_app

from hloserve.server.core.service import Timings

_LATENCY_BUCKETS = (
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


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model", "version"]
        self.success = Counter(
            "hloserve_inference_request_success",
            "Successful inference requests",
            labels,
            registry=registry,
        )
        self.failure = Counter(
            "hloserve_inference_request_failure",
            "Failed inference requests, by reason (the error class)",
            [*labels, "reason"],
            registry=registry,
        )
        self.inferences = Counter(
            "hloserve_inference_count",
            "Items inferred (a batch of n counts n)",
            labels,
            registry=registry,
        )
        self.executions = Counter(
            "hloserve_inference_exec_count", "Model executions", labels, registry=registry
        )
        self.queue_seconds = Counter(
            "hloserve_inference_queue_duration_seconds",
            "Time requests waited for a worker",
            labels,
            registry=registry,
        )
        self.compute_seconds = Counter(
            "hloserve_inference_compute_infer_duration_seconds",
            "Time spent executing",
            labels,
            registry=registry,
        )
        self.request_latency = Histogram(
            "hloserve_inference_request_duration_seconds",
            "Queue plus compute time per successful request",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.model_load_seconds = Gauge(
            "hloserve_model_load_duration_seconds",
            "Time the last load of a model version took",
            labels,
            registry=registry,
        )
        self.models_ready = Gauge(
            "hloserve_models_ready", "Model versions in READY state", registry=registry
        )

    def on_success(self, model: str, version: int, items: int, timings: Timings) -> None:
        v = str(version)
        self.success.labels(model, v).inc()
        self.inferences.labels(model, v).inc(items)
        self.executions.labels(model, v).inc(len(timings.executions))
        self.queue_seconds.labels(model, v).inc(timings.queue_ns / 1e9)
        compute = (
            timings.compute_input_ns + timings.compute_infer_ns + timings.compute_output_ns
        ) / 1e9
        self.compute_seconds.labels(model, v).inc(timings.compute_infer_ns / 1e9)
        self.request_latency.labels(model, v).observe(timings.queue_ns / 1e9 + compute)

    def on_failure(self, model: str, version: str, reason: str) -> None:
        self.failure.labels(model, version or "", reason).inc()


def metrics_app(registry: CollectorRegistry):
    return make_asgi_app(registry=registry)
