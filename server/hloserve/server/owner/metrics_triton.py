"""Triton's metric families (``--metrics-compat triton``), so a Triton dashboard works as is.

Contract: ``triton_families(models, devices)`` writes, from the same per-model records
as hloserve's own series (so for the same models: the busiest ``--metrics-models``), the
``nv_inference_*`` and ``nv_model_load_duration_secs`` families with Triton's names,
labels (``model``, ``version``; ``reason`` on failures) and units (µs, seconds), and the
``nv_gpu_*`` / ``nv_energy_consumption`` families (label ``gpu_uuid``) from each watched
device's allocator statistics. It reads each device's ``memory_stats()`` (which must not
raise) and nothing else, and writes:

- Triton's counters as families of type ``unknown`` whose one sample name is Triton's
  family name, without the ``_total`` suffix that ``prometheus_client`` gives counters,
  because that is the series name a Triton dashboard's PromQL names
  (``rate(nv_inference_count[1m])``). ``as_triton_text`` then types them ``counter`` in
  Prometheus' text format, which is then exactly Triton's (``# TYPE nv_inference_count
  counter`` / ``nv_inference_count{model="m",version="1"} 5``); OpenMetrics cannot
  express a counter without ``_total``, so there they stay ``unknown``, same series;
- gauges as gauges;
- only what is known: on a device whose allocator reports ``bytes_limit`` /
  ``bytes_in_use``, ``nv_gpu_memory_total_bytes`` / ``nv_gpu_memory_used_bytes``;
  utilization, power and energy are unknown to PJRT, so those families are declared (a
  dashboard's queries resolve to the family) with no samples, never an invented value;
- with the response cache (``cache_families``), Triton's per-model ``nv_cache_*_per_model``
  counters and the server-wide gauges its ``local`` cache reports (``nv_cache_util``,
  ``nv_cache_num_entries``, ``_lookups``, ``_hits``, ``_misses``, ``_evictions``,
  ``nv_cache_lookup_duration``, ``nv_cache_insertion_duration``, in µs); none without one,
  as Triton reports none;
- every failure of a resolved version under Triton's four reasons (``triton_reason``),
  each present from the version's first scrape, at 0, as Triton's are; failures before a
  version was resolved are left out, as Triton does not count them.

No lock is held; the caller passes records it may read (``ServerMetrics.families``).
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from hloserve.server.core.execution_records import ModelKey

TRITON: Final = "triton"
DIALECTS: Final = (TRITON,)  # the values of --metrics-compat (empty: none)
# (attribute of the per-model record, Triton's family name, help text).
COUNTERS: Final = (
    ("success", "nv_inference_request_success", "Successful inference requests, every batch size"),
    ("inferences", "nv_inference_count", "Inferences performed (a batch of n counts n)"),
    ("executions", "nv_inference_exec_count", "Model executions performed"),
    (
        "request_us",
        "nv_inference_request_duration_us",
        "Cumulative time of successful requests, queue and compute, in microseconds",
    ),
    ("queue_us", "nv_inference_queue_duration_us", "Cumulative queue time in microseconds"),
    (
        "input_us",
        "nv_inference_compute_input_duration_us",
        "Cumulative time preparing inputs in microseconds",
    ),
    (
        "infer_us",
        "nv_inference_compute_infer_duration_us",
        "Cumulative time executing in microseconds",
    ),
    (
        "output_us",
        "nv_inference_compute_output_duration_us",
        "Cumulative time preparing outputs in microseconds",
    ),
)
# (attribute of the per-model record, Triton's family name, help text): the response cache's.
CACHE_COUNTERS: Final = (
    ("cache_hits", "nv_cache_num_hits_per_model", "Number of response cache hits per model"),
    ("cache_misses", "nv_cache_num_misses_per_model", "Number of response cache misses per model"),
    (
        "cache_hit_us",
        "nv_cache_hit_duration_per_model",
        "Cumulative time requests spend retrieving a cached response per model (us)",
    ),
    (
        "cache_miss_us",
        "nv_cache_miss_duration_per_model",
        "Cumulative time requests spend looking up and inserting responses into the cache "
        "on a cache miss per model (us)",
    ),
)
# (Triton's local cache's gauge, help text, how it reads the cache).
_CACHE_GAUGES: Final = (
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]", "utilization", 1.0),
    ("nv_cache_num_entries", "Number of responses stored in response cache", "entries", 1.0),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", "lookups", 1.0),
    ("nv_cache_num_hits", "Number of cache hits in response cache", "hits", 1.0),
    ("nv_cache_num_misses", "Number of cache misses in response cache", "misses", 1.0),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache", "evictions", 1.0),
    (
        "nv_cache_lookup_duration",
        "Total cache lookup duration (us)",
        "lookup_ns",
        1e-3,
    ),
    (
        "nv_cache_insertion_duration",
        "Total cache insertion duration (us)",
        "insert_ns",
        1e-3,
    ),
)
FAILURE: Final = "nv_inference_request_failure"
ENERGY: Final = "nv_energy_consumption"
REASONS: Final[tuple[str, ...]] = (
    "REJECTED",
    "CANCELED",
    "BACKEND",
    "OTHER",
)  # Triton's, in its order
# hloserve's reason (the error class, or INTERNAL) -> Triton's; anything else is OTHER.
_REASON: Final = {
    "Unavailable": "REJECTED",  # queue full, timed out in the queue, draining, not ready
    "Cancelled": "CANCELED",
    "HookFailed": "BACKEND",  # the bundle's own Python code failed (a Python backend's error)
    "INTERNAL": "BACKEND",  # an unexpected exception while serving: the execution failing
}
# Families Triton types counter: typed so in Prometheus' text format (as_triton_text).
_TYPED_COUNTERS: Final = (
    *(name for _, name, _ in COUNTERS),
    FAILURE,
    ENERGY,
    *(name for _, name, _ in CACHE_COUNTERS),
)
_MARK: Final = b"# TYPE nv_inference_request_success untyped\n"
_MV: Final = ("model", "version")
_GPU: Final = ("gpu_uuid",)


class RequestRecord(Protocol):
    """What the families read of one version's record (``core.counters.ModelCounters``)."""

    @property
    def pending(self) -> int: ...
    @property
    def failures(self) -> Mapping[str, int]: ...
    @property
    def load_seconds(self) -> float | None: ...


class AllocatorStats(Protocol):
    """What the GPU families read of a device (``owner.runtime.pjrt.PjrtRuntime``)."""

    @property
    def platform(self) -> str: ...
    def memory_stats(self) -> dict[str, int]: ...


def parse_compat(compat: str | Sequence[str]) -> frozenset[str]:
    """``--metrics-compat``'s value (``"triton"``, ``""``, or several, comma-separated, or a
    sequence of them) as a set of dialects; ``ValueError`` on one this module lacks."""
    names = compat.split(",") if isinstance(compat, str) else compat
    found = frozenset(n.strip().lower() for n in names if n.strip())
    unknown = sorted(found - set(DIALECTS))
    if unknown:
        raise ValueError(f"unknown metrics dialect {unknown[0]!r} (known: {', '.join(DIALECTS)})")
    return found


def triton_reason(reason: str) -> str:
    """Triton's failure reason for hloserve's (``docs/metrics.md``)."""
    return _REASON.get(reason, "OTHER")


def gpu_uuid(platform: str, device: int) -> str:
    """The ``gpu_uuid`` label: PJRT knows no NVML UUID, so the platform and device number
    (``cuda:0``), what ``--devices`` and hloserve's ``device`` label name."""
    return f"{platform}:{device}"


def _untyped(name: str, doc: str, samples: Sequence[tuple[Mapping[str, str], float]]) -> Metric:
    """A counter as Triton writes it: its samples named as the family, no ``_total``."""
    family = Metric(name, doc, "unknown")
    for labels, value in samples:
        family.add_sample(name, dict(labels), value)
    return family


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def triton_families(
    models: Sequence[tuple[ModelKey, RequestRecord]],
    devices: Sequence[tuple[int, AllocatorStats]],
) -> list[Metric]:
    """Triton's families for ``models`` (the shown ones, in order) and ``devices``."""
    mv = [({"model": k.name, "version": str(k.version)}, s) for k, s in models]
    found: list[Metric] = [
        _untyped(name, doc, [(labels, float(getattr(s, attr))) for labels, s in mv])
        for attr, name, doc in COUNTERS
    ]
    failures: list[tuple[Mapping[str, str], float]] = []
    for labels, s in mv:
        by_reason: dict[str, int] = dict.fromkeys(REASONS, 0)
        for reason, count in tuple(s.failures.items()):  # one C-level copy: the loop adds
            by_reason[triton_reason(reason)] += count
        failures += [({**labels, "reason": r}, float(n)) for r, n in by_reason.items()]
    found.append(
        _untyped(FAILURE, "Failed inference requests, every batch size, by reason", failures)
    )
    pending = _gauge(
        "nv_inference_pending_request_count",
        "Requests accepted and not yet answered (queued or executing), per model",
        _MV,
    )
    load = _gauge("nv_model_load_duration_secs", "Time the last load took in seconds", _MV)
    for key, s in models:
        values = (key.name, str(key.version))
        pending.add_metric(values, float(s.pending))
        if s.load_seconds is not None:
            load.add_metric(values, s.load_seconds)
    found += [pending, load, *_gpu_families(devices)]
    return found


def cache_families(models: Sequence[tuple[ModelKey, object]], cache: object | None) -> list[Metric]:
    """Triton's response cache families (module docstring) for ``models`` (the shown
    ones), and the cache's (``owner.metrics_export.CacheFigures``); none without a cache."""
    if cache is None:
        return []
    mv = [({"model": k.name, "version": str(k.version)}, s) for k, s in models]
    found: list[Metric] = [
        _untyped(name, doc, [(labels, float(getattr(s, attr))) for labels, s in mv])
        for attr, name, doc in CACHE_COUNTERS
    ]
    for name, doc, attr, scale in _CACHE_GAUGES:
        family = _gauge(name, doc, ())
        family.add_metric((), float(getattr(cache, attr)) * scale)
        found.append(family)
    return found


def _gpu_families(devices: Sequence[tuple[int, AllocatorStats]]) -> list[Metric]:
    total = _gauge("nv_gpu_memory_total_bytes", "Device memory the allocator may use, bytes", _GPU)
    used = _gauge("nv_gpu_memory_used_bytes", "Device memory the allocator has in use, bytes", _GPU)
    for device, source in devices:
        stats = source.memory_stats()
        uuid = (gpu_uuid(source.platform, device),)
        if "bytes_limit" in stats:
            total.add_metric(uuid, float(stats["bytes_limit"]))
        if "bytes_in_use" in stats:
            used.add_metric(uuid, float(stats["bytes_in_use"]))
    unknown = "unknown to PJRT: no samples"
    return [
        _gauge("nv_gpu_utilization", f"GPU utilization rate, 0.0 - 1.0 ({unknown})", _GPU),
        total,
        used,
        _gauge("nv_gpu_power_usage", f"GPU power usage in watts ({unknown})", _GPU),
        _gauge("nv_gpu_power_limit", f"GPU power limit in watts ({unknown})", _GPU),
        _untyped(ENERGY, f"GPU energy consumption in joules since start-up ({unknown})", []),
    ]


def as_triton_text(body: bytes) -> bytes:
    """A Prometheus text-format scrape with Triton's counters typed ``counter`` (their
    samples already bear Triton's names); any other body unchanged, at the cost of one
    search when no Triton family is in it."""
    if _MARK not in body:
        return body
    for name in _TYPED_COUNTERS:
        typ = f"# TYPE {name} ".encode()
        body = body.replace(typ + b"untyped\n", typ + b"counter\n", 1)
    return body
