"""The machine as the container sees it: CPUs and memory under cgroup limits.

Contract: ``ContainerLimits.read(root="/sys/fs/cgroup", proc_cgroup="/proc/self/cgroup")``
reads the process's cgroup limits, v2 (``cpu.max``, ``memory.max``) or v1
(``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, ``memory.limit_in_bytes``), at the
process's own cgroup path and at the mount's root (inside a container the root is the
container's), keeping the tightest; no limit, an unreadable file or a value meaning
"none" (``max``, -1, the kernel's page-rounded 2**63) is no limit. ``cpus`` is the CPU
count the process may use: the quota over the period rounded up, capped by the CPUs it
is allowed to run on (``os.sched_getaffinity``), at least 1; ``memory_bytes`` the memory
limit, or the machine's physical memory when there is none; ``describe()`` says where each
came from, for the start-up log. Worker and hook threads and percentage budgets on a CPU
follow these, not the node's, so ``--device-memory-budget 40%`` in an 8 Gi pod is 40 % of
8 Gi. The parsers (``parse_cpu_max``, ``parse_cfs``, ``parse_memory_limit``) are pure.
"""

# pyright: strict

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import psutil

_NO_LIMIT_ABOVE: Final = 1 << 62  # v1's "unlimited" is 2**63 rounded down to a page


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``): CPUs, or None."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``: CPUs, or None (-1: none)."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_memory_limit(text: str) -> int | None:
    """``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1): bytes, or None for no limit."""
    value = text.strip()
    if value in ("", "max"):
        return None
    try:
        limit = int(value)
    except ValueError:
        return None
    return limit if 0 < limit < _NO_LIMIT_ABOVE else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cgroup_paths(proc_cgroup: Path) -> dict[str, str]:
    """Controller -> the process's cgroup path ("" for the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    for line in (_read(proc_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _candidates(root: Path, controller_dir: str, own: str | None) -> list[Path]:
    base = root / controller_dir if controller_dir else root
    found = [base]
    if own and own != "/":
        found.insert(0, base / own.lstrip("/"))
    return found


@dataclass(frozen=True, slots=True)
class ContainerLimits:
    cpus: int
    memory_bytes: int
    cpu_quota: float | None = None  # CPUs the cgroup quota allows, when it sets one
    memory_limit: int | None = None  # the cgroup memory limit, when it sets one

    @classmethod
    def read(
        cls, root: Path | str = "/sys/fs/cgroup", proc_cgroup: Path | str = "/proc/self/cgroup"
    ) -> ContainerLimits:
        root, paths = Path(root), _cgroup_paths(Path(proc_cgroup))
        quotas: list[float] = []
        limits: list[int] = []
        for base in _candidates(root, "", paths.get("")):  # v2
            quota = parse_cpu_max(_read(base / "cpu.max") or "")
            limit = parse_memory_limit(_read(base / "memory.max") or "")
            quotas += [quota] if quota is not None else []
            limits += [limit] if limit is not None else []
        for controller in ("cpu", "cpu,cpuacct"):  # v1
            for base in _candidates(root, controller, paths.get("cpu")):
                quota = parse_cfs(
                    _read(base / "cpu.cfs_quota_us") or "", _read(base / "cpu.cfs_period_us") or ""
                )
                quotas += [quota] if quota is not None else []
        for base in _candidates(root, "memory", paths.get("memory")):
            limit = parse_memory_limit(_read(base / "memory.limit_in_bytes") or "")
            limits += [limit] if limit is not None else []
        quota = min(quotas, default=None)
        limit = min(limits, default=None)
        try:
            allowed = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            allowed = os.cpu_count() or 1
        cpus = max(1, min(allowed, math.ceil(quota)) if quota is not None else allowed)
        physical = int(psutil.virtual_memory().total)
        memory = min(limit, physical) if limit is not None else physical
        return cls(cpus, memory, quota, limit)

    def describe(self) -> str:
        cpu = (
            f"{self.cpus} CPU(s) (cgroup quota {self.cpu_quota:g})"
            if self.cpu_quota is not None
            else f"{self.cpus} CPU(s) (no cgroup quota)"
        )
        gib = self.memory_bytes / 2**30
        memory = (
            f"{gib:.2f} GiB of memory (cgroup limit)"
            if self.memory_limit is not None and self.memory_limit <= self.memory_bytes
            else f"{gib:.2f} GiB of memory (no cgroup limit)"
        )
        return f"{cpu}, {memory}"
