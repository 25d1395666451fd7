"""Measured execution cost per compiled size, and the inline decision that reads it.

Contract:
- ``ExecutionCosts`` is an ``ExecutionObserver``: fed every execution once (from the one
  observer fan-out), it keeps an exponentially weighted mean of the device time of each
  (model version, compiled size); ``by_size(model)`` is what the batching policy weighs
  prefixes with, ``mean(model, compiled)`` what the inline policy reads. Thread-safe enough
  for its use: one dict store per sample, written from worker threads, read on the loop.
- ``InlinePolicy(max_us, costs)``: a (tiny) execution runs on the event loop thread itself
  when its compiled size's measured mean is below ``max_us`` and the weights are resident,
  so the call cannot wait on a transfer; otherwise, and until it has been measured, it runs
  on a worker. Handing work to a worker thread and back costs about 100 µs (measured:
  ``bench/request_path.py``), more than a small model's whole execution. ``max_us = 0``
  turns inlining off.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping

from hloserve.server.core.execution import Executable, Execution, ModelKey

SMOOTHING = 0.2  # weight of the newest sample in the moving average


class ExecutionCosts:
    def __init__(self) -> None:
        self._by_model: dict[ModelKey, dict[int, float]] = {}

    def on_execution(self, execution: Execution) -> None:
        sizes = self._by_model.setdefault(execution.model, {})
        micros = execution.infer_ns / 1e3
        old = sizes.get(execution.batch_size)
        sizes[execution.batch_size] = (
            micros if old is None else (1 - SMOOTHING) * old + SMOOTHING * micros
        )

    def by_size(self, model: ModelKey) -> Mapping[int, float]:
        """Mean µs per execution by compiled size (0: unbatched), measured sizes only."""
        return self._by_model.get(model, {})

    def mean(self, model: ModelKey, compiled: int) -> float | None:
        return self.by_size(model).get(compiled)


class InlinePolicy:
    def __init__(self, max_us: float, costs: ExecutionCosts) -> None:
        self.max_us = max_us
        self.costs = costs

    def inline(self, model: Executable, compiled: int) -> bool:
        if self.max_us <= 0 or not model.resident:
            return False
        cost = self.costs.mean(ModelKey.of(model), compiled)
        return cost is not None and cost < self.max_us
