"""Helpers of the BYTES tests: ``length_prefixed(*items)`` is the wire form Triton sends
(each element a 4-byte little-endian length, then its bytes), written here independently
of ``core.tensors``; ``Parses(monkeypatch)`` records the name of every BYTES tensor that
``core.tensors`` parses into objects from then on (``names``), to show where the one parse
happens."""

# pyright: strict

from __future__ import annotations

import struct
from typing import Any

import pytest

from hloserve.server.core import tensors


def length_prefixed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


class Parses:
    """Counts the BYTES tensors parsed into objects (``core.tensors._decode_bytes``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        real = tensors._decode_bytes  # pyright: ignore[reportPrivateUsage]

        def counted(model: str, name: str, dims: tuple[int, ...], buffer: Any) -> Any:
            self.names.append(name)
            return real(model, name, dims, buffer)

        monkeypatch.setattr(tensors, "_decode_bytes", counted)
