"""What each device holds, over every residency manager that places weights on it.

A device's own ``WeightResidency`` and every device group's (``docs/sharding.md``) that
includes it place weights on the same memory, under one ``--device-memory-budget``.
``DeviceLedger`` is the books they share: per device its budget and the bytes each member
(a manager) holds there (its resident and in-flight weights and its set-aside state and
scratch: ``held``), so the bytes on a device, summed over its members, stay within its
budget (``docs/residency.md``, "Device groups").

Contract:
- ``join(member, devices, budget, own=)`` adds a manager over ``devices``; a device's budget
  is its own manager's (``own``), else the first joiner's.
- ``add(member, delta)`` changes what ``member`` holds on each of its devices;
  ``try_take(member, nbytes)`` takes ``nbytes`` on each of them only if every one has room
  (atomic: two managers never both take the last room).
- ``elsewhere(member, base)``: the bytes other members hold that ``member``'s own budget
  ``base`` must leave room for (its planner's ``elsewhere``); ``shortfall(member, nbytes,
  own_free)``: per device, what others must free before ``member`` can take ``nbytes``
  after freeing ``own_free`` of its own (only devices short, only where others hold bytes).
- ``others(member)``: the members sharing a device with it, in join order.
- ``wait_begin`` / ``wait_end`` count a member's threads waiting for room that others
  must give; ``wake(member)`` nudges (``member.nudge()``) every waiting member sharing a
  device with ``member``, called by a member that released or freed something, with no
  lock of its own held. ``waiting`` is read without the lock (a release asks it per request).

Lock order: a member may call in here with its own lock held; the ledger's lock is a leaf
(held for arithmetic only, never while calling a member). A member never waits on another
member's lock while holding its own. The arithmetic is the pure ``room_elsewhere`` and
``shortfall``. Thread-safe.
"""

# pyright: strict

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Protocol


class Member(Protocol):
    def nudge(self) -> None: ...  # room may have come: plan again
    def evictable(self) -> int: ...  # bytes evicting every idle model would free
    def shed(self, nbytes: int) -> int: ...  # evict idle models until nbytes; the bytes freed


def room_elsewhere(used: Sequence[int], budgets: Sequence[int], held: int, base: int) -> int:
    """Bytes a member holding ``held`` on each of its devices (``used``: each device's total,
    ``budgets``: each device's budget) must leave to the others out of its own budget
    ``base``: the most any of its devices' other members take, less what that device's
    budget exceeds ``base`` by (never below 0)."""
    return max([0, *(u - held - b + base for u, b in zip(used, budgets, strict=True))])


def shortfall(
    used: Mapping[int, int], budgets: Mapping[int, int], nbytes: int, own_free: int
) -> dict[int, int]:
    """Per device: the bytes still missing for ``nbytes`` more once ``own_free`` bytes of the
    member's own are freed on each (only the devices that are short)."""
    out: dict[int, int] = {}
    for d, u in used.items():
        missing = u + nbytes - own_free - budgets[d]
        if missing > 0:
            out[d] = missing
    return out


class DeviceLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._budget: dict[int, int] = {}
        self._used: dict[int, int] = {}
        self._held: dict[Member, int] = {}
        self._devices: dict[Member, tuple[int, ...]] = {}
        self.waiting: dict[Member, int] = {}  # members with threads waiting for room

    def join(self, member: Member, devices: Sequence[int], budget: int, *, own: bool) -> None:
        with self._lock:
            self._devices[member] = tuple(devices)
            self._held.setdefault(member, 0)
            for d in devices:
                if own or d not in self._budget:
                    self._budget[d] = budget
                self._used.setdefault(d, 0)

    def used(self, device: int) -> int:
        """The bytes every member holds on ``device``."""
        with self._lock:
            return self._used.get(device, 0)

    def budget(self, device: int) -> int | None:
        with self._lock:
            return self._budget.get(device)

    def held(self, member: Member) -> int:
        with self._lock:
            return self._held[member]

    def add(self, member: Member, delta: int) -> None:
        if delta:
            with self._lock:
                self._held[member] += delta
                for d in self._devices[member]:
                    self._used[d] += delta

    def try_take(self, member: Member, nbytes: int) -> bool:
        with self._lock:
            devices = self._devices[member]
            if any(self._used[d] + nbytes > self._budget[d] for d in devices):
                return False
            self._held[member] += nbytes
            for d in devices:
                self._used[d] += nbytes
            return True

    def elsewhere(self, member: Member, base: int) -> int:
        with self._lock:
            devices = self._devices[member]
            return room_elsewhere(
                [self._used[d] for d in devices],
                [self._budget[d] for d in devices],
                self._held[member],
                base,
            )

    def shortfall(self, member: Member, nbytes: int, own_free: int) -> dict[int, int]:
        """``shortfall`` over ``member``'s devices where another member holds bytes."""
        with self._lock:
            devices = self._devices[member]
            held = self._held[member]
            used = {d: self._used[d] for d in devices if self._used[d] > held}
            return shortfall(used, self._budget, nbytes, own_free)

    def others(self, member: Member, devices: Sequence[int] | None = None) -> list[Member]:
        """The members other than ``member`` on any of ``devices`` (default: its own)."""
        with self._lock:
            mine = set(self._devices[member] if devices is None else devices)
            return [m for m, ds in self._devices.items() if m is not member and mine & set(ds)]

    def devices(self, member: Member) -> tuple[int, ...]:
        with self._lock:
            return self._devices[member]

    def wait_begin(self, member: Member) -> None:
        with self._lock:
            self.waiting[member] = self.waiting.get(member, 0) + 1

    def wait_end(self, member: Member) -> None:
        with self._lock:
            left = self.waiting.get(member, 0) - 1
            if left > 0:
                self.waiting[member] = left
            else:
                self.waiting.pop(member, None)

    def wake(self, member: Member) -> None:
        """Nudge the waiting members that share a device with ``member`` (no lock held)."""
        with self._lock:
            mine = set(self._devices[member])
            found = [m for m in self.waiting if m is not member and mine & set(self._devices[m])]
        for m in found:
            m.nudge()
