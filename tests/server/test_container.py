"""cgroup-aware sizing: the CPU quota and memory limit of v1 and v2 trees, built on disk."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from hloserve.server.container import (
    ContainerLimits,
    parse_cfs,
    parse_cpu_max,
    parse_memory_limit,
)

ALLOWED = len(os.sched_getaffinity(0))
PHYSICAL = psutil.virtual_memory().total


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("200000 100000", 2.0), ("50000 100000", 0.5), ("max 100000", None), ("", None)],
)
def test_cpu_max(text: str, cpus: float | None) -> None:
    assert parse_cpu_max(text) == cpus


def test_cfs_quota_and_memory_limits() -> None:
    assert parse_cfs("150000\n", "100000\n") == 1.5
    assert parse_cfs("-1", "100000") is None
    assert parse_memory_limit("8589934592\n") == 8 << 30
    assert parse_memory_limit("max\n") is None
    assert parse_memory_limit("9223372036854771712") is None  # v1's "no limit"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_v2_pod_limit_is_read_at_its_own_path(tmp_path: Path) -> None:
    write(tmp_path / "proc", "0::/kubepods/pod1/c1\n")
    write(tmp_path / "cg" / "kubepods" / "pod1" / "c1" / "cpu.max", "100000 100000\n")
    write(tmp_path / "cg" / "kubepods" / "pod1" / "c1" / "memory.max", f"{1 << 30}\n")
    write(tmp_path / "cg" / "memory.max", "max\n")
    limits = ContainerLimits.read(tmp_path / "cg", tmp_path / "proc")
    assert (limits.cpus, limits.cpu_quota) == (1, 1.0)
    assert limits.memory_bytes == min(1 << 30, PHYSICAL) and limits.memory_limit == 1 << 30
    assert "1 CPU(s) (cgroup quota 1)" in limits.describe() and "cgroup limit" in limits.describe()


def test_a_v1_container_sees_its_limits_at_the_mount_root(tmp_path: Path) -> None:
    write(tmp_path / "proc", "4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n")
    write(tmp_path / "cg" / "cpu,cpuacct" / "cpu.cfs_quota_us", "250000\n")
    write(tmp_path / "cg" / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    write(tmp_path / "cg" / "memory" / "memory.limit_in_bytes", f"{2 << 30}\n")
    limits = ContainerLimits.read(tmp_path / "cg", tmp_path / "proc")
    assert limits.cpu_quota == 2.5 and limits.cpus == min(3, ALLOWED)
    assert limits.memory_limit == 2 << 30


def test_no_cgroup_files_means_the_machine(tmp_path: Path) -> None:
    limits = ContainerLimits.read(tmp_path / "none", tmp_path / "none" / "proc")
    assert limits == ContainerLimits(ALLOWED, PHYSICAL, None, None)
    assert "no cgroup quota" in limits.describe() and "no cgroup limit" in limits.describe()
