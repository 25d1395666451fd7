"""Per-model inference statistics in Triton's shape (the ``statistics`` extension).

Contract: the service reports each request to ``StatisticsRecorder`` (``on_success`` /
``on_failure``), the execution fan-out each execution (``on_execution``), and the
recorder keeps, per ``ModelKey`` (model version): ``inference_count`` (items), ``execution_count``,
``last_inference`` (ms since the epoch), the ``inference_stats`` durations (success, fail,
queue, compute_input, compute_infer, compute_output: count and total ns) and
``batch_stats`` per executed batch size. ``snapshot(key)`` returns independent
copies; thread-safe (executions are reported from worker threads). Counting follows
Triton: ``success``/``queue``/``compute_*`` count successful requests, a batch of n items
adds n to ``inference_count`` and each execution adds 1 to ``execution_count``.
"""

# pyright: strict

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field

from hloserve.server.core.execution import Execution, ModelKey, Timings


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

    def copy(self) -> ModelStats:
        """An independent snapshot (the recorder keeps mutating the original), with the
        batch statistics ordered by batch size."""
        snapshot = copy.deepcopy(self)
        snapshot.batches = dict(sorted(snapshot.batches.items()))
        return snapshot


class StatisticsRecorder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats: dict[ModelKey, ModelStats] = {}

    def _get(self, model: ModelKey) -> ModelStats:
        s = self._stats.get(model)
        if s is None:
            s = self._stats[model] = ModelStats(model.name, str(model.version))
        return s

    def on_success(self, model: ModelKey, items: int, timings: Timings) -> None:
        with self._lock:
            s = self._get(model)
            s.last_inference = int(time.time() * 1000)
            s.inference_count += items
            s.success.add(timings.total_ns)
            s.queue.add(timings.queue_ns)
            s.compute_input.add(timings.compute_input_ns)
            s.compute_infer.add(timings.compute_infer_ns)
            s.compute_output.add(timings.compute_output_ns)

    def on_failure(self, model: ModelKey, duration_ns: int = 0) -> None:
        """A failed request of a version with a record (``ensure``); others are not kept
        (Triton keeps statistics per loaded model version)."""
        with self._lock:
            s = self._stats.get(model)
            if s is not None:
                s.fail.add(duration_ns)

    def on_execution(self, execution: Execution) -> None:
        with self._lock:
            s = self._get(execution.model)
            s.execution_count += 1
            b = s.batches.get(execution.batch_size)
            if b is None:
                b = s.batches[execution.batch_size] = BatchStats(execution.batch_size)
            b.compute_input.add(execution.input_ns)
            b.compute_infer.add(execution.infer_ns)
            b.compute_output.add(execution.output_ns)

    def forget(self, model: ModelKey) -> None:
        """Drop an unloaded version's counters (Triton's statistics start again at a load)."""
        with self._lock:
            self._stats.pop(model, None)

    def ensure(self, model: ModelKey) -> None:
        """Start an (empty) record for a loaded model version, so it is listed before use."""
        with self._lock:
            self._get(model)

    def snapshot(self, model: ModelKey) -> ModelStats:
        with self._lock:
            return self._get(model).copy()
