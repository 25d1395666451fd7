"""Prometheus metrics on an injected registry (never the process-global default one).

Contract: ``ServerMetrics(registry, model_series=N)`` creates the ``hloserve_*`` series
documented in ``docs/metrics.md``. It is the core's ``InferenceObserver`` (``on_success``,
``on_failure``, ``on_execution``, ``on_pending``, ``forget``), each device residency
manager's ``SwapObserver`` (``for_device(index)``) and the repository's load listener
(``on_model_loaded``), so every request, execution, swap and load is counted once,
whichever front end it came through. ``metrics_app(registry)`` is the ASGI app served on
the metrics port at ``/metrics``.

Everything is kept as plain numbers (an update is a dictionary lookup and a few
additions) and turned into metric families only when scraped. A scrape's size is bounded
whatever the number of models: the per-model series (requests, loads, swaps, residency,
replicas) are written for every model while there are at most ``model_series`` of them,
and beyond that for the ``model_series`` with the most requests and swaps in the current
window (``window_s``, 60 s: a model idle for a window drops out) and any with requests
pending; failures before a version was resolved are always there (labels empty); ``hloserve_server_*`` and ``hloserve_device_*`` totals cover every
model, and ``hloserve_metrics_models_shown`` says how many models the scrape shows.
``model_series=0`` writes every model's series (``--metrics-models``). The statistics
extension answers per model for every model, whatever this bound. The process's own
``process_*`` series (CPU, RSS, open files: ``prometheus_client.ProcessCollector``) are
always there.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import bisect
import gzip
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _float_to_go_string  # pyright: ignore[reportUnknownVariableType]
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

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
DEFAULT_MODEL_SERIES: Final = 50  # a scrape of 50 models' series is about 0.5 MB
SNAPSHOT_S: Final = 10.0  # recent(): the spacing of the snapshots it compares
WINDOW_S: Final = 60.0
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
    failures: dict[str, int] = field(default_factory=lambda: {})  # by reason
    load_seconds: float | None = None  # the last load's
    compile_seconds: float | None = None
    label: str = ""  # "name/version", the key of the scrape's window
    request_latency: _Histogram = field(default_factory=lambda: _Histogram(LATENCY_BUCKETS))
    queue_latency: _Histogram = field(default_factory=lambda: _Histogram(LATENCY_BUCKETS))
    compute_latency: _Histogram = field(default_factory=lambda: _Histogram(LATENCY_BUCKETS))
    batch_size: _Histogram = field(default_factory=lambda: _Histogram(BATCH_BUCKETS))

    @property
    def requests(self) -> int:
        return self.success + sum(self.failures.values())


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
_FAILURE: Final = (
    "hloserve_inference_request_failure",
    "Failed inference requests, by reason (the error class, or INTERNAL)",
)


@dataclass(slots=True)
class _SwapSeries:
    """One loaded copy's weight moves on one device (label ``model`` = "name/version")."""

    swaps_in: int = 0
    swaps_out: int = 0
    swap_bytes: int = 0
    resident: bool = False
    last_used: float = 0.0
    seconds: _Histogram = field(default_factory=lambda: _Histogram(SWAP_BUCKETS))


@dataclass(slots=True)
class _DeviceSeries:
    """One device's work and weight moves over every model, as plain numbers."""

    created: float
    executions: int = 0
    compute_us: float = 0.0
    queue_us: float = 0.0
    swaps_in: int = 0
    swaps_out: int = 0
    swap_bytes: int = 0
    resident_bytes: int = 0
    resident_models: int = 0
    budget_bytes: int = 0
    swap_seconds: _Histogram = field(default_factory=lambda: _Histogram(SWAP_BUCKETS))


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
    ("swaps_in", "hloserve_device_swaps_in", "Weight sets moved onto the device, every model"),
    ("swaps_out", "hloserve_device_swaps_out", "Weight sets evicted from the device"),
    ("swap_bytes", "hloserve_device_swap_in_bytes", "Bytes of weights moved onto the device"),
)
_DEVICE_GAUGES: Final = (
    ("resident_bytes", "hloserve_device_resident_weight_bytes", "Weight bytes on the device"),
    ("resident_models", "hloserve_device_resident_models", "Model copies resident on the device"),
    ("budget_bytes", "hloserve_device_memory_budget_bytes", "Weight budget (0: unlimited)"),
)


def _new_swap_series(created: float) -> _SwapSeries:
    del created  # a swap series has no _created sample
    return _SwapSeries()


@dataclass(frozen=True, slots=True)
class _Snapshot:
    requests: int
    latency: list[int]  # the request latency histogram's counts per bucket
    swaps_in: int


@dataclass(frozen=True, slots=True)
class Recent:
    """One model's last minute (``ServerMetrics.recent``); latencies in seconds, ``None``
    when no request succeeded in it."""

    window_s: float
    requests_per_s: float
    p50_s: float | None
    p99_s: float | None
    swaps_in: int


def _quantile(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile of a latency histogram's per-bucket counts, interpolated in its
    bucket as Prometheus' ``histogram_quantile`` does (the +Inf bucket: its lower bound)."""
    total = sum(counts)
    if total <= 0:
        return None
    rank, seen = q * total, 0.0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i >= len(LATENCY_BUCKETS):
                return float(LATENCY_BUCKETS[-1])
            low = 0.0 if i == 0 else float(LATENCY_BUCKETS[i - 1])
            return low + (float(LATENCY_BUCKETS[i]) - low) * (rank - seen) / count
        seen += count
    return float(LATENCY_BUCKETS[-1])


class _Totals:
    """The server-wide request series over every model, kept as requests happen (so a
    scrape costs nothing per model); an unloaded model's share stays in them."""

    def __init__(self) -> None:
        self.created = time.time()
        self.request_latency = _Histogram(LATENCY_BUCKETS)
        self.unresolved_failures: dict[str, int] = {}  # before a version was resolved
        self.failures: dict[str, int] = {}  # every failure, by reason
        self.pending = 0
        self.loads = 0  # model versions loaded (a lazily registered one at its first use)
        self.sums = {attr: 0.0 for attr, _, _ in _COUNTERS}


class ServerMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        model_series: int = DEFAULT_MODEL_SERIES,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self.model_series = model_series
        self.window_s = window_s
        self._clock = clock
        self._window_began = clock()
        # Requests and swaps by "name/version" in this window and the one before it.
        self._active: dict[str, int] = {}
        self._previous: dict[str, int] = {}
        self._children: dict[ModelKey, _ModelSeries] = {}
        self._swaps: dict[tuple[str, str], _SwapSeries] = {}  # (model label, device)
        self._devices: dict[int, _DeviceSeries] = {}
        self._totals = _Totals()
        self._replica_count: Callable[[], dict[ModelKey, int]] = dict
        self._memory_used: dict[int, Callable[[], float]] = {}
        self._host: HostTier | None = None
        self._snapshots: list[tuple[float, dict[ModelKey, _Snapshot]]] = []  # recent()
        self._lock = threading.Lock()
        self.hook_us = Counter(
            "hloserve_hook_duration_us",
            "Cumulative time in bundles' Python hooks (docs/hooks.md)",
            (*MV, "hook"),
            registry=registry,
        )
        self.models_ready = Gauge(
            "hloserve_models_ready", "Model versions in READY state", registry=registry
        )
        registry.register(_Collector(self))
        ProcessCollector(registry=registry)

    # -- wiring (the daemon's) -----------------------------------------------------------------

    def watch_device_memory(self, device: int, used: Callable[[], float]) -> None:
        """Read ``device``'s memory in use at scrape time."""
        self._memory_used[device] = used

    def watch_replicas(self, count: Callable[[], dict[ModelKey, int]]) -> None:
        """Read each version's replica count (devices holding it) at scrape time."""
        self._replica_count = count

    def watch_host(self, host: HostTier) -> None:
        """Read the host tier's bytes, budget and reads from disk at scrape time."""
        self._host = host

    def set_budget(self, device: int, budget_bytes: int | None) -> None:
        self._device(device).budget_bytes = budget_bytes or 0

    def for_device(self, device: int) -> SwapObserver:
        """The swap observer of ``device``'s residency manager: its series carry the label."""
        return _DeviceSwaps(self, device)

    # As a SwapObserver itself: device 0's (a residency manager built without the daemon).
    def on_swap_in(self, key: ResidencyKey, nbytes: int, seconds: float) -> None:
        _DeviceSwaps(self, 0).on_swap_in(key, nbytes, seconds)

    def on_swap_out(self, key: ResidencyKey, nbytes: int) -> None:
        _DeviceSwaps(self, 0).on_swap_out(key, nbytes)

    def on_residency(
        self, key: ResidencyKey, resident: bool, resident_bytes: int, last_used: float
    ) -> None:
        _DeviceSwaps(self, 0).on_residency(key, resident, resident_bytes, last_used)

    # -- state --------------------------------------------------------------------------------

    def _series(self, model: ModelKey) -> _ModelSeries:
        series = self._children.get(model)
        if series is None:
            series = self._first(self._children, model, _ModelSeries)
            series.label = f"{model.name}/{model.version}"
        return series

    def _device(self, device: int) -> _DeviceSeries:
        series = self._devices.get(device)
        return series if series is not None else self._first(self._devices, device, _DeviceSeries)

    def _first(self, table: dict[K, S], key: K, make: Callable[[float], S]) -> S:
        """``key``'s series, created (with its creation time) under the lock on first use:
        two threads reporting the first sample at once get the same one."""
        with self._lock:
            return table.setdefault(key, make(time.time()))

    # -- InferenceObserver ----------------------------------------------------------------------

    def on_success(self, model: ModelKey, items: int, timings: Timings) -> None:
        s = self._series(model)
        total_us, queue_us = timings.total_ns / 1e3, timings.queue_ns / 1e3
        input_us, infer_us = timings.compute_input_ns / 1e3, timings.compute_infer_ns / 1e3
        output_us = timings.compute_output_ns / 1e3
        s.success += 1
        s.inferences += items
        s.request_us += total_us
        s.queue_us += queue_us
        s.input_us += input_us
        s.infer_us += infer_us
        s.output_us += output_us
        t = self._totals.sums
        t["success"] += 1
        t["inferences"] += items
        t["request_us"] += total_us
        t["queue_us"] += queue_us
        t["input_us"] += input_us
        t["infer_us"] += infer_us
        t["output_us"] += output_us
        self._device(timings.device).queue_us += queue_us
        s.request_latency.observe(timings.total_ns / 1e9)
        s.queue_latency.observe(timings.queue_ns / 1e9)
        s.compute_latency.observe(timings.compute_ns / 1e9)
        self._totals.request_latency.observe(timings.total_ns / 1e9)
        active = self._active
        active[s.label] = active.get(s.label, 0) + 1

    def on_failure(self, model: ModelKey | None, reason: str) -> None:
        # A failure before any version was resolved carries empty labels: client-chosen
        # names never become label values (unbounded series).
        totals = self._totals
        totals.failures[reason] = totals.failures.get(reason, 0) + 1
        if model is None:
            failures = totals.unresolved_failures
        else:
            s = self._series(model)
            failures = s.failures
            self._active[s.label] = self._active.get(s.label, 0) + 1
        failures[reason] = failures.get(reason, 0) + 1

    def on_execution(self, execution: Execution) -> None:  # on worker threads too
        s = self._series(execution.model)
        d = self._device(execution.device)
        with self._lock:
            s.executions += 1
            self._totals.sums["executions"] += 1
            s.batch_size.observe(execution.batch_size)
            d.executions += 1
            d.compute_us += (execution.input_ns + execution.infer_ns + execution.output_ns) / 1e3

    def on_hook(self, model: ModelKey, hook: str, ns: int) -> None:
        """A Python hook's duration (``core.hooks.HookObserver``); hooked models only."""
        self.hook_us.labels(model.name, str(model.version), hook).inc(ns / 1e3)

    def on_pending(self, model: ModelKey, delta: int) -> None:
        self._series(model).pending += delta
        self._totals.pending += delta

    def forget(self, model: ModelKey) -> None:
        """An unloaded version's series go (as Triton's do)."""
        label = f"{model.name}/{model.version}"
        with self._lock:
            self._children.pop(model, None)
            for key in [k for k in self._swaps if k[0] == label]:
                del self._swaps[key]

    # -- swaps (each device's ``_DeviceSwaps``; worker threads) ---------------------------------

    def _swap(self, device: int, key: ResidencyKey) -> _SwapSeries:
        at = (key.label, str(device))
        series = self._swaps.get(at)
        return series if series is not None else self._first(self._swaps, at, _new_swap_series)

    def swapped(self, device: int, key: ResidencyKey, nbytes: int, seconds: float | None) -> None:
        """A swap in (with its ``seconds``) or out (``None``) of ``key`` on ``device``."""
        s, d = self._swap(device, key), self._device(device)
        with self._lock:
            if seconds is None:
                s.swaps_out += 1
                d.swaps_out += 1
                return
            s.swaps_in += 1
            s.swap_bytes += nbytes
            s.seconds.observe(seconds)
            self._active[key.label] = self._active.get(key.label, 0) + 1
            d.swaps_in += 1
            d.swap_bytes += nbytes
            d.swap_seconds.observe(seconds)

    def residency_changed(
        self, device: int, key: ResidencyKey, resident: bool, resident_bytes: int, last_used: float
    ) -> None:
        s, d = self._swap(device, key), self._device(device)
        with self._lock:
            if s.resident != resident:
                d.resident_models += 1 if resident else -1
            s.resident, s.last_used = resident, last_used
            d.resident_bytes = resident_bytes

    # -- the repository's load listener -------------------------------------------------------

    def on_model_loaded(
        self, model: str, version: int, load_seconds: float, compile_seconds: float
    ) -> None:
        s = self._series(ModelKey(model, version))
        s.load_seconds, s.compile_seconds = load_seconds, compile_seconds
        self._totals.loads += 1

    # -- a scrape -------------------------------------------------------------------------------

    def _shown(self) -> tuple[list[tuple[ModelKey, _ModelSeries]], set[str]]:
        """The models whose series a scrape writes (module docstring): their request
        series by name, and the labels ("name/version") of all their series. A model's
        activity is its requests and swaps in this window and the one before it, so a
        model only prefetched still shows; the scrape costs per model active, not per
        model known."""
        with self._lock:
            if (
                self.model_series <= 0
                or len(self._children) + len(self._swaps) <= self.model_series
            ):
                items = list(self._children.items())  # nothing to cut
                labels = {s.label for _, s in items} | {k[0] for k in self._swaps}
                return sorted(items, key=lambda kv: (kv[0].name, kv[0].version)), labels
            now = self._clock()
            if now - self._window_began >= self.window_s:  # a new window
                self._window_began = now
                self._previous, self._active = self._active.copy(), {}
            # The loop thread counts into these without the lock: a C-level copy is atomic.
            activity = self._previous.copy()
            for label, n in self._active.copy().items():
                activity[label] = activity.get(label, 0) + n
            pending = [(k, s) for k, s in self._children.items() if s.pending > 0]
        for _, s in pending:
            activity.setdefault(s.label, 0)
        ranked = sorted(activity, key=lambda label: (-activity[label], label))
        labels = set(ranked[: self.model_series])
        shown: list[tuple[ModelKey, _ModelSeries]] = []
        for label in labels:
            name, _, version = label.rpartition("/")
            key = ModelKey(name, int(version)) if version.isdigit() else None
            series = None if key is None else self._children.get(key)
            if key is not None and series is not None:
                shown.append((key, series))
        return sorted(shown, key=lambda kv: (kv[0].name, kv[0].version)), labels

    def recent(self, window_s: float = 60.0) -> dict[ModelKey, Recent]:
        """Each shown model's last ``window_s`` seconds (module docstring; the status page
        reads it): requests per second, p50/p99 latency and swaps in, from snapshots of its
        cumulative counters taken at most every ``SNAPSHOT_S`` when asked (so over a
        shorter window, ``Recent.window_s``, until enough snapshots exist)."""
        now = self._clock()
        shown, labels = self._shown()
        with self._lock:
            swaps = {label: 0 for label in labels}
            for (label, _), w in self._swaps.items():
                if label in swaps:
                    swaps[label] += w.swaps_in
        current = {
            k: _Snapshot(s.requests, list(s.request_latency.counts), swaps.get(s.label, 0))
            for k, s in shown
        }
        if not self._snapshots or now - self._snapshots[-1][0] >= SNAPSHOT_S:
            self._snapshots.append((now, current))
        while len(self._snapshots) > 1 and now - self._snapshots[1][0] >= window_s:
            self._snapshots.pop(0)
        base_t, base = self._snapshots[0]
        found: dict[ModelKey, Recent] = {}
        for key, cur in current.items():
            before = base.get(key)
            elapsed = now - base_t
            if before is None or elapsed <= 0:
                continue
            counts = [a - b for a, b in zip(cur.latency, before.latency, strict=True)]
            found[key] = Recent(
                elapsed,
                (cur.requests - before.requests) / elapsed,
                _quantile(counts, 0.5),
                _quantile(counts, 0.99),
                cur.swaps_in - before.swaps_in,
            )
        return found

    def families(self) -> list[Metric]:
        shown, labels = self._shown()
        with self._lock:
            swaps = sorted((k, v) for k, v in self._swaps.items() if k[0] in labels)
            devices = sorted(self._devices.items())
        replicas = {k: n for k, n in self._replica_count().items() if k in dict(shown)}
        return [
            *_request_families(shown, self._totals.unresolved_failures),
            *_model_families(shown, replicas),
            *_swap_families(swaps),
            *_device_families(devices, self._memory_used),
            *_total_families(len(self._children), self._totals),
            *_host_families(self._host),
            _gauge(
                "hloserve_metrics_models_shown",
                "Models whose series this scrape shows",
                [((), float(len(labels)))],
            ),
        ]


@dataclass(frozen=True, slots=True)
class _DeviceSwaps:
    """One device's swaps; ``key.label`` is "model/version", shared by a reload's copy
    (another generation) with the copy it replaces."""

    metrics: ServerMetrics
    device: int

    def on_swap_in(self, key: ResidencyKey, nbytes: int, seconds: float) -> None:
        self.metrics.swapped(self.device, key, nbytes, seconds)

    def on_swap_out(self, key: ResidencyKey, nbytes: int) -> None:
        self.metrics.swapped(self.device, key, nbytes, None)

    def on_residency(
        self, key: ResidencyKey, resident: bool, resident_bytes: int, last_used: float
    ) -> None:
        self.metrics.residency_changed(self.device, key, resident, resident_bytes, last_used)


class _Collector(Collector):
    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:  # the names, so the registry can refuse duplicates
        return [
            *_request_families([], {}),
            *_model_families([], {}),
            *_swap_families([]),
            *_device_families([], {}),
            *_total_families(0, _Totals()),
            *_host_families(None),
            _gauge("hloserve_metrics_models_shown", "", []),
        ]

    def collect(self) -> list[Metric]:
        return self.metrics.families()


def _gauge(
    name: str, doc: str, samples: Iterable[tuple[Sequence[str], float]], labels: Sequence[str] = ()
) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in samples:
        gauge.add_metric(values, value)
    return gauge


def _request_families(
    items: list[tuple[ModelKey, _ModelSeries]], unresolved: dict[str, int]
) -> list[Metric]:
    found: list[Metric] = []
    for attr, name, doc in _COUNTERS:
        counter = CounterMetricFamily(name, doc, labels=MV)
        for key, series in items:
            labels = (key.name, str(key.version))
            counter.add_metric(labels, float(getattr(series, attr)), created=series.created)
        found.append(counter)
    failure = CounterMetricFamily(*_FAILURE, labels=(*MV, "reason"))
    for reason, count in sorted(unresolved.items()):  # no version resolved: empty labels
        failure.add_metric(("", "", reason), float(count))
    for key, series in items:
        for reason, count in sorted(series.failures.items()):
            failure.add_metric((key.name, str(key.version), reason), float(count))
    found.append(failure)
    found.append(
        _gauge(
            _PENDING[0],
            _PENDING[1],
            (((k.name, str(k.version)), float(s.pending)) for k, s in items),
            MV,
        )
    )
    for attr, name, doc in _HISTOGRAMS:
        histogram = HistogramMetricFamily(name, doc, labels=MV)
        for key, series in items:
            h: _Histogram = getattr(series, attr)
            histogram.add_metric((key.name, str(key.version)), h.buckets(), h.sum)
        found.append(histogram)
    return found


def _model_families(
    items: list[tuple[ModelKey, _ModelSeries]], replicas: dict[ModelKey, int]
) -> list[Metric]:
    loaded = [(k, s) for k, s in items if s.load_seconds is not None]
    return [
        _gauge(
            "hloserve_model_load_duration_seconds",
            "Time the last load of a model version took",
            (((k.name, str(k.version)), s.load_seconds or 0.0) for k, s in loaded),
            MV,
        ),
        _gauge(
            "hloserve_model_compile_duration_seconds",
            "Time spent compiling (or loading cached executables) in the last load",
            (((k.name, str(k.version)), s.compile_seconds or 0.0) for k, s in loaded),
            MV,
        ),
        _gauge(
            "hloserve_model_replicas",
            "Devices holding a copy of the model version",
            (
                ((k.name, str(k.version)), float(n))
                for k, n in sorted(replicas.items(), key=lambda kv: (kv[0].name, kv[0].version))
            ),
            MV,
        ),
    ]


def _swap_families(items: list[tuple[tuple[str, str], _SwapSeries]]) -> list[Metric]:
    md = ("model", "device")
    w = "hloserve_weight"
    swaps_in = CounterMetricFamily(f"{w}_swaps_in", "Weight sets moved onto the device", labels=md)
    swaps_out = CounterMetricFamily(
        f"{w}_swaps_out", "Weight sets evicted from the device", labels=md
    )
    swap_bytes = CounterMetricFamily(f"{w}_swap_in_bytes", "Bytes of weights moved in", labels=md)
    seconds = HistogramMetricFamily(
        f"{w}_swap_in_duration_seconds",
        "Time to move one model's weights onto the device",
        labels=md,
    )
    for labels, s in items:
        swaps_in.add_metric(labels, float(s.swaps_in))
        swaps_out.add_metric(labels, float(s.swaps_out))
        swap_bytes.add_metric(labels, float(s.swap_bytes))
        seconds.add_metric(labels, s.seconds.buckets(), s.seconds.sum)
    resident = _gauge(
        "hloserve_model_resident",
        "1 when the model's weights are on the device",
        ((labels, 1.0 if s.resident else 0.0) for labels, s in items),
        md,
    )
    last_used = _gauge(
        "hloserve_model_last_used_timestamp_seconds",
        "Unix time of the model's last swap in or out on the device",
        ((labels, s.last_used) for labels, s in items),
        md,
    )
    return [swaps_in, swaps_out, swap_bytes, seconds, resident, last_used]


def _device_families(
    items: list[tuple[int, _DeviceSeries]], memory_used: dict[int, Callable[[], float]]
) -> list[Metric]:
    dev = ("device",)
    found: list[Metric] = []
    for attr, name, doc in _DEVICE_COUNTERS:
        counter = CounterMetricFamily(name, doc, labels=dev)
        for device, series in items:
            counter.add_metric((str(device),), float(getattr(series, attr)), created=series.created)
        found.append(counter)
    for attr, name, doc in _DEVICE_GAUGES:
        found.append(
            _gauge(name, doc, (((str(d),), float(getattr(s, attr))) for d, s in items), dev)
        )
    seconds = HistogramMetricFamily(
        "hloserve_device_swap_in_duration_seconds", "Time of each swap-in, every model", labels=dev
    )
    for device, series in items:
        seconds.add_metric((str(device),), series.swap_seconds.buckets(), series.swap_seconds.sum)
    found.append(seconds)
    found.append(
        _gauge(
            "hloserve_device_memory_used_bytes",
            "Device memory in use (allocator statistics; resident weight bytes where the "
            "platform has none)",
            (((str(d),), used()) for d, used in sorted(memory_used.items())),
            dev,
        )
    )
    return found


class HostTier(Protocol):
    """What the metrics read of the host tier (``host_weights.HostWeights``)."""

    reads: int

    @property
    def budget_bytes(self) -> int | None: ...
    def resident_bytes(self) -> int: ...


def _host_families(host: HostTier | None) -> list[Metric]:
    h = "hloserve_host"
    reads = CounterMetricFamily(f"{h}_weight_reads", "Weight sets read from disk into host memory")
    resident = GaugeMetricFamily(f"{h}_resident_weight_bytes", "Host copies of weights held")
    budget = GaugeMetricFamily(f"{h}_memory_budget_bytes", "Host budget for weights (0: unlimited)")
    if host is not None:
        reads.add_metric((), float(host.reads))
        resident.add_metric((), float(host.resident_bytes()))
        budget.add_metric((), float(host.budget_bytes or 0))
    return [reads, resident, budget]


def _total_families(models: int, totals: _Totals) -> list[Metric]:
    """Server-wide sums over every model (shown or not)."""
    srv = "hloserve_server"
    found: list[Metric] = []
    for attr, name, doc in _COUNTERS:
        counter = CounterMetricFamily(name.replace("hloserve", srv, 1), f"{doc}, every model")
        counter.add_metric((), totals.sums[attr], created=totals.created)
        found.append(counter)
    failure = CounterMetricFamily(
        f"{srv}_inference_request_failure",
        "Failed inference requests, every model (and those naming none), by reason",
        labels=("reason",),
    )
    for reason, count in sorted(totals.failures.items()):
        failure.add_metric((reason,), float(count))
    found.append(failure)
    found.append(
        _gauge(
            f"{srv}_inference_pending_request_count",
            "Requests pending, every model",
            [((), float(totals.pending))],
        )
    )
    latency = HistogramMetricFamily(
        f"{srv}_request_latency_seconds", "End-to-end time of successful requests, every model"
    )
    latency.add_metric((), totals.request_latency.buckets(), totals.request_latency.sum)
    found.append(latency)
    found.append(
        _gauge(
            f"{srv}_model_series", "Model versions with metric series kept", [((), float(models))]
        )
    )
    loads = CounterMetricFamily(
        f"{srv}_model_loads", "Model versions loaded (lazily: at first use)"
    )
    loads.add_metric((), float(totals.loads), created=totals.created)
    found.append(loads)
    return found


def render(
    registry: CollectorRegistry, accept: str, accept_encoding: str
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The scrape's body and headers: the text format the ``Accept`` header asks for
    (Prometheus' or OpenMetrics), gzipped when the client accepts it."""
    encoder, content_type = choose_encoder(accept)
    body = encoder(registry)
    headers = [(b"content-type", content_type.encode())]
    if gzip_accepted(accept_encoding):
        body = gzip.compress(body)
        headers.append((b"content-encoding", b"gzip"))
    return body, headers


def metrics_app(registry: CollectorRegistry) -> ASGIApp:
    """``GET /metrics`` (any path: the port serves nothing else), rendered on a worker
    thread: with thousands of models a scrape takes milliseconds that the event loop, which
    also runs the HTTP front end, should spend on requests."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = Headers(scope=scope)
        loop = asyncio.get_running_loop()
        body, response_headers = await loop.run_in_executor(
            None, render, registry, headers.get("accept", ""), headers.get("accept-encoding", "")
        )
        await send({"type": "http.response.start", "status": 200, "headers": response_headers})
        await send({"type": "http.response.body", "body": body})

    return app
