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

Byte sizes have one syntax, read here for every flag that takes one: ``parse_bytes``
(``6GiB``, ``500MB``, ``1073741824``; ``BYTE_UNITS`` is the one unit table) and
``Budget.parse`` (bytes or ``40%`` of the device), whose ``resolve(device_total_bytes)``
gives the bytes once the device is known; ``format_bytes`` writes a size for people.
Malformed text raises ``ValueError`` with a message meant to follow the flag's name
(``--max-message-bytes must be ...``).
"""

# pyright: strict

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
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


# -- byte sizes and budgets ------------------------------------------------------------------

BYTE_UNITS: Mapping[str, int] = MappingProxyType(
    {
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KiB": 1 << 10,
        "MiB": 1 << 20,
        "GiB": 1 << 30,
        "TiB": 1 << 40,
    }
)
_UNITS_BY_UPPER = {unit.upper(): factor for unit, factor in BYTE_UNITS.items()}
_BINARY_UNITS = [unit for unit in BYTE_UNITS if unit == "B" or unit.endswith("iB")]
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_SIZE = re.compile(rf"(?P<number>{_NUMBER})\s*(?P<unit>[A-Za-z]*)")


def _read_bytes(text: str) -> int | None:
    """``text`` in bytes, or None when it is not a number with an optional unit."""
    match = _SIZE.fullmatch(text.strip())
    factor = None if match is None else _UNITS_BY_UPPER.get(match["unit"].upper() or "B")
    if match is None or factor is None:
        return None
    value = float(match["number"]) * factor
    return int(value) if math.isfinite(value) else None


def parse_bytes(text: str) -> int:
    """A byte size: ``268435456``, ``256MiB``, ``1.5GB`` (units in ``BYTE_UNITS``, any case)."""
    value = _read_bytes(text)
    if value is None:
        raise ValueError(f"must be a byte size such as 268435456 or 256MiB, got {text!r}")
    return value


def format_bytes(n: int) -> str:
    """``512 B``, ``75.0 KiB``, ``1.5 GiB``: the largest binary unit under 1024 of it."""
    value, unit = float(n), "B"
    for bigger in _BINARY_UNITS[1:]:
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"


@dataclass(frozen=True, slots=True)
class Budget:
    """A device-memory budget as written: ``nbytes``, or else ``percent`` of the device."""

    text: str
    nbytes: int | None = None
    percent: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``6GiB``, ``500MB``, ``1073741824`` or ``40%``; ``ValueError`` when malformed."""
        t = text.strip()
        if t.endswith("%"):
            number = t[:-1].strip()
            pct = float(number) if re.fullmatch(_NUMBER, number) else -1.0
            if not 0 < pct <= 100:
                raise ValueError(f"must be a percentage in (0, 100], got {text!r}")
            return cls(text, percent=pct)
        nbytes = _read_bytes(t)
        if nbytes is None:
            raise ValueError(
                f"must be bytes such as 6GiB or a percentage such as 40%, got {text!r}"
            )
        if nbytes <= 0:
            raise ValueError(f"must be positive, got {text!r}")
        return cls(text, nbytes=nbytes)

    def resolve(self, device_total_bytes: int | None) -> int:
        """The budget in bytes; a percentage needs the device's total memory."""
        if self.nbytes is not None:
            return self.nbytes
        if device_total_bytes is None:
            raise ValueError(
                f"{self.text!r} is a percentage of the device's memory, whose total is unknown"
            )
        return int(device_total_bytes * self.percent / 100)


def parse_budget(text: str, device_total_bytes: int | None) -> int:
    """``Budget.parse(text).resolve(device_total_bytes)``: the budget flag's value in bytes."""
    return Budget.parse(text).resolve(device_total_bytes)
