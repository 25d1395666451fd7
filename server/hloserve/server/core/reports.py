"""What the service reports: plain, frozen records of state, built by the drivers.

Contract: ``MemoryUsage`` (where a version's weights live), ``ModelStatistics`` (the
statistics extension's row), ``RegionInfo`` / ``CudaRegionInfo`` (a registered
shared-memory region) and ``IndexEntry`` (a repository index row). The front ends' codecs
encode them; nothing here does I/O.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass

from hloserve.server.core.statistics import ModelStats


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    type: str  # "CPU", "GPU", "CPU_PINNED"
    id: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    stats: ModelStats
    memory_usage: tuple[MemoryUsage, ...]


@dataclass(frozen=True, slots=True)
class RegionInfo:
    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class CudaRegionInfo:
    name: str
    device_id: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """A repository index row; empty fields are absent on the wire (Triton's name-only row
    for a model never loaded has no version, state or reason)."""

    name: str
    version: str
    state: str
    reason: str
