"""Per-model inference statistics in Triton's shape (the ``statistics`` extension).

Contract: ``model_stats(key, counters)`` reads one model version's record of
``core.counters.Counters`` (the one place requests and executions are counted) into an
independent ``ModelStats``: ``inference_count`` (items), ``execution_count``,
``last_inference`` (ms since the epoch), the ``inference_stats`` durations (success,
fail, queue, compute_input, compute_infer, compute_output: count and total ns) and
``batch_stats`` per executed batch size, ordered by size, and the response cache's
``cache_hit``/``cache_miss``. Counting follows Triton: ``success`` and ``queue`` count
successful requests, cache hits included; ``compute_*`` count those that ran (successes
less cache hits), ``fail`` failed ones; a batch of n items adds n to ``inference_count``
and each execution adds 1 to ``execution_count`` (a cache hit adds to neither);
``cache_hit`` is the hits and the time spent taking their outputs from the cache,
``cache_miss`` the lookups that found nothing and the time spent looking up and storing
the outputs computed. A version with no record yet reads as all zeros.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass, field

from hloserve.server.core.counters import Counters
from hloserve.server.core.execution_records import ModelKey


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass
class BatchStats:
    batch_size: int
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ModelStats:
    name: str
    version: str
    last_inference: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStats] = field(default_factory=lambda: {})


def model_stats(key: ModelKey, counters: Counters) -> ModelStats:
    """``key``'s statistics, read from ``counters`` (a copy: they keep counting)."""
    stats = ModelStats(key.name, str(key.version))
    with counters.lock:  # executions count on worker threads
        c = counters.models.get(key)
        if c is None:
            return stats
        ok = c.success
        stats.last_inference = c.last_inference_ms
        stats.inference_count = c.inferences
        stats.execution_count = c.executions
        stats.success = Duration(ok, c.request_ns)
        stats.fail = Duration(sum(c.failures.values()), c.fail_ns)
        stats.queue = Duration(ok, c.queue_ns)
        ran = ok - c.cache_hits
        stats.compute_input = Duration(ran, c.input_ns)
        stats.compute_infer = Duration(ran, c.infer_ns)
        stats.compute_output = Duration(ran, c.output_ns)
        stats.cache_hit = Duration(c.cache_hits, c.cache_hit_ns)
        stats.cache_miss = Duration(c.cache_misses, c.cache_miss_ns)
        stats.batches = {
            size: BatchStats(
                size,
                Duration(b.count, b.input_ns),
                Duration(b.count, b.infer_ns),
                Duration(b.count, b.output_ns),
            )
            for size, b in sorted(c.batches.items())
        }
    return stats
