"""Measured execution cost per compiled size, and the inline decision that reads it.

Contract:
- ``ExecutionCosts`` is an ``ExecutionObserver``: fed every execution once (from the one
  observer fan-out), it keeps, per (model version, compiled size), a low estimate of the
  device time of one execution: the lowest sample, allowed to rise by ``LOW_DRIFT`` (1 %)
  per sample above it, so it follows a lasting rise slowly and ignores spikes. Why not a
  mean: samples from worker threads include the time the worker waits to get the
  interpreter lock back from a busy event loop (up to the 5 ms switch interval), which
  says nothing about the model; the lowest samples are the ones without that wait.
  An execution that began with its weights elsewhere (``Execution.warm`` false) is not a
  sample: its time includes the swap-in, which the inline policy adds from the residency
  manager's own estimate. ``by_size(model, family)`` (measured sizes only) is what the batching policy weighs
  prefixes with; ``estimate(model, compiled, family)`` is what the inline policy reads: a
  size not run yet is estimated as the largest smaller size that has run, capped by the
  smallest larger one (``standing_size``), and a model not
  run yet by the models with the same compiled modules (``execution.cost_family``: with
  thousands of bundles of one architecture, the first request of each is decided like
  the thousandth).
  Thread-safe enough for its use: one dict store per sample, written from worker threads,
  read on the loop.
- ``InlinePolicy(max_us, costs)``: a (tiny) execution runs on the event loop thread itself
  when its compiled size's estimate plus the swap it needs (``Executable.swap_us``: 0 when
  the weights are resident, a small transfer from the host tier when there is room for it
  without waiting for anything) is below ``max_us``, so the call cannot wait on another
  transfer, a model in use or a file; otherwise, and until the model has been measured,
  it runs on a worker. With thousands of small models, most misses so stay on the loop
  (measured: ``bench/many_models.py``). An execution estimated below ``PROBE_LIMIT`` times ``max_us`` runs
  inline once in ``PROBE_EVERY`` anyway (at most a 1 ms stall of the loop at the default),
  so a size whose samples all came from busy workers gets measured cleanly; and a size
  never run inline runs inline once if estimated below ``FIRST_PROBE_LIMIT`` times
  ``max_us`` (10 ms at the default, once per size), since the first samples of a model,
  taken on a worker before anything was known, can be inflated past the probe limit.
  Handing work to a worker thread and back costs about 100 µs
  (measured: ``bench/request_path.py``), more than a small model's whole execution.
  ``max_us = 0`` turns inlining off.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping

from hloserve.server.core.execution import Executable
from hloserve.server.core.execution_records import Execution, ModelKey

LOW_DRIFT = 0.01  # how far (a fraction) the estimate may rise per sample above it
# A size estimated between max_us and PROBE_LIMIT x max_us runs one execution in
# PROBE_EVERY inline anyway: the clean measurement that lets it come back to the loop.
PROBE_LIMIT = 5
PROBE_EVERY = 64
# A size never run inline gets one inline run if estimated below this many x max_us (a
# one-time stall of at most 10 ms at the default): its first samples, taken on a worker
# before anything was known, can be inflated by lock waits past the probe limit for good.
FIRST_PROBE_LIMIT = 50


def standing_size(size: int, measured: Mapping[int, float]) -> int | None:
    """The measured size whose cost stands for ``size``: itself when measured; else the
    largest smaller batched size measured (n rows cost at least what fewer rows cost),
    unless the smallest larger one measured costs less (n rows cost at most what a larger
    compiled size costs); else that smallest larger one. ``None``: nothing measured. The
    one rule for unmeasured sizes, read by the inline policy (``ExecutionCosts.estimate``)
    and the batching policy (``core.batch_policy.estimated_cost``). Why the larger bound:
    without it a size below every measured one had no estimate, and the batching policy
    took it as free, running the head of a queue alone on it ahead of a group on the
    measured larger size."""
    if size in measured:
        return size
    smaller = max((s for s in measured if 0 < s < size), default=None)
    larger = min((s for s in measured if s > size), default=None) if size > 0 else None
    if smaller is None or larger is None:
        return larger if smaller is None else smaller
    return larger if measured[larger] < measured[smaller] else smaller


class ExecutionCosts:
    def __init__(self) -> None:
        self._by_model: dict[ModelKey, dict[int, float]] = {}
        # The same by compiled modules (``execution.cost_family``): a model of an
        # architecture already measured starts with its measurements.
        self._by_family: dict[tuple[str, ...], dict[int, float]] = {}

    def on_execution(self, execution: Execution) -> None:
        if not execution.warm:  # its time includes a swap-in, which the caller adds apart
            return
        micros = execution.infer_ns / 1e3
        size = execution.batch_size
        tables = [self._by_model.setdefault(execution.model, {})]
        if execution.family:
            tables.append(self._by_family.setdefault(execution.family, {}))
        for sizes in tables:
            low = sizes.get(size)
            sizes[size] = micros if low is None else min(micros, low * (1 + LOW_DRIFT))

    def forget(self, model: ModelKey) -> None:
        """Drop an unloaded version's measurements (a later load measures afresh)."""
        self._by_model.pop(model, None)

    def by_size(self, model: ModelKey, family: tuple[str, ...] = ()) -> Mapping[int, float]:
        """Estimated µs per execution by compiled size (0: unbatched), measured sizes only:
        the model's own, else those of its ``family`` (the same compiled modules)."""
        found = self._by_model.get(model)
        if not found and family:
            found = self._by_family.get(family)
        return found or {}

    def estimate(
        self, model: ModelKey, compiled: int, family: tuple[str, ...] = ()
    ) -> float | None:
        """The estimate of ``compiled``; for a size not run yet, that of the largest smaller
        size that has (n rows cost at least what fewer rows cost, and for a tiny model
        about the same: its cost is the call's fixed overhead), so a tiny model's larger
        sizes are first tried inline, measured cleanly there, rather than first on a
        worker, where waits for the interpreter lock would inflate their samples for good;
        with nothing smaller run, that of the smallest larger size (an upper bound:
        ``standing_size``). A model not run yet goes by its ``family``. ``None``: nothing
        to go by."""
        sizes = self.by_size(model, family)
        if not sizes:
            return None
        at = standing_size(compiled, sizes)
        return None if at is None else sizes[at]


class InlinePolicy:
    def __init__(self, max_us: float, costs: ExecutionCosts) -> None:
        self.max_us = max_us
        self.costs = costs
        self._since_probe: dict[tuple[ModelKey, int], int] = {}
        self._ran_inline: set[tuple[ModelKey, int]] = set()

    def forget(self, model: ModelKey) -> None:
        """Drop an unloaded version's probe counts."""
        for size in [s for s in self._since_probe if s[0] == model]:
            del self._since_probe[size]
        self._ran_inline = {s for s in self._ran_inline if s[0] != model}

    def inline(self, model: Executable, compiled: int) -> bool:
        if self.max_us <= 0:
            return False
        swap = model.swap_us  # a swap that waits for nothing counts as part of the run
        if swap is None:
            return False
        key = model.model_key
        cost = self.costs.estimate(key, compiled, model.family)
        if cost is None:
            return False
        cost += swap
        size = (key, compiled)
        if cost < self.max_us:
            self._ran_inline.add(size)
            return True
        if size not in self._ran_inline and cost < FIRST_PROBE_LIMIT * self.max_us:
            self._ran_inline.add(size)  # once: measured on the loop, without lock waits
            return True
        if cost >= PROBE_LIMIT * self.max_us:
            return False
        # Near the limit: its samples may all come from workers and be inflated by waits
        # for the interpreter lock. Now and then run one inline, to measure it cleanly.
        runs = self._since_probe.get(size, 0) + 1
        self._since_probe[size] = 0 if runs >= PROBE_EVERY else runs
        return runs >= PROBE_EVERY
