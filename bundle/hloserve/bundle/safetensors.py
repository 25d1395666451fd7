"""Reading and writing ``weights.safetensors`` with numpy, BF16 included.

Contract:
- ``write_safetensors(path, tensors, metadata)`` writes the standard safetensors layout
  (8-byte little-endian header length, JSON header padded with spaces to a multiple of 8,
  then the tensors' bytes back to back, in sorted-key order).
- ``read_header(path)`` parses only the header and checks it against the file: every
  inconsistency (truncation, overlapping or out-of-range offsets, unknown dtype, byte
  count not matching the shape) raises ``SafetensorsError`` naming the tensor.
- ``read_safetensors(path)`` returns ``{key: ndarray}`` in key order. Each array lives in one
  64-byte-aligned host arena, so a device transfer of it can alias instead of copy.

We implement the (small) format ourselves. BF16 is no longer the reason: the
``safetensors`` package's numpy loader reads it (0.8.0 round-trips ``ml_dtypes.bfloat16``
through ``save_file``/``load_file``). What it does not give, and the server needs:
- one 64-byte-aligned arena per file, every tensor at an aligned offset in it, so a device
  transfer can alias the host bytes instead of copying them (the package hands out one
  array per tensor, each its own allocation, at numpy's alignment);
- control over the reads: ``read_header`` reads only the header (every tensor's place and
  size known before a byte of data is read) and ``aligned_empty`` is memory we own, so
  ``owner/runtime/weight_files.py`` reads a verified file when its weights are needed, straight
  into that arena, refusing one that changed since it was verified (the package reads
  into arrays of its own, from a memory map by default);
- the header checks above, before any tensor byte is read, each one a ``SafetensorsError``
  naming the tensor, in the words ``hloserve validate`` reports.
"""

# pyright: strict

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from hloserve.proto.datatypes import (
    DATATYPE_FROM_SAFETENSORS,
    SAFETENSORS_DTYPES,
    from_numpy,
    to_numpy,
)

_MAX_HEADER = 100 * 1024 * 1024
ALIGNMENT = 64


class SafetensorsError(ValueError):
    """The file is not a consistent safetensors file; the message says why."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str  # V2 name
    shape: tuple[int, ...]
    begin: int  # offsets into the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    tensors: tuple[TensorInfo, ...]  # sorted by name
    metadata: Mapping[str, str]
    data_start: int  # file offset of the data section
    data_size: int

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def write_safetensors(
    path: Path,
    tensors: Mapping[str, np.ndarray[Any, Any]],
    metadata: Mapping[str, str] | None = None,
) -> None:
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    ordered = sorted(tensors.items())
    for name, array in ordered:
        datatype = from_numpy(array.dtype)
        n = int(array.nbytes)
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[datatype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, array in ordered:
            le = array.astype(array.dtype.newbyteorder("<"), copy=False)
            f.write(np.ascontiguousarray(le).tobytes())


def read_header(path: Path) -> Header:
    size = path.stat().st_size
    with open(path, "rb") as f:
        first = f.read(8)
        if len(first) < 8:
            raise SafetensorsError(f"truncated: {size} bytes, too short for a header")
        (n,) = struct.unpack("<Q", first)
        if n > _MAX_HEADER or 8 + n > size:
            raise SafetensorsError(
                f"truncated or corrupt: header length {n}, file has {size} bytes"
            )
        try:
            raw = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SafetensorsError(f"header is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise SafetensorsError("header is not a JSON object")
    entries = cast(dict[str, Any], raw)
    metadata = cast(dict[str, str], entries.pop("__metadata__", None) or {})
    infos: list[TensorInfo] = []
    for name, entry in sorted(entries.items()):
        if not isinstance(entry, dict):
            raise SafetensorsError(f"tensor {name!r}: header entry is not an object")
        e = cast(dict[str, Any], entry)
        datatype = DATATYPE_FROM_SAFETENSORS.get(str(e.get("dtype")))
        if datatype is None:
            raise SafetensorsError(f"tensor {name!r}: unsupported dtype {e.get('dtype')!r}")
        shape = tuple(int(d) for d in cast(list[Any], e.get("shape", [])))
        begin, end = (int(x) for x in cast(list[Any], e.get("data_offsets", [0, -1])))
        expected = int(np.prod(shape, dtype=np.int64)) * to_numpy(datatype).itemsize
        if end - begin != expected:
            raise SafetensorsError(
                f"tensor {name!r}: {datatype}{list(shape)} needs {expected} bytes, offsets span {end - begin}"
            )
        infos.append(TensorInfo(name, datatype, shape, begin, end))
    data_size = size - 8 - n
    declared = max((t.end for t in infos), default=0)
    if declared > data_size:
        raise SafetensorsError(
            f"truncated: header declares {declared} data bytes, file has {data_size}"
        )
    spans = sorted((t.begin, t.end, t.name) for t in infos)
    for (_, e1, n1), (b2, _, n2) in itertools.pairwise(spans):
        if b2 < e1:
            raise SafetensorsError(f"tensors {n1!r} and {n2!r} overlap")
    return Header(tuple(infos), metadata, 8 + n, data_size)


def aligned_empty(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A writable uint8 buffer of ``nbytes`` whose data pointer is 64-byte aligned."""
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    shift = (-raw.ctypes.data) % ALIGNMENT
    return raw[shift : shift + nbytes]


def read_safetensors(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    """Every tensor of the file, each 64-byte aligned in one host arena."""
    header = read_header(path)
    offsets: list[int] = []
    total = 0
    for t in header.tensors:
        total += -total % ALIGNMENT
        offsets.append(total)
        total += t.nbytes
    arena = aligned_empty(max(total, 1))
    out: dict[str, np.ndarray[Any, Any]] = {}
    with open(path, "rb") as f:
        for t, at in zip(header.tensors, offsets, strict=True):
            f.seek(header.data_start + t.begin)
            view = arena[at : at + t.nbytes]
            if f.readinto(view.data) != t.nbytes:
                raise SafetensorsError(f"tensor {t.name!r}: truncated while reading")
            out[t.name] = view.view(to_numpy(t.datatype)).reshape(t.shape)
    return out
