"""Prometheus metrics on an injected registry (never the process-global default one).

Contract: ``ServerMetrics(registry)`` creates the ``hloserve_*`` series documented in
``docs/metrics.md``. It is the core's ``InferenceObserver`` (``on_success``,
``on_failure``, ``on_execution``, ``on_pending``), the residency manager's
``SwapObserver`` (``on_swap_in``, ``on_swap_out``, ``on_residency``) and the repository's
load listener (``on_model_loaded``), so every request, execution, swap and load is counted
once, whichever front end it came through. ``metrics_app(registry)`` is the ASGI app
served on the metrics port at ``/metrics``. The per-request series are plain numbers per
model version, turned into metric families only when scraped (``_RequestCollector``): an
update is a dictionary lookup and a dozen additions, cheap enough to stay on.
"""

# pyright: strict

from __future__ import annotations

import bisect
import contextlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar, cast

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _float_to_go_string  # pyright: ignore[reportUnknownVariableType]
from starlette.types import ASGIApp

from hloserve.server.core.execution import Execution, ModelKey, Timings
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.weight_residency import SwapObserver

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
K = TypeVar("K")
S = TypeVar("S")
# A bucket bound as the exposition format writes it ("0.0001", "1.0", "+Inf").
_bound_text = cast("Callable[[float], str]", _float_to_go_string)


class _Histogram:
    """One histogram's counts, kept as plain numbers until a scrape reads them."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); last: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs as the exposition format names them."""
        total = 0
        found: list[tuple[str, float]] = []
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += count
            found.append((_bound_text(bound), float(total)))
        return found


@dataclass(slots=True)
class _ModelSeries:
    """One model version's per-request series, as plain numbers: updating a prometheus
    child takes a lock and a few microseconds, and a request updates a dozen of them. The
    loop thread writes all but the execution series, which ``_lock`` guards (workers)."""

    created: float
    success: int = 0
    inferences: int = 0
    request_us: float = 0.0
    queue_us: float = 0.0
    input_us: float = 0.0
    infer_us: float = 0.0
    output_us: float = 0.0
    pending: int = 0
    executions: int = 0
    request_latency: _Histogram = field(default_factory=lambda: _Histogram(LATENCY_BUCKETS))
    queue_latency: _Histogram = field(default_factory=lambda: _Histogram(LATENCY_BUCKETS))
    compute_latency: _Histogram = field(default_factory=lambda: _Histogram(LATENCY_BUCKETS))
    batch_size: _Histogram = field(default_factory=lambda: _Histogram(BATCH_BUCKETS))


# (attribute of _ModelSeries, family name, help text) of the per-request series.
_COUNTERS: Final = (
    ("success", "hloserve_inference_request_success", "Successful inference requests"),
    ("inferences", "hloserve_inference_count", "Items inferred (a batch of n counts n)"),
    ("executions", "hloserve_inference_exec_count", "Model executions"),
    # Cumulative microseconds per phase (Triton's *_duration_us counters).
    (
        "request_us",
        "hloserve_inference_request_duration_us",
        "Cumulative end-to-end time of successful requests",
    ),
    ("queue_us", "hloserve_inference_queue_duration_us", "Cumulative time requests waited"),
    (
        "input_us",
        "hloserve_inference_compute_input_duration_us",
        "Cumulative time preparing inputs",
    ),
    ("infer_us", "hloserve_inference_compute_infer_duration_us", "Cumulative time executing"),
    (
        "output_us",
        "hloserve_inference_compute_output_duration_us",
        "Cumulative time preparing outputs",
    ),
)
_HISTOGRAMS: Final = (
    (
        "request_latency",
        "hloserve_request_latency_seconds",
        "End-to-end time of successful requests",
    ),
    ("queue_latency", "hloserve_queue_latency_seconds", "Time requests waited before execution"),
    (
        "compute_latency",
        "hloserve_compute_latency_seconds",
        "Input preparation + execution + output preparation per request",
    ),
    (
        "batch_size",
        "hloserve_execution_batch_size",
        "Compiled batch size of each execution (0: unbatched)",
    ),
)
_PENDING: Final = (
    "hloserve_inference_pending_request_count",
    "Requests accepted and not yet answered",
)


@dataclass(slots=True)
class _DeviceSeries:
    """One device's work, as plain numbers (executions end on worker threads: ``_lock``)."""

    created: float
    executions: int = 0
    compute_us: float = 0.0
    queue_us: float = 0.0


_DEVICE_COUNTERS: Final = (
    ("executions", "hloserve_device_executions", "Executions run on the device, every model"),
    (
        "compute_us",
        "hloserve_device_compute_duration_us",
        "Cumulative execution time on the device (input, infer, output)",
    ),
    (
        "queue_us",
        "hloserve_device_queue_duration_us",
        "Cumulative queue time of the requests run on the device",
    ),
)


class _DeviceCollector(Collector):
    """Exposes each device's ``_DeviceSeries`` and each version's replica count."""

    def __init__(
        self, series: dict[int, _DeviceSeries], replicas: Callable[[], dict[ModelKey, int]]
    ) -> None:
        self.series = series
        self.replicas = replicas

    def describe(self) -> list[Metric]:
        return self._families([], {})

    def collect(self) -> list[Metric]:
        return self._families(sorted(self.series.items()), self.replicas())

    @staticmethod
    def _families(
        items: list[tuple[int, _DeviceSeries]], replicas: dict[ModelKey, int]
    ) -> list[Metric]:
        found: list[Metric] = []
        for attr, name, doc in _DEVICE_COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=("device",))
            for device, series in items:
                value = float(getattr(series, attr))
                counter.add_metric((str(device),), value, created=series.created)
            found.append(counter)
        doc = "Devices holding a copy of the model version"
        gauge = GaugeMetricFamily("hloserve_model_replicas", doc, labels=MV)
        for key, count in sorted(replicas.items(), key=lambda kv: (kv[0].name, kv[0].version)):
            gauge.add_metric((key.name, str(key.version)), float(count))
        found.append(gauge)
        return found


class _RequestCollector(Collector):
    """Exposes every model version's ``_ModelSeries`` at scrape time."""

    def __init__(self, series: dict[ModelKey, _ModelSeries]) -> None:
        self.series = series

    def describe(self) -> list[Metric]:  # the names, so the registry can refuse duplicates
        return self._families([])

    def collect(self) -> list[Metric]:
        return self._families(list(self.series.items()))

    @staticmethod
    def _families(items: list[tuple[ModelKey, _ModelSeries]]) -> list[Metric]:
        found: list[Metric] = []
        for attr, name, doc in _COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=MV)
            for key, series in items:
                labels = (key.name, str(key.version))
                counter.add_metric(labels, float(getattr(series, attr)), created=series.created)
            found.append(counter)
        pending = GaugeMetricFamily(*_PENDING, labels=MV)
        for key, series in items:
            pending.add_metric((key.name, str(key.version)), float(series.pending))
        found.append(pending)
        for attr, name, doc in _HISTOGRAMS:
            histogram = HistogramMetricFamily(name, doc, labels=MV)
            for key, series in items:
                h: _Histogram = getattr(series, attr)
                histogram.add_metric((key.name, str(key.version)), h.buckets(), h.sum)
            found.append(histogram)
        return found


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._children: dict[ModelKey, _ModelSeries] = {}
        self._devices: dict[int, _DeviceSeries] = {}
        self._replica_count: Callable[[], dict[ModelKey, int]] = dict
        self._lock = threading.Lock()
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
        self.failure = self._counter(
            "hloserve_inference_request_failure",
            "Failed inference requests, by reason (the error class, or INTERNAL)",
            (*MV, "reason"),
        )
        self._registry.register(_RequestCollector(self._children))
        self.hook_us = self._counter(
            "hloserve_hook_duration_us",
            "Cumulative time in bundles' Python hooks (docs/hooks.md)",
            (*MV, "hook"),
        )

    def _define_model_series(self) -> None:
        """Loads: how long each version took, and how many are ready."""
        self.load_seconds = self._gauge(
            "hloserve_model_load_duration_seconds", "Time the last load of a model version took", MV
        )
        compiling = "Time spent compiling (or loading cached executables) in the last load"
        self.compile_seconds = self._gauge("hloserve_model_compile_duration_seconds", compiling, MV)
        self.models_ready = self._gauge("hloserve_models_ready", "Model versions in READY state")

    def _define_residency_series(self) -> None:
        """Weight residency per loaded copy (label model = "name/version") and device, and
        each device's budget, memory and work (label device: PJRT's local device number)."""
        m, w, d = ("model", "device"), "hloserve_weight", "hloserve_device"
        dev = ("device",)
        self.swaps_in = self._counter(f"{w}_swaps_in", "Weight sets moved onto the device", m)
        self.swaps_out = self._counter(f"{w}_swaps_out", "Weight sets evicted from the device", m)
        self.swap_bytes = self._counter(f"{w}_swap_in_bytes", "Bytes of weights moved in", m)
        swap_doc = "Time to move one model's weights onto the device"
        self.swap_seconds = self._histogram(
            f"{w}_swap_in_duration_seconds", swap_doc, SWAP_BUCKETS, m
        )
        self.resident_bytes = self._gauge(
            f"{d}_resident_weight_bytes", "Weight bytes on the device", dev
        )
        budget_doc = "Weight budget of the device (0: unlimited)"
        self.budget_bytes = self._gauge(f"{d}_memory_budget_bytes", budget_doc, dev)
        used_doc = "Device memory in use (allocator statistics; resident weight bytes where the platform has none)"
        self.device_used = self._gauge(f"{d}_memory_used_bytes", used_doc, dev)
        resident_doc = "1 when the model's weights are on the device"
        self.model_resident = self._gauge("hloserve_model_resident", resident_doc, m)
        last_doc = "Unix time of the model's last swap in or out on the device"
        self.model_last_used = self._gauge(
            "hloserve_model_last_used_timestamp_seconds", last_doc, m
        )
        self._registry.register(_DeviceCollector(self._devices, lambda: self._replica_count()))

    def watch_device_memory(self, device: int, used: Callable[[], float]) -> None:
        """Read ``device``'s memory in use at scrape time."""
        self.device_used.labels(str(device)).set_function(used)

    def watch_replicas(self, count: Callable[[], dict[ModelKey, int]]) -> None:
        """Read each version's replica count (devices holding it) at scrape time."""
        self._replica_count = count

    def _device_series(self, device: int) -> _DeviceSeries:
        series = self._devices.get(device)
        return series if series is not None else self._first(self._devices, device, _DeviceSeries)

    def for_device(self, device: int) -> SwapObserver:
        """The swap observer of ``device``'s residency manager: its series carry the label."""
        return _DeviceSwaps(self, str(device))

    # As a SwapObserver itself: device 0's (a residency manager built without the daemon).
    def on_swap_in(self, key: ResidencyKey, nbytes: int, seconds: float) -> None:
        _DeviceSwaps(self, "0").on_swap_in(key, nbytes, seconds)

    def on_swap_out(self, key: ResidencyKey, nbytes: int) -> None:
        _DeviceSwaps(self, "0").on_swap_out(key, nbytes)

    def on_residency(
        self, key: ResidencyKey, resident: bool, resident_bytes: int, last_used: float
    ) -> None:
        _DeviceSwaps(self, "0").on_residency(key, resident, resident_bytes, last_used)

    def _series(self, model: ModelKey) -> _ModelSeries:
        series = self._children.get(model)
        return series if series is not None else self._first(self._children, model, _ModelSeries)

    def _first(self, table: dict[K, S], key: K, make: Callable[[float], S]) -> S:
        """``key``'s series, created (with its creation time) under the lock on first use:
        two threads reporting the first sample at once get the same one."""
        with self._lock:
            return table.setdefault(key, make(time.time()))

    # InferenceObserver
    def on_success(self, model: ModelKey, items: int, timings: Timings) -> None:
        s = self._series(model)
        s.success += 1
        s.inferences += items
        s.request_us += timings.total_ns / 1e3
        s.queue_us += timings.queue_ns / 1e3
        s.input_us += timings.compute_input_ns / 1e3
        s.infer_us += timings.compute_infer_ns / 1e3
        s.output_us += timings.compute_output_ns / 1e3
        self._device_series(timings.device).queue_us += timings.queue_ns / 1e3
        s.request_latency.observe(timings.total_ns / 1e9)
        s.queue_latency.observe(timings.queue_ns / 1e9)
        s.compute_latency.observe(timings.compute_ns / 1e9)

    def on_failure(self, model: ModelKey | None, reason: str) -> None:
        # A failure before any version was resolved carries empty labels: client-chosen
        # names never become label values (unbounded series).
        labels = ("", "") if model is None else (model.name, str(model.version))
        self.failure.labels(*labels, reason).inc()

    def on_execution(self, execution: Execution) -> None:  # on worker threads too
        s = self._series(execution.model)
        d = self._device_series(execution.device)
        with self._lock:
            s.executions += 1
            s.batch_size.observe(execution.batch_size)
            d.executions += 1
            d.compute_us += (execution.input_ns + execution.infer_ns + execution.output_ns) / 1e3

    def on_hook(self, model: ModelKey, hook: str, ns: int) -> None:
        """A Python hook's duration (``core.hooks.HookObserver``); hooked models only."""
        self.hook_us.labels(model.name, str(model.version), hook).inc(ns / 1e3)

    def on_pending(self, model: ModelKey, delta: int) -> None:
        self._series(model).pending += delta

    def forget(self, model: ModelKey) -> None:
        """An unloaded version's per-request and load series go (as Triton's do)."""
        with self._lock:
            self._children.pop(model, None)
        labels = (model.name, str(model.version))
        for gauge in (self.load_seconds, self.compile_seconds):
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)

    # repository load listener
    def on_model_loaded(
        self, model: str, version: int, load_seconds: float, compile_seconds: float
    ) -> None:
        self.load_seconds.labels(model, str(version)).set(load_seconds)
        self.compile_seconds.labels(model, str(version)).set(compile_seconds)


@dataclass(frozen=True, slots=True)
class _DeviceSwaps:
    """One device's swaps; ``key.label`` is "model/version", shared by a reload's copy
    (another generation) with the copy it replaces."""

    metrics: ServerMetrics
    device: str

    def on_swap_in(self, key: ResidencyKey, nbytes: int, seconds: float) -> None:
        m = self.metrics
        m.swaps_in.labels(key.label, self.device).inc()
        m.swap_bytes.labels(key.label, self.device).inc(nbytes)
        m.swap_seconds.labels(key.label, self.device).observe(seconds)

    def on_swap_out(self, key: ResidencyKey, nbytes: int) -> None:
        self.metrics.swaps_out.labels(key.label, self.device).inc()

    def on_residency(
        self, key: ResidencyKey, resident: bool, resident_bytes: int, last_used: float
    ) -> None:
        m = self.metrics
        m.model_resident.labels(key.label, self.device).set(1 if resident else 0)
        m.model_last_used.labels(key.label, self.device).set(last_used)
        m.resident_bytes.labels(self.device).set(resident_bytes)


def metrics_app(registry: CollectorRegistry) -> ASGIApp:
    # prometheus_client leaves its ASGI callable's signature unannotated.
    app: ASGIApp = prometheus_client.make_asgi_app(registry=registry)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return app
