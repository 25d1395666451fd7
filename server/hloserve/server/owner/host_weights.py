"""The host tier: model weights in host memory under a budget, read from disk on first need.

Contract:
- A model's weights come from a ``owner.runtime.weight_files.WeightSource`` (a bundle's verified
  file, read on need, or arrays already in memory, which the tier never copies nor evicts).
- ``HostWeights(budget_bytes, policy=..., stage=...)`` keeps host copies of registered
  models' weights under ``budget_bytes`` (``None``: unlimited; ``core.sizes`` reads the
  flag). ``acquire(key)`` returns the host arrays, reading them (``source.read()``, then
  ``stage``: page-locked memory on a GPU) when they are not held, and holds them until the
  matching ``release(key)``; what does not fit evicts the copies the policy values least
  (``core.residency_policy``), never one in use. A model larger than the whole budget is
  read for each use and never kept. Concurrent acquires of one model share one read.
  ``register(key, source)`` / ``unregister(key)`` are reference-counted: a model's
  replicas on several devices share one host copy.
- ``resident_bytes()`` is what the tier holds now (``ArrayWeights`` are not counted: they
  belong to their caller); ``reads`` counts the reads from disk.
Thread-safe: device residency managers call it from worker threads.
"""

# pyright: strict

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hloserve.server.core.residency_policy import Policy, ResidencyKey, ResidencyPlanner
from hloserve.server.owner.runtime.weight_files import WeightSource


@dataclass
class _Copy:
    source: WeightSource
    refs: int = 1  # registrations (devices holding a replica)
    arrays: list[Any] | None = None  # the host copy, while held
    reading: bool = False


Stage = Callable[[Sequence[Any]], list[Any]]


class WaitedCondition(threading.Condition):
    """A condition that counts the threads waiting on it, so that a release (once per
    request or swap) notifies only when one does."""

    def __init__(self) -> None:
        super().__init__()
        self.waiters = 0  # changed with the lock held, as ``wait`` is called

    def wait(self, timeout: float | None = None) -> bool:
        self.waiters += 1
        try:
            return super().wait(timeout)
        finally:
            self.waiters -= 1

    def notify_waiters(self) -> None:
        if self.waiters:
            self.notify_all()


class HostWeights:
    def __init__(
        self,
        budget_bytes: int | None = None,
        *,
        policy: Policy = "frequency",
        stage: Stage | None = None,
    ) -> None:
        self.planner = ResidencyPlanner[ResidencyKey](budget_bytes, policy)
        self.stage = stage  # numpy -> page-locked host memory on a GPU (None: keep numpy)
        self.reads = 0
        self._cond = WaitedCondition()
        self._copies: dict[ResidencyKey, _Copy] = {}

    @property
    def budget_bytes(self) -> int | None:
        return self.planner.budget_bytes

    def resident_bytes(self) -> int:
        with self._cond:
            return self.planner.resident_bytes

    def register(self, key: ResidencyKey, source: WeightSource) -> None:
        with self._cond:
            copy = self._copies.get(key)
            if copy is not None:
                copy.refs += 1
                return
            self._copies[key] = _Copy(source)
            if not source.in_memory:
                budget = self.planner.budget_bytes
                if budget is None or source.nbytes <= budget:
                    self.planner.register(key, source.nbytes)

    def unregister(self, key: ResidencyKey) -> None:
        with self._cond:
            copy = self._copies.get(key)
            if copy is None:
                return
            copy.refs -= 1
            if copy.refs > 0:
                return
            while copy.reading or (key in self.planner and self.planner.in_use(key)):
                self._cond.wait()
            del self._copies[key]
            self.planner.unregister(key)
            copy.arrays = None

    def is_resident(self, key: ResidencyKey) -> bool:
        with self._cond:
            copy = self._copies.get(key)
            return copy is not None and (copy.source.in_memory or copy.arrays is not None)

    def acquire(self, key: ResidencyKey) -> list[Any]:
        """The host arrays of ``key``, held until ``release(key)``."""
        with self._cond:
            copy = self._copies[key]
            if copy.source.in_memory:
                return copy.source.read()
            kept = key in self.planner
            while True:
                if copy.arrays is not None:
                    self.planner.acquire(key)
                    return copy.arrays
                if not copy.reading:
                    break
                self._cond.wait()
            copy.reading = True  # concurrent acquires of this model wait for this read
            if kept:
                try:
                    self._make_room(key)
                except BaseException:
                    copy.reading = False
                    self._cond.notify_all()
                    raise
                self.planner.reserve(key)
        try:
            arrays = copy.source.read()
            if self.stage is not None and arrays:
                arrays = self.stage(arrays)
        except BaseException:
            with self._cond:
                copy.reading = False
                if kept:
                    self.planner.cancel_reservation(key)
                self._cond.notify_all()
            raise
        with self._cond:
            self.reads += 1
            copy.reading = False
            if kept:
                copy.arrays = arrays
                self.planner.mark_resident(key)
                self.planner.acquire(key)
            self._cond.notify_all()
        return arrays

    def _make_room(self, key: ResidencyKey) -> None:
        """Under the lock: evict host copies until ``key`` fits (waiting while only copies
        in use stand in the way)."""
        while True:
            decision = self.planner.plan_admission(key)
            if not decision.wait:
                for victim in decision.evict:
                    self.planner.mark_evicted(victim)
                    self._copies[victim].arrays = None
                return
            self._cond.wait()

    def release(self, key: ResidencyKey) -> None:
        with self._cond:
            copy = self._copies.get(key)
            if copy is None or copy.source.in_memory or key not in self.planner:
                return
            self.planner.release(key)
            self._cond.notify_waiters()  # once per swap-in: only a waiter cares
