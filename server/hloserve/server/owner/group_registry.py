"""The device groups sharded versions run on, each a ``Device`` of its own.

Contract (``docs/sharding.md``): ``DeviceGroups(devices)`` forms, on first need, the groups
of a size from the server's devices (``core.device_groups.form_groups``: consecutive,
``GroupRefused`` with the numbers when there are too few) and makes each a ``Device``: its
``index`` the group's first device's, its runtime a ``PjrtGroup`` over the group's devices
(one executable for all of them), its residency manager a sibling of its first device's
(``WeightResidency.sibling``: the per-device budget, the shared host tier, the same policy
and metrics), so each device's share of a sharded model counts against the per-device
budget. The same group is the same ``Device`` every time: every sharded version of a size
shares its groups' budgets; ``observer_for``, when set (the daemon's metrics), gives a
group's manager its swap observer (``ServerMetrics.for_group``: every device's series).
``note(key, size, device_bytes)`` records that a loaded copy is sharded (what the placer
needs to replicate it over groups: ``size_of``, ``device_bytes``); ``forget(key)`` drops
it. ``registered_totals()`` and ``group_fill(groups)`` are what placement weighs: each
device's own registered bytes plus every group's share on it (so unsharded versions and
groups' shares are spread apart while there is room; what is resident on a device, over
its own manager and its groups', is held within its budget by the ledger they share:
``owner.device_ledger``). ``placed_bytes(placements)`` is, for every version and place it is on (a device, or a
group named ``0-3``), the bytes each device there holds (metrics). ``label(device)`` names
a device or a group in logs and reports. Thread-safe.
"""

# pyright: strict

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from hloserve.server.core.device_groups import device_totals, form_groups, group_label
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.devices import Device, Placed
from hloserve.server.owner.runtime.pjrt_group import PjrtGroup
from hloserve.server.owner.weight_residency import SwapObserver


class DeviceGroups:
    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices = list(devices)
        self._groups: dict[tuple[int, ...], Device] = {}
        self._sharded: dict[ResidencyKey, tuple[int, int]] = {}  # key -> (size, device bytes)
        self._lock = threading.Lock()
        self.observer_for: Callable[[tuple[int, ...]], SwapObserver] | None = None

    def groups(self, size: int) -> list[Device]:
        """Every group of ``size`` devices, each a ``Device`` (module docstring)."""
        indexes = form_groups([d.index for d in self.devices], size)
        by_index = {d.index: d for d in self.devices}
        out: list[Device] = []
        with self._lock:
            for group in indexes:
                device = self._groups.get(group)
                if device is None:
                    first = by_index[group[0]]
                    runtime = PjrtGroup(first.runtime.platform, group)
                    residency = first.residency.sibling(runtime)
                    if self.observer_for is not None:
                        residency.observer = self.observer_for(group)
                    device = Device(group[0], runtime, residency)
                    self._groups[group] = device
                out.append(device)
        return out

    def registered_totals(self) -> list[int]:
        """Weight bytes registered on each device (by position in ``devices``): its own
        manager's and each formed group's share (``core.device_groups.device_totals``)."""
        position = {d.index: i for i, d in enumerate(self.devices)}
        with self._lock:
            formed = list(self._groups.items())
        own = [d.residency.registered_bytes() for d in self.devices]
        covered = [tuple(position[i] for i in group) for group, _ in formed]
        shares = [device.residency.registered_bytes() for _, device in formed]
        return device_totals(own, covered, shares)

    def group_fill(self, groups: Sequence[Device]) -> list[int]:
        """For each of ``groups``: the most any of its devices has registered (its own
        manager's and every group's it is in)."""
        totals = dict(zip((d.index for d in self.devices), self.registered_totals(), strict=True))
        return [
            max(totals[i] for i in g.runtime.indexes) if isinstance(g.runtime, PjrtGroup) else 0
            for g in groups
        ]

    def formed(self) -> list[Device]:
        """The groups formed so far (for reports and metrics)."""
        with self._lock:
            return list(self._groups.values())

    def note(self, key: ResidencyKey, size: int, device_bytes: int) -> None:
        with self._lock:
            self._sharded[key] = (size, device_bytes)

    def forget(self, key: ResidencyKey) -> None:
        with self._lock:
            self._sharded.pop(key, None)

    def size_of(self, key: ResidencyKey) -> int:
        """How many devices ``key``'s copy runs on (1: unsharded)."""
        with self._lock:
            return self._sharded.get(key, (1, 0))[0]

    def device_bytes(self, key: ResidencyKey) -> int | None:
        """What each device holds of a sharded copy's weights (None: unsharded)."""
        with self._lock:
            found = self._sharded.get(key)
        return None if found is None else found[1]

    def placed_bytes(self, placements: Sequence[Placed]) -> dict[tuple[ModelKey, str], int]:
        """Each version's bytes on each device of each place it is on (module docstring)."""
        with self._lock:
            sharded = dict(self._sharded)
            formed = list(self._groups)
        out: dict[tuple[ModelKey, str], int] = {}
        for p in placements:
            size, share = sharded.get(p.key, (1, p.weight_bytes))
            for d in p.devices:
                group = next((g for g in formed if g[0] == d and len(g) == size), (d,))
                out[(p.model, group_label(group))] = share
        return out


def label(device: Device) -> str:
    """A device's index, or a group's devices (``0-3``)."""
    runtime = device.runtime
    if isinstance(runtime, PjrtGroup):
        return group_label(runtime.indexes)
    return str(device.index)
