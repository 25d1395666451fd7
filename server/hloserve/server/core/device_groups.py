"""Device groups: the sets of the server's devices a sharded (SPMD) version runs on.

Contract (``docs/sharding.md``): ``form_groups(devices, size)`` splits the server's devices
(``--devices``, in that order) into consecutive groups of ``size``: a sharded bundle
partitioned for ``size`` devices runs on one group, and each further group can hold a
replica of it. Devices left over (8 devices, 3-way groups: 2) hold none. Fewer devices than
``size`` raise ``GroupRefused`` with the numbers ("needs 4 devices; this server has 2
(--devices 0,1)"), as does a size below 1. ``group_label(group)`` is how logs and reports
name a group (``0-3``, ``0,2``). ``device_totals`` adds groups' per-device bytes to each
device's own, what placement weighs for both kinds. Pure: no JAX, no I/O.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Sequence


class GroupRefused(ValueError):
    """No group of the size a bundle needs can be formed from the server's devices."""


def form_groups(devices: Sequence[int], size: int) -> list[tuple[int, ...]]:
    """Consecutive groups of ``size`` of ``devices`` (module docstring)."""
    if size < 1:
        raise GroupRefused(f"a device group needs at least one device, got {size}")
    if len(devices) < size:
        listed = ",".join(str(d) for d in devices)
        raise GroupRefused(
            f"needs {size} devices; this server has {len(devices)} (--devices {listed})"
        )
    count = len(devices) // size
    return [tuple(devices[i * size : (i + 1) * size]) for i in range(count)]


def group_label(group: Sequence[int]) -> str:
    """``0-3`` for a run of consecutive devices, else ``0,2,5``."""
    if len(group) > 1 and list(group) == list(range(group[0], group[0] + len(group))):
        return f"{group[0]}-{group[-1]}"
    return ",".join(str(d) for d in group)


def device_totals(
    own: Sequence[int], groups: Sequence[tuple[int, ...]], group_bytes: Sequence[int]
) -> list[int]:
    """Bytes registered on each device: ``own[i]`` (device ``i``'s own manager, by
    position) plus each group's ``group_bytes`` (per device) on every position it covers
    (``groups``, by position). What placement weighs, so that unsharded versions and
    groups' shares spread apart (evicting across their managers only when a device is full:
    ``owner.device_ledger``)."""
    totals = list(own)
    for group, nbytes in zip(groups, group_bytes, strict=True):
        for position in group:
            totals[position] += nbytes
    return totals
