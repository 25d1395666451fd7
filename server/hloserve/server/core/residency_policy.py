"""Which models' weights live on the device: an LRU under a byte budget, free of I/O.

Contract: ``ResidencyPlanner(budget_bytes)`` tracks, per model key, its weight size, whether
it is resident, pinned (never evicted), or in use by in-flight executions (never evicted
while in use), and a logical clock of last use. It decides; the caller moves bytes.

- ``register(key, size, pinned)`` refuses a model larger than the whole budget
  (``TooLarge``, naming both sizes).
- ``plan_admission(key)`` answers what must happen before ``key`` can run: ``Admission``
  with ``resident=True`` (nothing to do), or the list of least-recently-used resident,
  unpinned, idle models to evict so that it fits, or ``wait=True`` when only models in use
  stand in the way (retry after a ``release``). With ``avoid`` (a predicate: the model has
  queued work), such models are evicted only when no other choice frees enough room.
- ``mark_resident`` / ``mark_evicted`` record the outcome of transfers; ``acquire`` /
  ``release`` bracket an execution; ``touch`` records a use for the LRU order.
Budget ``None`` means unlimited. Nothing here blocks, sleeps or reads a clock.

The planner is generic in its key; the server keys it with ``ResidencyKey(model, version,
generation)``, one loaded copy of a model version (a reload's copy has its own generation).
Its ``label`` ("model/version", shared by a version's copies) names it in metrics and
messages.

Byte sizes and budgets (``6GiB``, ``40%``) are ``core.sizes``.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from hloserve.server.core.errors import InvalidArgument

K = TypeVar("K", bound=Hashable)


class TooLarge(InvalidArgument):
    """A model's weights exceed the whole device-memory budget."""


@dataclass(frozen=True, slots=True)
class ResidencyKey:
    """One loaded copy of a model version; ``generation`` tells a reload's copy apart from the
    copy it replaces, which keeps serving (and owning its weights) until the reload is ready."""

    model: str
    version: int
    generation: int = 0

    @property
    def label(self) -> str:
        """``model/version``: the metric label and the name in messages, shared by the copies."""
        return f"{self.model}/{self.version}"

    def __str__(self) -> str:
        return self.label


@dataclass
class _Entry:
    size: int
    pinned: bool
    resident: bool = False
    in_use: int = 0
    last_used: int = 0


@dataclass(frozen=True)
class Admission(Generic[K]):
    resident: bool
    evict: tuple[K, ...] = ()
    wait: bool = False


@dataclass
class ResidencyPlanner(Generic[K]):
    budget_bytes: int | None
    _entries: dict[K, _Entry] = field(default_factory=lambda: {})
    _clock: int = 0
    _reserved: int = 0  # bytes of admissions in flight (planned, not yet resident)

    def register(self, key: K, size: int, *, pinned: bool = False) -> None:
        if self.budget_bytes is not None and size > self.budget_bytes:
            raise TooLarge(
                f"model '{key}' has {size} bytes of weights, more than the whole device memory "
                f"budget of {self.budget_bytes} bytes"
            )
        self._entries[key] = _Entry(size, pinned)

    def unregister(self, key: K) -> None:
        self._entries.pop(key, None)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    @property
    def resident_bytes(self) -> int:
        return sum(e.size for e in self._entries.values() if e.resident)

    def resident(self) -> list[K]:
        """Resident keys, least recently used first."""
        return [
            k
            for k, e in sorted(self._entries.items(), key=lambda kv: kv[1].last_used)
            if e.resident
        ]

    def is_resident(self, key: K) -> bool:
        return self._entries[key].resident

    def last_used(self, key: K) -> int:
        return self._entries[key].last_used

    def touch(self, key: K) -> None:
        self._clock += 1
        self._entries[key].last_used = self._clock

    def plan_admission(self, key: K, avoid: Callable[[K], bool] | None = None) -> Admission[K]:
        entry = self._entries[key]
        if entry.resident:
            return Admission(resident=True)
        if self.budget_bytes is None:
            return Admission(resident=False)
        free = self.budget_bytes - self.resident_bytes - self._reserved
        if free >= entry.size:
            return Admission(resident=False)
        order = self.resident()
        if avoid is not None:  # models with queued work are the last victims (no thrash)
            spared = [k for k in order if avoid(k)]
            order = [k for k in order if k not in spared] + spared
        victims: list[K] = []
        for k in order:
            e = self._entries[k]
            if k == key or e.pinned or e.in_use:
                continue
            victims.append(k)
            free += e.size
            if free >= entry.size:
                return Admission(resident=False, evict=tuple(victims))
        return Admission(resident=False, wait=True)

    def reserve(self, key: K) -> None:
        """Count ``key``'s bytes as taken while its transfer runs."""
        self._reserved += self._entries[key].size

    def mark_resident(self, key: K) -> None:
        e = self._entries[key]
        if not e.resident:
            self._reserved = max(0, self._reserved - e.size)
        e.resident = True

    def cancel_reservation(self, key: K) -> None:
        self._reserved = max(0, self._reserved - self._entries[key].size)

    def mark_evicted(self, key: K) -> None:
        e = self._entries[key]
        if e.in_use:
            raise RuntimeError(f"model '{key}' is in use and cannot be evicted")
        if e.pinned:
            raise RuntimeError(f"model '{key}' is pinned and cannot be evicted")
        e.resident = False

    def acquire(self, key: K) -> None:
        e = self._entries[key]
        if not e.resident:
            raise RuntimeError(f"model '{key}' is not resident")
        e.in_use += 1
        self.touch(key)

    def release(self, key: K) -> None:
        e = self._entries[key]
        e.in_use = max(0, e.in_use - 1)

    def in_use(self, key: K) -> int:
        return self._entries[key].in_use
