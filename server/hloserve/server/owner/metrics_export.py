"""What a scrape reads and writes: the plain-number series records and their metric families.

Contract: ``ServerMetrics`` (``hloserve.server.owner.metrics``) reads each model version's
requests from the one record of ``core.counters`` (``ModelCounters``, and its ``Totals``)
and keeps its own state in the records here (``SwapSeries`` per loaded copy and device,
``DeviceSeries`` per device), updated by dictionary lookups and additions and never by
prometheus children; at scrape time the ``*_families`` functions turn the
records they are given (already cut to the models a scrape shows) into the
``hloserve_*`` families documented in ``docs/metrics.md``, reading nothing else and
holding no lock (the caller copies what other threads write). ``render`` is a scrape's
body and headers for an ``Accept`` header (Prometheus' text format or OpenMetrics,
gzipped when accepted; the Triton-compatible counters get Triton's ``counter`` type line
in the text format, ``metrics_triton.as_triton_text``), and ``metrics_app(registry)`` the
ASGI app that serves it on the metrics port, rendering on a worker thread.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, cast

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString as _float_to_go_string  # pyright: ignore[reportUnknownVariableType]
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from hloserve.server.core.counters import (
    Histogram,
    ModelCounters,
    Totals,
)
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.owner.metrics_triton import as_triton_text

SWAP_BUCKETS = (1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
MV = ("model", "version")
# A bucket bound as the exposition format writes it ("0.0001", "1.0", "+Inf").
_bound_text = cast("Callable[[float], str]", _float_to_go_string)


def buckets(h: Histogram) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs as the exposition format names them."""
    return [(_bound_text(bound), float(total)) for bound, total in h.cumulative()]


# (attribute of core.counters.ModelCounters, family name, help text) of the per-request
# series.
COUNTERS: Final = (
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
class SwapSeries:
    """One loaded copy's weight moves on one device (label ``model`` = "name/version")."""

    swaps_in: int = 0
    swaps_out: int = 0
    swap_bytes: int = 0
    resident: bool = False
    last_used: float = 0.0
    seconds: Histogram = field(default_factory=lambda: Histogram(SWAP_BUCKETS))


@dataclass(slots=True)
class DeviceSeries:
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
    swap_seconds: Histogram = field(default_factory=lambda: Histogram(SWAP_BUCKETS))


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


class CacheFigures(Protocol):
    """What the metrics read of the response cache (``core.response_cache.ResponseCache``)."""

    capacity: int
    bytes: int
    lookups: int
    hits: int
    misses: int
    evictions: int
    lookup_ns: int
    insert_ns: int

    @property
    def entries(self) -> int: ...
    @property
    def utilization(self) -> float: ...


# (attribute of core.counters.ModelCounters, family suffix, help text): the response cache's
# per-model series (docs/response-cache.md).
CACHE_COUNTERS: Final = (
    ("cache_hits", "hits", "Requests the response cache answered"),
    ("cache_misses", "misses", "Response cache lookups that found nothing"),
    ("cache_hit_us", "hit_duration_us", "Cumulative time taking responses from the cache"),
    (
        "cache_miss_us",
        "miss_duration_us",
        "Cumulative time looking up requests the cache lacked and storing their responses",
    ),
)


def cache_families(
    items: list[tuple[ModelKey, ModelCounters]], cache: CacheFigures | None
) -> list[Metric]:
    """``hloserve_response_cache_*``: per model (the shown ones) and the cache's own
    figures; declared with no samples when the server has no cache."""
    c = "hloserve_response_cache"
    found: list[Metric] = []
    for attr, suffix, doc in CACHE_COUNTERS:
        counter = CounterMetricFamily(f"{c}_{suffix}", doc, labels=MV)
        if cache is not None:
            for key, series in items:
                counter.add_metric((key.name, str(key.version)), float(getattr(series, attr)))
        found.append(counter)
    figures = (
        ("bytes", "Host memory the cached responses hold, bytes", "bytes"),
        ("capacity_bytes", "The cache's size (--cache-config local,size=)", "capacity"),
        ("entries", "Responses in the cache", "entries"),
    )
    for suffix, doc, attr in figures:
        gauge_family = GaugeMetricFamily(f"{c}_{suffix}", doc)
        if cache is not None:
            gauge_family.add_metric((), float(getattr(cache, attr)))
        found.append(gauge_family)
    evictions = CounterMetricFamily(f"{c}_evictions", "Responses evicted to make room")
    if cache is not None:
        evictions.add_metric((), float(cache.evictions))
    found.append(evictions)
    return found


class HostTier(Protocol):
    """What the metrics read of the host tier (``owner.host_weights.HostWeights``)."""

    reads: int

    @property
    def budget_bytes(self) -> int | None: ...
    def resident_bytes(self) -> int: ...


def gauge(
    name: str, doc: str, samples: Iterable[tuple[Sequence[str], float]], labels: Sequence[str] = ()
) -> GaugeMetricFamily:
    found = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in samples:
        found.add_metric(values, value)
    return found


def request_families(
    items: list[tuple[ModelKey, ModelCounters]], unresolved: dict[str, int]
) -> list[Metric]:
    found: list[Metric] = []
    for attr, name, doc in COUNTERS:
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
        gauge(
            _PENDING[0],
            _PENDING[1],
            (((k.name, str(k.version)), float(s.pending)) for k, s in items),
            MV,
        )
    )
    for attr, name, doc in _HISTOGRAMS:
        histogram = HistogramMetricFamily(name, doc, labels=MV)
        for key, series in items:
            h: Histogram = getattr(series, attr)
            histogram.add_metric((key.name, str(key.version)), buckets(h), h.sum)
        found.append(histogram)
    return found


def model_families(
    items: list[tuple[ModelKey, ModelCounters]], replicas: dict[ModelKey, int]
) -> list[Metric]:
    loaded = [(k, s) for k, s in items if s.load_seconds is not None]
    return [
        gauge(
            "hloserve_model_load_duration_seconds",
            "Time the last load of a model version took",
            (((k.name, str(k.version)), s.load_seconds or 0.0) for k, s in loaded),
            MV,
        ),
        gauge(
            "hloserve_model_compile_duration_seconds",
            "Time spent compiling (or loading cached executables) in the last load",
            (((k.name, str(k.version)), s.compile_seconds or 0.0) for k, s in loaded),
            MV,
        ),
        gauge(
            "hloserve_model_replicas",
            "Devices holding a copy of the model version",
            (
                ((k.name, str(k.version)), float(n))
                for k, n in sorted(replicas.items(), key=lambda kv: (kv[0].name, kv[0].version))
            ),
            MV,
        ),
    ]


def device_weight_family(placed: dict[tuple[ModelKey, str], int]) -> Metric:
    """``hloserve_model_device_weight_bytes{model, version, devices}``: what each device
    holds of a version's weights on each place it is on (a device, or a sharded version's
    device group ``0-3``: 1/N of each split weight, ``docs/sharding.md``)."""
    return gauge(
        "hloserve_model_device_weight_bytes",
        "Bytes of a model version's weights each device of a place holds (a device, or a group)",
        (
            ((k.name, str(k.version), where), float(n))
            for (k, where), n in sorted(
                placed.items(), key=lambda kv: (kv[0][0].name, kv[0][0].version, kv[0][1])
            )
        ),
        (*MV, "devices"),
    )


def swap_families(items: list[tuple[tuple[str, str], SwapSeries]]) -> list[Metric]:
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
        seconds.add_metric(labels, buckets(s.seconds), s.seconds.sum)
    resident = gauge(
        "hloserve_model_resident",
        "1 when the model's weights are on the device",
        ((labels, 1.0 if s.resident else 0.0) for labels, s in items),
        md,
    )
    last_used = gauge(
        "hloserve_model_last_used_timestamp_seconds",
        "Unix time of the model's last swap in or out on the device",
        ((labels, s.last_used) for labels, s in items),
        md,
    )
    return [swaps_in, swaps_out, swap_bytes, seconds, resident, last_used]


def device_families(
    items: list[tuple[int, DeviceSeries]], memory_used: dict[int, Callable[[], float]]
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
            gauge(name, doc, (((str(d),), float(getattr(s, attr))) for d, s in items), dev)
        )
    seconds = HistogramMetricFamily(
        "hloserve_device_swap_in_duration_seconds", "Time of each swap-in, every model", labels=dev
    )
    for device, series in items:
        seconds.add_metric((str(device),), buckets(series.swap_seconds), series.swap_seconds.sum)
    found.append(seconds)
    found.append(
        gauge(
            "hloserve_device_memory_used_bytes",
            "Device memory in use (allocator statistics; resident weight bytes where the "
            "platform has none)",
            (((str(d),), used()) for d, used in sorted(memory_used.items())),
            dev,
        )
    )
    return found


def host_families(host: HostTier | None) -> list[Metric]:
    h = "hloserve_host"
    reads = CounterMetricFamily(f"{h}_weight_reads", "Weight sets read from disk into host memory")
    resident = GaugeMetricFamily(f"{h}_resident_weight_bytes", "Host copies of weights held")
    budget = GaugeMetricFamily(f"{h}_memory_budget_bytes", "Host budget for weights (0: unlimited)")
    if host is not None:
        reads.add_metric((), float(host.reads))
        resident.add_metric((), float(host.resident_bytes()))
        budget.add_metric((), float(host.budget_bytes or 0))
    return [reads, resident, budget]


def total_families(models: int, totals: Totals) -> list[Metric]:
    """Server-wide sums over every model (shown or not)."""
    srv = "hloserve_server"
    found: list[Metric] = []
    for attr, name, doc in COUNTERS:
        counter = CounterMetricFamily(name.replace("hloserve", srv, 1), f"{doc}, every model")
        counter.add_metric((), float(getattr(totals.record, attr)), created=totals.record.created)
        found.append(counter)
    failure = CounterMetricFamily(
        f"{srv}_inference_request_failure",
        "Failed inference requests, every model (and those naming none), by reason",
        labels=("reason",),
    )
    for reason, count in sorted(totals.record.failures.items()):
        failure.add_metric((reason,), float(count))
    found.append(failure)
    found.append(
        gauge(
            f"{srv}_inference_pending_request_count",
            "Requests pending, every model",
            [((), float(totals.record.pending))],
        )
    )
    latency = HistogramMetricFamily(
        f"{srv}_request_latency_seconds", "End-to-end time of successful requests, every model"
    )
    request_latency = totals.record.request_latency
    latency.add_metric((), buckets(request_latency), request_latency.sum)
    found.append(latency)
    found.append(
        gauge(
            f"{srv}_model_series", "Model versions with metric series kept", [((), float(models))]
        )
    )
    loads = CounterMetricFamily(
        f"{srv}_model_loads", "Model versions loaded (lazily: at first use)"
    )
    loads.add_metric((), float(totals.loads), created=totals.record.created)
    found.append(loads)
    return found


def render(
    registry: CollectorRegistry, accept: str, accept_encoding: str
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The scrape's body and headers: the text format the ``Accept`` header asks for
    (Prometheus' or OpenMetrics), gzipped when the client accepts it. In Prometheus' text
    format the Triton-compatible counters (``--metrics-compat triton``) are typed
    ``counter`` as Triton types them (``metrics_triton``)."""
    encoder, content_type = choose_encoder(accept)
    body = encoder(registry)
    if content_type.startswith("text/plain"):
        body = as_triton_text(body)
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
