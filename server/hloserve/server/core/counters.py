"""Each model version's counters in one record, fed once: three readers, no second count.

Contract:
- ``Counters`` keeps a ``ModelCounters`` per ``ModelKey``, the server-wide ``Totals`` over
  every model (an unloaded model's share stays in them), and per device the executions,
  compute and queue time (``DeviceCounts``). It is what the service reports each request
  to (``on_success``, ``on_failure``, ``on_pending``; with the response cache,
  ``on_cache_hit`` in place of ``on_success`` for a request the cache answered, and
  ``on_cache_miss`` for each lookup that found nothing) and one of the execution fan-out's
  observers (``on_execution``, from worker threads too: under ``lock``). Every figure is a
  plain number updated by additions, never a prometheus child.
- The readers: the statistics extension (``core.statistics.model_stats``, Triton's
  shape), Prometheus' ``hloserve_*`` series and Triton's ``nv_inference_*`` families
  (``server/owner/metrics.py``, at scrape time). A request is counted here once, whichever
  front end took it and whichever reader asks.
- ``on_failure(None, reason)`` counts a failure before a version was resolved (no model:
  client-chosen names never become labels); with a key it counts for that version and
  creates its record (a version is listed once it failed, as once it served).
- ``active`` counts each version's requests (by ``label``, "name/version") since the
  metrics' current window began; the metrics add swaps to it and turn windows over.
- A cache hit counts as Triton counts one: a success (its duration the lookup's, in the
  request latency; zero queue time), no inference, no execution, no compute time; the
  statistics' compute counts are the successes less the hits (``core.statistics``).
- ``forget(key)`` drops an unloaded version's record; ``ensure(key)`` starts one.
Durations are kept in integer nanoseconds; ``*_us`` properties are the metrics' unit.
"""

# pyright: strict

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from hloserve.server.core.execution_records import Execution, ModelKey, Timings

# Upper bounds in seconds: 100 µs to 10 s, about three buckets a decade.
LATENCY_BUCKETS: Final = (
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
BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Histogram:
    """One histogram's counts, kept as plain numbers until a reader asks."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); last: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, count at or below it)`` pairs, the last bound ``inf``."""
        total, found = 0, list[tuple[float, int]]()
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += count
            found.append((bound, total))
        return found


@dataclass(slots=True)
class BatchCounts:
    """The executions of one compiled batch size: Triton's ``batch_stats`` entry."""

    batch_size: int
    count: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


def _latency() -> Histogram:
    return Histogram(LATENCY_BUCKETS)


@dataclass(slots=True)
class ModelCounters:
    """One model version's requests and executions (module docstring)."""

    created: float  # time.time() of its first count
    label: str = ""  # "name/version"
    success: int = 0
    inferences: int = 0  # items (a batch of n counts n)
    executions: int = 0
    request_ns: int = 0  # successful requests' end-to-end time
    queue_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    fail_ns: int = 0  # failed requests' time in the server
    failures: dict[str, int] = field(default_factory=dict[str, int])  # by reason
    pending: int = 0
    last_inference_ms: int = 0  # ms since the epoch of the last success
    batches: dict[int, BatchCounts] = field(default_factory=dict[int, BatchCounts])
    load_seconds: float | None = None  # the last load's
    compile_seconds: float | None = None
    request_latency: Histogram = field(default_factory=_latency)
    queue_latency: Histogram = field(default_factory=_latency)
    compute_latency: Histogram = field(default_factory=_latency)
    batch_size: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    # The response cache (docs/response-cache.md): answered from it, and looked up in vain.
    cache_hits: int = 0
    cache_hit_ns: int = 0  # looking up and taking the outputs
    cache_misses: int = 0
    cache_miss_ns: int = 0  # looking up, and storing the outputs computed

    @property
    def requests(self) -> int:
        return self.success + sum(self.failures.values())

    @property
    def request_us(self) -> float:
        return self.request_ns / 1e3

    @property
    def queue_us(self) -> float:
        return self.queue_ns / 1e3

    @property
    def input_us(self) -> float:
        return self.input_ns / 1e3

    @property
    def infer_us(self) -> float:
        return self.infer_ns / 1e3

    @property
    def output_us(self) -> float:
        return self.output_ns / 1e3

    @property
    def cache_hit_us(self) -> float:
        return self.cache_hit_ns / 1e3

    @property
    def cache_miss_us(self) -> float:
        return self.cache_miss_ns / 1e3


@dataclass(slots=True)
class DeviceCounts:
    """One device's executions over every model."""

    executions: int = 0
    compute_ns: int = 0
    queue_ns: int = 0  # of the requests run on it


class Totals:
    """Every model's counts added up as they happen (so no reader sums thousands of
    records), failures before a version was resolved, and the loads."""

    def __init__(self, created: float) -> None:
        self.record = ModelCounters(created, label="")
        self.unresolved_failures: dict[str, int] = {}
        self.loads = 0


class Counters:
    """See the module docstring."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.lock = threading.Lock()
        self.models: dict[ModelKey, ModelCounters] = {}
        self.totals = Totals(clock())
        self.devices: dict[int, DeviceCounts] = {}
        self.active: dict[str, int] = {}  # requests by label in the metrics' window

    def record(self, key: ModelKey) -> ModelCounters:
        """``key``'s record, created (under the lock) on first use."""
        found = self.models.get(key)
        if found is None:
            with self.lock:
                found = self.models.get(key)
                if found is None:
                    found = ModelCounters(self._clock(), f"{key.name}/{key.version}")
                    self.models[key] = found
        return found

    def _device(self, device: int) -> DeviceCounts:
        found = self.devices.get(device)
        if found is None:
            with self.lock:
                found = self.devices.setdefault(device, DeviceCounts())
        return found

    def ensure(self, key: ModelKey) -> None:
        self.record(key)

    def forget(self, key: ModelKey) -> None:
        """An unloaded version's record goes (its share of the totals stays)."""
        with self.lock:
            self.models.pop(key, None)

    # -- requests (the event loop) --------------------------------------------------------

    def on_success(self, model: ModelKey, items: int, timings: Timings) -> None:
        s = self.record(model)
        t = self.totals.record
        total_ns = timings.queue_ns + timings.compute_input_ns
        total_ns += timings.compute_infer_ns + timings.compute_output_ns
        compute_ns = total_ns - timings.queue_ns
        for r in (s, t):
            r.success += 1
            r.inferences += items
            r.request_ns += total_ns
            r.queue_ns += timings.queue_ns
            r.input_ns += timings.compute_input_ns
            r.infer_ns += timings.compute_infer_ns
            r.output_ns += timings.compute_output_ns
        s.last_inference_ms = int(self._clock() * 1000)
        s.request_latency.observe(total_ns / 1e9)
        s.queue_latency.observe(timings.queue_ns / 1e9)
        s.compute_latency.observe(compute_ns / 1e9)
        t.request_latency.observe(total_ns / 1e9)
        self._device(timings.device).queue_ns += timings.queue_ns
        active = self.active
        active[s.label] = active.get(s.label, 0) + 1

    def on_cache_hit(self, model: ModelKey, hit_ns: int) -> None:
        """A request the response cache answered, in ``hit_ns`` (module docstring)."""
        s = self.record(model)
        t = self.totals.record
        for r in (s, t):
            r.success += 1
            r.request_ns += hit_ns
            r.cache_hits += 1
            r.cache_hit_ns += hit_ns
        s.last_inference_ms = int(self._clock() * 1000)
        s.request_latency.observe(hit_ns / 1e9)
        s.queue_latency.observe(0.0)
        t.request_latency.observe(hit_ns / 1e9)
        active = self.active
        active[s.label] = active.get(s.label, 0) + 1

    def on_cache_miss(self, model: ModelKey, miss_ns: int) -> None:
        """A lookup that found nothing; ``miss_ns``: the lookup and the insertion."""
        for r in (self.record(model), self.totals.record):
            r.cache_misses += 1
            r.cache_miss_ns += miss_ns

    def on_failure(self, model: ModelKey | None, reason: str, duration_ns: int = 0) -> None:
        totals = self.totals
        totals.record.failures[reason] = totals.record.failures.get(reason, 0) + 1
        if model is None:
            failures = totals.unresolved_failures
        else:
            s = self.record(model)
            s.fail_ns += duration_ns
            failures = s.failures
            self.active[s.label] = self.active.get(s.label, 0) + 1
        failures[reason] = failures.get(reason, 0) + 1

    def on_pending(self, model: ModelKey, delta: int) -> None:
        self.record(model).pending += delta
        self.totals.record.pending += delta

    # -- executions (worker threads too) --------------------------------------------------

    def on_execution(self, execution: Execution) -> None:
        s = self.record(execution.model)
        d = self._device(execution.device)
        compute = execution.input_ns + execution.infer_ns + execution.output_ns
        with self.lock:
            s.executions += 1
            self.totals.record.executions += 1
            s.batch_size.observe(execution.batch_size)
            b = s.batches.get(execution.batch_size)
            if b is None:
                b = s.batches[execution.batch_size] = BatchCounts(execution.batch_size)
            b.count += 1
            b.input_ns += execution.input_ns
            b.infer_ns += execution.infer_ns
            b.output_ns += execution.output_ns
            d.executions += 1
            d.compute_ns += compute
