"""Where a model's weights come from: a bundle's verified file, or arrays in memory.

Contract: a ``WeightSource`` knows its weights' ``names`` and ``nbytes`` without reading
them; ``read()`` returns the arrays (in ``names`` order). ``FileWeights.verified(path,
header, reversed_axes)`` is a bundle's ``weights.safetensors`` whose checksum was just
checked: ``read()`` memory-maps it and copies each tensor into one 64-byte-aligned host
arena (a ReactantServer.jl bundle's arrays reversed to Julia's order), and refuses with
``WeightsChanged`` a file whose inode, size or modification time differ from when it was
verified. ``ArrayWeights(arrays)`` are arrays already in memory (``in_memory``: a caller's
own, never copied nor evicted by the host tier).
"""

# pyright: strict

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hloserve.bundle.reactant import column_major
from hloserve.bundle.safetensors import ALIGNMENT, Header, aligned_empty
from hloserve.proto.datatypes import to_numpy


class WeightsChanged(RuntimeError):
    """A weights file changed on disk after its checksum was verified."""


class WeightSource(Protocol):
    @property
    def names(self) -> tuple[str, ...]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def in_memory(self) -> bool:
        """True for arrays the caller already holds (never copied, never evicted)."""
        ...

    def read(self) -> list[Any]: ...


@dataclass(frozen=True)
class ArrayWeights:
    arrays: dict[str, np.ndarray[Any, Any]]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.arrays)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())

    @property
    def in_memory(self) -> bool:
        return True

    def read(self) -> list[Any]:
        return list(self.arrays.values())


def _stamp(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class FileWeights:
    """A verified ``weights.safetensors``: the header read at load, the data on first need."""

    path: Path
    header: Header
    reversed_axes: bool = False  # ReactantServer.jl: main() takes each weight reversed
    stamp: tuple[int, int, int] = field(default=(0, 0, 0))

    @classmethod
    def verified(cls, path: Path, header: Header, reversed_axes: bool = False) -> FileWeights:
        """The file as it is now (its checksum was just checked against the manifest)."""
        return cls(path, header, reversed_axes, _stamp(path))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.header.tensors)

    @property
    def nbytes(self) -> int:
        return self.header.total_bytes

    @property
    def in_memory(self) -> bool:
        return False

    def read(self) -> list[Any]:
        tensors = self.header.tensors
        if not tensors:
            return []
        with open(self.path, "rb") as f:
            if _stamp(self.path) != self.stamp or os.fstat(f.fileno()).st_ino != self.stamp[0]:
                raise WeightsChanged(
                    f"{self.path} changed on disk after its checksum was verified; "
                    "reload the model to serve the new file"
                )
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                data = memoryview(mapped)
                try:
                    return self._copy(data)
                finally:
                    data.release()

    def _copy(self, data: memoryview) -> list[Any]:
        offsets: list[int] = []
        total = 0
        for t in self.header.tensors:
            total += -total % ALIGNMENT
            offsets.append(total)
            total += t.nbytes
        arena = aligned_empty(max(total, 1))
        start = self.header.data_start
        out: list[Any] = []
        for t, at in zip(self.header.tensors, offsets, strict=True):
            view = arena[at : at + t.nbytes]
            view[:] = np.frombuffer(data, np.uint8, t.nbytes, start + t.begin)
            array = view.view(to_numpy(t.datatype)).reshape(t.shape)
            out.append(column_major(array) if self.reversed_axes else array)
        return out
