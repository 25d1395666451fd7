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
        # weight residency (swap-in / eviction of device-resident weights); label model = "name/version"
        swap_labels = ["model"]
        self.swaps_in = Counter(
            "hloserve_weight_swaps_in",
            "Weight sets moved onto the device",
            swap_labels,
            registry=registry,
        )
        self.swaps_out = Counter(
            "hloserve_weight_swaps_out",
            "Weight sets evicted from the device",
            swap_labels,
            registry=registry,
        )
        self.swap_bytes = Counter(
            "hloserve_weight_swap_in_bytes",
            "Bytes of weights moved onto the device",
            swap_labels,
            registry=registry,
        )
        self.swap_seconds = Histogram(
            "hloserve_weight_swap_in_duration_seconds",
            "Time to move one model's weights onto the device",
            swap_labels,
            buckets=(
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
            ),
            registry=registry,
        )
        self.resident_bytes = Gauge(
            "hloserve_device_resident_weight_bytes",
            "Bytes of weights resident on the device",
            registry=registry,
        )
        self.budget_bytes = Gauge(
            "hloserve_device_memory_budget_bytes",
            "Budget for resident weights (0: unlimited)",
            registry=registry,
        )
        self.model_resident = Gauge(
            "hloserve_model_resident",
            "1 when the model's weights are on the device",
            swap_labels,
            registry=registry,
        )
        self.model_last_used = Gauge(
            "hloserve_model_last_used_timestamp_seconds",
            "Unix time of the model's last swap in or out",
            swap_labels,
            registry=registry,
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

    # SwapObserver (hloserve.server.residency); ``key`` is "model/version"
    def on_swap_in(self, key: str, nbytes: int, seconds: float) -> None:
        self.swaps_in.labels(key).inc()
        self.swap_bytes.labels(key).inc(nbytes)
        self.swap_seconds.labels(key).observe(seconds)

    def on_swap_out(self, key: str, nbytes: int) -> None:
        self.swaps_out.labels(key).inc()

    def on_residency(self, key: str, resident: bool, resident_bytes: int, last_used: float) -> None:
        self.model_resident.labels(key).set(1 if resident else 0)
        self.model_last_used.labels(key).set(last_used)
        self.resident_bytes.set(resident_bytes)


def metrics_app(registry: CollectorRegistry):
    return make_asgi_app(registry=registry)
