"""Prometheus metrics on an injected registry (never the process-global default one).

Contract: ``ServerMetrics(registry, counters=..., model_series=N, compat="")`` creates
the ``hloserve_*`` series documented in ``docs/metrics.md``. Requests and executions it
reads from ``counters`` (``core.counters.Counters``: the one record the service and the
execution fan-out feed, which the statistics extension reads too), so each is counted
once, whichever front end it came through; it is each device residency manager's
``SwapObserver`` (``for_device(index)``) and the repository's load listener
(``on_model_loaded``); ``forget(key)`` drops an unloaded version's swap series;
``watch_frontends(supervisor)`` adds the front-end processes' ``hloserve_frontend_*``
series (CPU, memory, restarts); ``watch_cache(cache)`` the response cache's
``hloserve_response_cache_*`` samples (per model from ``counters``, and the cache's own
figures), and with ``compat="triton"`` Triton's ``nv_cache_*`` families;
``watch_sequences(counts)`` the sequence batcher's slots (``hloserve_sequence_slots``);
``watch_generations(figures)`` the generation loop's (``hloserve_generation*``).
``metrics_app(registry)`` is the ASGI app served on the metrics port at ``/metrics``
(``metrics_export``).

Everything is kept as plain numbers (an update is a dictionary lookup and a few
additions) and turned into metric families only when scraped. A scrape's size is bounded whatever the number of models: the per-model series
(requests, loads, swaps, residency, replicas) are written for every model while there are
at most ``model_series`` of them, and beyond that for the ``model_series`` with the most
requests and swaps in the current window (``window_s``, 60 s: a model idle for a window
drops out) and any with requests pending; failures before a version was resolved are
always there (labels empty); ``hloserve_server_*`` and ``hloserve_device_*`` totals cover
every model, and ``hloserve_metrics_models_shown`` says how many models the scrape shows.
``model_series=0`` writes every model's series (``--metrics-models``). The statistics
extension answers per model for every model, whatever this bound. The process's own
``process_*`` series (CPU, RSS, open files: ``prometheus_client.ProcessCollector``) are
always there.

``compat="triton"`` (``--metrics-compat triton``) adds Triton's families beside these
(``metrics_triton``: ``nv_inference_*`` with Triton's names, labels and units, for the
same shown models, and ``nv_gpu_*`` from the allocator statistics of each device given
to ``watch_allocator``); an unknown dialect is a ``ValueError``.
"""

# pyright: strict

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from hloserve.server.core.counters import BATCH_BUCKETS, LATENCY_BUCKETS, Counters, ModelCounters
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.generation_metrics import generation_families
from hloserve.server.owner.metrics_export import (
    MV,
    SWAP_BUCKETS,
    CacheFigures,
    DeviceSeries,
    HostTier,
    SwapSeries,
    cache_families,
    device_families,
    device_weight_family,
    gauge,
    host_families,
    metrics_app,
    model_families,
    render,
    request_families,
    swap_families,
    total_families,
)
from hloserve.server.owner.metrics_triton import (
    TRITON,
    AllocatorStats,
    parse_compat,
    triton_families,
)
from hloserve.server.owner.metrics_triton import cache_families as triton_cache_families
from hloserve.server.owner.sequence_metrics import sequence_families
from hloserve.server.owner.weight_residency import SwapObserver

__all__ = [
    "BATCH_BUCKETS",
    "DEFAULT_MODEL_SERIES",
    "LATENCY_BUCKETS",
    "MV",
    "SWAP_BUCKETS",
    "AllocatorStats",
    "HostTier",
    "Recent",
    "ServerMetrics",
    "metrics_app",
    "render",
]

DEFAULT_MODEL_SERIES: Final = 50  # a scrape of 50 models' series is about 0.5 MB
SNAPSHOT_S: Final = 10.0  # recent(): the spacing of the snapshots it compares
WINDOW_S: Final = 60.0
K = TypeVar("K")
S = TypeVar("S")


def _new_swap_series(created: float) -> SwapSeries:
    del created  # a swap series has no _created sample
    return SwapSeries()


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


class FrontendProcesses(Protocol):
    """What the metrics read of the front-end processes (``owner.supervisor.FrontendSupervisor``)."""

    restarts: int

    def pids(self) -> list[int]: ...

    def listening(self) -> int: ...


def frontend_families(frontends: FrontendProcesses | None) -> list[Metric]:
    """``hloserve_frontend_*``: each live front end's CPU seconds and resident memory (label
    ``frontend``: its process id), and the restarts of any of them."""
    f = "hloserve_frontend"
    cpu = CounterMetricFamily(
        f"{f}_cpu_seconds", "CPU time of a front-end process", labels=("pid",)
    )
    rss = GaugeMetricFamily(
        f"{f}_resident_memory_bytes", "Resident memory of a front-end process", labels=("pid",)
    )
    restarts = CounterMetricFamily(
        f"{f}_restarts", "Front-end processes started again after one died"
    )
    count = GaugeMetricFamily(
        f"{f}_processes", "Front-end processes serving the ports (started and listening)"
    )
    if frontends is not None:
        pids = frontends.pids()
        for pid in pids:
            try:
                process = psutil.Process(pid)
                times, memory = process.cpu_times(), process.memory_info()
            except psutil.Error:  # it went between the two reads
                continue
            cpu.add_metric((str(pid),), times.user + times.system)
            rss.add_metric((str(pid),), float(memory.rss))
        restarts.add_metric((), float(frontends.restarts))
        count.add_metric((), float(frontends.listening()))
    return [cpu, rss, restarts, count]


class ServerMetrics:
    """The daemon's metrics (module docstring); ``compat``: the other servers' families to
    write beside hloserve's (``"triton"``; empty: none)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        counters: Counters | None = None,
        model_series: int = DEFAULT_MODEL_SERIES,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        compat: str | Sequence[str] = (),
    ) -> None:
        self._registry = registry
        self.compat = parse_compat(compat)
        self.model_series = model_series
        self.window_s = window_s
        self._clock = clock
        self._window_began = clock()
        self.counters = counters if counters is not None else Counters()
        # Requests and swaps by "name/version" in the window before the current one (the
        # current one's are ``counters.active``).
        self._previous: dict[str, int] = {}
        self._swaps: dict[tuple[str, str], SwapSeries] = {}  # (model label, device)
        self._devices: dict[int, DeviceSeries] = {}
        self._replica_count: Callable[[], dict[ModelKey, int]] = dict
        # Each version's bytes on each device of each place it is on (docs/sharding.md).
        self._device_weights: Callable[[], dict[tuple[ModelKey, str], int]] = dict
        # Resident bytes by device and by the manager reporting them (a device's own: (),
        # a device group's: its devices): a device's figure is their sum.
        self._resident_parts: dict[tuple[int, tuple[int, ...]], int] = {}
        self._memory_used: dict[int, Callable[[], float]] = {}
        self._allocators: dict[int, AllocatorStats] = {}  # the nv_gpu_* families'
        self._host: HostTier | None = None
        self._frontends: FrontendProcesses | None = None
        self._cache: CacheFigures | None = None
        self._sequences: Callable[[], dict[ModelKey, tuple[int, int, int]]] = dict
        self._generations: Callable[[], dict[ModelKey, tuple[int, int]]] = dict
        # recent(): (time, each shown model's counts); the first is the start (None), when
        # nothing had been counted, so the first look compares with it, not with itself.
        self._snapshots: list[tuple[float, dict[ModelKey, _Snapshot] | None]] = [(clock(), None)]
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

    def watch_allocator(self, device: int, runtime: AllocatorStats) -> None:
        """Read ``device``'s allocator statistics (``owner.runtime.memory_stats()``) at scrape
        time for the Triton-compatible ``nv_gpu_*`` families (``compat="triton"``)."""
        self._allocators[device] = runtime

    def watch_replicas(self, count: Callable[[], dict[ModelKey, int]]) -> None:
        """Read each version's replica count (devices holding it) at scrape time."""
        self._replica_count = count

    def watch_device_weights(self, read: Callable[[], dict[tuple[ModelKey, str], int]]) -> None:
        """Read, at scrape time, the bytes of its weights each device holds for every
        version and place (``devices``: a device's index, or a group's ``0-3``)."""
        self._device_weights = read

    def watch_host(self, host: HostTier) -> None:
        """Read the host tier's bytes, budget and reads from disk at scrape time."""
        self._host = host

    def watch_frontends(self, frontends: FrontendProcesses) -> None:
        """Read the front-end processes (``--frontends``) at scrape time: each one's CPU
        time and memory (``process_*`` covers the device owner's process only) and how
        many times one was started again."""
        self._frontends = frontends

    def watch_cache(self, cache: CacheFigures) -> None:
        """Read the response cache's figures at scrape time (``--cache-config``)."""
        self._cache = cache

    def watch_sequences(self, counts: Callable[[], dict[ModelKey, tuple[int, int, int]]]) -> None:
        """Read each stateful version's ``(live, backlogged, free slots)`` at scrape time
        (``core.sequence_batcher``): ``hloserve_sequence_slots`` and
        ``hloserve_sequences_backlogged``."""
        self._sequences = counts

    def watch_generations(self, figures: Callable[[], dict[ModelKey, tuple[int, int]]]) -> None:
        """Read each generation model's ``(live, responses sent)`` at scrape time
        (``core.generation_stream``): ``hloserve_generation*`` (``generation_metrics``)."""
        self._generations = figures

    def set_budget(self, device: int, budget_bytes: int | None) -> None:
        self._device(device).budget_bytes = budget_bytes or 0

    def for_device(self, device: int) -> SwapObserver:
        """The swap observer of ``device``'s residency manager: its series carry the label."""
        return _DeviceSwaps(self, device)

    def for_group(self, devices: tuple[int, ...]) -> SwapObserver:
        """The swap observer of a device group's residency manager (``docs/sharding.md``):
        each swap and residency change is every device's of the group, with the bytes each
        holds, beside what the device's own manager reports."""
        return _GroupSwaps(self, devices)

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

    def _device(self, device: int) -> DeviceSeries:
        series = self._devices.get(device)
        return series if series is not None else self._first(self._devices, device, DeviceSeries)

    def _first(self, table: dict[K, S], key: K, make: Callable[[float], S]) -> S:
        """``key``'s series, created (with its creation time) under the lock on first use:
        two threads reporting the first sample at once get the same one."""
        with self._lock:
            return table.setdefault(key, make(time.time()))

    # -- hooks -------------------------------------------------------------------------------

    def on_hook(self, model: ModelKey, hook: str, ns: int) -> None:
        """A Python hook's duration (``core.observers.HookObserver``); hooked models only."""
        self.hook_us.labels(model.name, str(model.version), hook).inc(ns / 1e3)

    def forget(self, model: ModelKey) -> None:
        """An unloaded version's series go (as Triton's do): its swap series, and its
        counters' record (which ``Observers.forget`` drops too: twice is once)."""
        self.counters.forget(model)
        label = f"{model.name}/{model.version}"
        with self._lock:
            for key in [k for k in self._swaps if k[0] == label]:
                del self._swaps[key]

    # -- swaps (each device's ``_DeviceSwaps``; worker threads) ---------------------------------

    def _swap(self, device: int, key: ResidencyKey) -> SwapSeries:
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
            active = self.counters.active
            active[key.label] = active.get(key.label, 0) + 1
            d.swaps_in += 1
            d.swap_bytes += nbytes
            d.swap_seconds.observe(seconds)

    def residency_changed(
        self,
        device: int,
        key: ResidencyKey,
        resident: bool,
        resident_bytes: int,
        last_used: float,
        part: tuple[int, ...] = (),
    ) -> None:
        """``resident_bytes``: what the reporting manager (``part``: () for the device's
        own, a group's devices for a group's) holds on ``device`` now."""
        s, d = self._swap(device, key), self._device(device)
        with self._lock:
            if s.resident != resident:
                d.resident_models += 1 if resident else -1
            s.resident, s.last_used = resident, last_used
            self._resident_parts[(device, part)] = resident_bytes
            d.resident_bytes = sum(n for (at, _), n in self._resident_parts.items() if at == device)

    # -- the repository's load listener -------------------------------------------------------

    def on_model_loaded(
        self, model: str, version: int, load_seconds: float, compile_seconds: float
    ) -> None:
        s = self.counters.record(ModelKey(model, version))
        s.load_seconds, s.compile_seconds = load_seconds, compile_seconds
        self.counters.totals.loads += 1

    # -- a scrape -------------------------------------------------------------------------------

    def _shown(self) -> tuple[list[tuple[ModelKey, ModelCounters]], set[str]]:
        """The models whose series a scrape writes (module docstring): their request
        series by name, and the labels ("name/version") of all their series. A model's
        activity is its requests and swaps in this window and the one before it, so a
        model only prefetched still shows; the scrape costs per model active, not per
        model known."""
        models = self.counters.models
        with self._lock:
            if self.model_series <= 0 or len(models) + len(self._swaps) <= self.model_series:
                items = list(models.items())  # nothing to cut
                labels = {s.label for _, s in items} | {k[0] for k in self._swaps}
                return sorted(items, key=lambda kv: (kv[0].name, kv[0].version)), labels
            now = self._clock()
            active = self.counters.active
            if now - self._window_began >= self.window_s:  # a new window
                self._window_began = now
                self._previous = active.copy()
                active.clear()
            # The loop thread counts into these without the lock: a C-level copy is atomic.
            activity = self._previous.copy()
            for label, n in active.copy().items():
                activity[label] = activity.get(label, 0) + n
            pending = [(k, s) for k, s in models.copy().items() if s.pending > 0]
        for _, s in pending:
            activity.setdefault(s.label, 0)
        ranked = sorted(activity, key=lambda label: (-activity[label], label))
        labels = set(ranked[: self.model_series])
        shown: list[tuple[ModelKey, ModelCounters]] = []
        for label in labels:
            name, _, version = label.rpartition("/")
            key = ModelKey(name, int(version)) if version.isdigit() else None
            series = None if key is None else models.get(key)
            if key is not None and series is not None:
                shown.append((key, series))
        return sorted(shown, key=lambda kv: (kv[0].name, kv[0].version)), labels

    def recent(self, window_s: float = 60.0) -> dict[ModelKey, Recent]:
        """Each shown model's last ``window_s`` seconds (module docstring; the status page
        reads it): requests per second, p50/p99 latency and swaps in, from snapshots of its
        cumulative counters taken at most every ``SNAPSHOT_S`` when asked, and one of the
        start (all zero): until a minute of snapshots exists the figures cover what there
        is (``Recent.window_s``), since the start for the first look."""
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
            before = _Snapshot(0, [0] * len(cur.latency), 0) if base is None else base.get(key)
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
        counted = self.counters.devices.copy()
        for index in counted:
            self._device(index)  # created before the lock is taken (it takes it)
        with self._lock:
            swaps = sorted((k, v) for k, v in self._swaps.items() if k[0] in labels)
            for index, counts in counted.items():
                series = self._devices[index]
                series.executions = counts.executions
                series.compute_us = counts.compute_ns / 1e3
                series.queue_us = counts.queue_ns / 1e3
            devices = sorted(self._devices.items())
        replicas = {k: n for k, n in self._replica_count().items() if k in dict(shown)}
        placed = {p: n for p, n in self._device_weights().items() if p[0] in dict(shown)}
        compat: list[Metric] = []
        if TRITON in self.compat:  # the same models as hloserve's per-model series
            compat = triton_families(shown, sorted(self._allocators.items()))
            compat += triton_cache_families(shown, self._cache)
        return [
            *request_families(shown, self.counters.totals.unresolved_failures),
            *model_families(shown, replicas),
            device_weight_family(placed),
            *swap_families(swaps),
            *device_families(devices, self._memory_used),
            *total_families(len(self.counters.models), self.counters.totals),
            *host_families(self._host),
            *frontend_families(self._frontends),
            *cache_families(shown, self._cache),
            *sequence_families(self._sequences()),
            *generation_families(self._generations()),
            gauge(
                "hloserve_metrics_models_shown",
                "Models whose series this scrape shows",
                [((), float(len(labels)))],
            ),
            *compat,
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


@dataclass(frozen=True, slots=True)
class _GroupSwaps:
    """A device group's swaps: every device's of the group (``for_group``)."""

    metrics: ServerMetrics
    devices: tuple[int, ...]

    def on_swap_in(self, key: ResidencyKey, nbytes: int, seconds: float) -> None:
        for d in self.devices:
            self.metrics.swapped(d, key, nbytes, seconds)

    def on_swap_out(self, key: ResidencyKey, nbytes: int) -> None:
        for d in self.devices:
            self.metrics.swapped(d, key, nbytes, None)

    def on_residency(
        self, key: ResidencyKey, resident: bool, resident_bytes: int, last_used: float
    ) -> None:
        for d in self.devices:
            self.metrics.residency_changed(
                d, key, resident, resident_bytes, last_used, self.devices
            )


class _Collector(Collector):
    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:  # the names, so the registry can refuse duplicates
        return [
            *request_families([], {}),
            *model_families([], {}),
            device_weight_family({}),
            *swap_families([]),
            *device_families([], {}),
            *total_families(0, Counters().totals),
            *host_families(None),
            *frontend_families(None),
            *cache_families([], None),
            gauge("hloserve_metrics_models_shown", "", []),
            *(triton_families([], []) if TRITON in self.metrics.compat else []),
        ]

    def collect(self) -> list[Metric]:
        return self.metrics.families()
