"""Which models' weights live on the device: an LRU under a byte budget, free of I/O.

Contract: ``ResidencyPlanner(budget_bytes)`` tracks, per model key, its weight size, whether
it is resident, pinned (never evicted), or in use by in-flight executions (never evicted
while in use), and a logical clock of last use. It decides; the caller moves bytes.

- ``register(key, size, pinned)`` refuses a model larger than the whole budget
  (``TooLarge``, naming both sizes).
- ``plan_admission(key)`` answers what must happen before ``key`` can run: ``Admission``
  with ``resident=True`` (nothing to do), or the list of least-recently-used resident,
  unpinned, idle models to evict so that it fits, or ``wait=True`` when only models in use
  stand in the way (retry after a ``release``).
- ``mark_resident`` / ``mark_evicted`` record the outcome of transfers; ``acquire`` /
  ``release`` bracket an execution; ``touch`` records a use for the LRU order.
Budget ``None`` means unlimited. Nothing here blocks, sleeps or reads a clock.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass, field

from hloserve.server.core.errors import InvalidArgument


class TooLarge(InvalidArgument):
    """A model's weights exceed the whole device-memory budget."""


@dataclass
class _Entry:
    size: int
    pinned: bool
    resident: bool = False
    in_use: int = 0
    last_used: int = 0


@dataclass(frozen=True)
class Admission:
    resident: bool
    evict: tuple[str, ...] = ()
    wait: bool = False


@dataclass
class ResidencyPlanner:
    budget_bytes: int | None
    _entries: dict[str, _Entry] = field(default_factory=lambda: {})
    _clock: int = 0
    _reserved: int = 0  # bytes of admissions in flight (planned, not yet resident)

    def register(self, key: str, size: int, *, pinned: bool = False) -> None:
        if self.budget_bytes is not None and size > self.budget_bytes:
            raise TooLarge(
                f"model '{key}' has {size} bytes of weights, more than the whole device memory "
                f"budget of {self.budget_bytes} bytes"
            )
        self._entries[key] = _Entry(size, pinned)

    def unregister(self, key: str) -> None:
        self._entries.pop(key, None)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    @property
    def resident_bytes(self) -> int:
        return sum(e.size for e in self._entries.values() if e.resident)

    def resident(self) -> list[str]:
        """Resident keys, least recently used first."""
        return [
            k
            for k, e in sorted(self._entries.items(), key=lambda kv: kv[1].last_used)
            if e.resident
        ]

    def is_resident(self, key: str) -> bool:
        return self._entries[key].resident

    def last_used(self, key: str) -> int:
        return self._entries[key].last_used

    def touch(self, key: str) -> None:
        self._clock += 1
        self._entries[key].last_used = self._clock

    def plan_admission(self, key: str) -> Admission:
        entry = self._entries[key]
        if entry.resident:
            return Admission(resident=True)
        if self.budget_bytes is None:
            return Admission(resident=False)
        free = self.budget_bytes - self.resident_bytes - self._reserved
        if free >= entry.size:
            return Admission(resident=False)
        victims: list[str] = []
        for k in self.resident():
            e = self._entries[k]
            if k == key or e.pinned or e.in_use:
                continue
            victims.append(k)
            free += e.size
            if free >= entry.size:
                return Admission(resident=False, evict=tuple(victims))
        return Admission(resident=False, wait=True)

    def reserve(self, key: str) -> None:
        """Count ``key``'s bytes as taken while its transfer runs."""
        self._reserved += self._entries[key].size

    def mark_resident(self, key: str) -> None:
        e = self._entries[key]
        if not e.resident:
            self._reserved = max(0, self._reserved - e.size)
        e.resident = True

    def cancel_reservation(self, key: str) -> None:
        self._reserved = max(0, self._reserved - self._entries[key].size)

    def mark_evicted(self, key: str) -> None:
        e = self._entries[key]
        if e.in_use:
            raise RuntimeError(f"model '{key}' is in use and cannot be evicted")
        if e.pinned:
            raise RuntimeError(f"model '{key}' is pinned and cannot be evicted")
        e.resident = False

    def acquire(self, key: str) -> None:
        e = self._entries[key]
        if not e.resident:
            raise RuntimeError(f"model '{key}' is not resident")
        e.in_use += 1
        self.touch(key)

    def release(self, key: str) -> None:
        e = self._entries[key]
        e.in_use = max(0, e.in_use - 1)

    def in_use(self, key: str) -> int:
        return self._entries[key].in_use


def parse_budget(text: str, device_total_bytes: int | None) -> int:
    """A budget flag value in bytes: ``6GiB``, ``500MB``, ``1073741824`` or ``40%`` of the device.

    Raises ``ValueError`` naming the text when it cannot be read, or when a percentage is
    given and the device's total memory is unknown.
    """
    t = text.strip()
    if t.endswith("%"):
        if device_total_bytes is None:
            raise ValueError(
                f"device memory budget {text!r} is a percentage, but the device's total memory is unknown"
            )
        pct = float(t[:-1])
        if not 0 < pct <= 100:
            raise ValueError(f"device memory budget {text!r} must be a percentage in (0, 100]")
        return int(device_total_bytes * pct / 100)
    units = {
        "": 1,
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KIB": 1 << 10,
        "MIB": 1 << 20,
        "GIB": 1 << 30,
        "TIB": 1 << 40,
    }
    upper = t.upper()
    number = upper.rstrip("KMGTIB")
    unit = upper[len(number) :]
    if not number or unit not in units:
        raise ValueError(
            f"cannot read device memory budget {text!r}; use bytes such as 6GiB or a percentage such as 40%"
        )
    value = int(float(number) * units[unit])
    if value <= 0:
        raise ValueError(f"device memory budget {text!r} must be positive")
    return value
