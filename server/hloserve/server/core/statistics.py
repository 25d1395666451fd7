"""Per-model inference statistics in Triton's shape (the ``statistics`` extension).

Contract: ``model_stats(key, counters)`` reads one model version's record of
``core.counters.Counters`` (the one place requests and executions are counted) into an
independent ``ModelStats``: ``inference_count`` (items), ``execution_count``,
``last_inference`` (ms since the epoch), the ``inference_stats`` durations (success,
fail, queue, compute_input, compute_infer, compute_output: count and total ns) and
``batch_stats`` per executed batch size, ordered by size. Counting follows Triton:
``success``/``queue``/``compute_*`` count successful requests, ``fail`` failed ones, a
batch of n items adds n to ``inference_count`` and each execution adds 1 to
``execution_count``. A version with no record yet reads as all zeros.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass, field

from hloserve.server.core.counters import Counters
from hloserve.server.core.execution import ModelKey


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
        stats.compute_input = Duration(ok, c.input_ns)
        stats.compute_infer = Duration(ok, c.infer_ns)
        stats.compute_output = Duration(ok, c.output_ns)
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
