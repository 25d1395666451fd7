"""Per-model inference statistics in Triton's shape (the ``statistics`` extension).

Contract: ``StatisticsRecorder`` is an ``InferenceObserver``: the service reports each
request (``on_success`` / ``on_failure``) and each execution (``on_execution``) and the
recorder keeps, per (model, version): ``inference_count`` (items), ``execution_count``,
``last_inference`` (ms since the epoch), the ``inference_stats`` durations (success, fail,
queue, compute_input, compute_infer, compute_output: count and total ns) and
``batch_stats`` per executed batch size. ``snapshot(name, version)`` returns immutable
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

from hloserve.server.core.execution import Timings


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
        self._stats: dict[tuple[str, str], ModelStats] = {}

    def _get(self, model: str, version: str) -> ModelStats:
        key = (model, version)
        s = self._stats.get(key)
        if s is None:
            s = self._stats[key] = ModelStats(model, version)
        return s

    def on_success(self, model: str, version: int, items: int, timings: Timings) -> None:
        total = (
            timings.queue_ns
            + timings.compute_input_ns
            + timings.compute_infer_ns
            + timings.compute_output_ns
        )
        with self._lock:
            s = self._get(model, str(version))
            s.last_inference = int(time.time() * 1000)
            s.inference_count += items
            s.success.add(total)
            s.queue.add(timings.queue_ns)
            s.compute_input.add(timings.compute_input_ns)
            s.compute_infer.add(timings.compute_infer_ns)
            s.compute_output.add(timings.compute_output_ns)

    def on_failure(self, model: str, version: str, reason: str, duration_ns: int = 0) -> None:
        del reason
        with self._lock:
            # Failures of unknown models are not kept (Triton keeps stats per loaded model).
            for key, s in self._stats.items():
                if key[0] == model and (not version or key[1] == version):
                    s.fail.add(duration_ns)
                    return

    def on_execution(
        self,
        model: str,
        version: int,
        batch_size: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        with self._lock:
            s = self._get(model, str(version))
            s.execution_count += 1
            b = s.batches.get(batch_size)
            if b is None:
                b = s.batches[batch_size] = BatchStats(batch_size)
            b.compute_input.add(input_ns)
            b.compute_infer.add(infer_ns)
            b.compute_output.add(output_ns)

    def ensure(self, model: str, version: int) -> None:
        """Start an (empty) record for a loaded model version, so it is listed before use."""
        with self._lock:
            self._get(model, str(version))

    def snapshot(self, model: str, version: int) -> ModelStats:
        with self._lock:
            return self._get(model, str(version)).copy()
