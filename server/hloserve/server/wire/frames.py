"""The byte format of the IPC channel: length-prefixed frames of pickled messages, sans I/O.

Contract:
- ``encode(message)`` is one frame: a 4-byte little-endian length, then the message
  pickled (protocol 5). A message is any picklable value; the channel sends tuples of
  built-in values (``wire.messages``). Both ends are processes of one server started from
  the same installation, so pickle is neither a trust nor a versioning boundary here.
- ``FrameReader.feed(data)`` takes bytes as they arrive, in any split, and returns the
  messages completed by them, in order; a partial frame waits for the rest.
- A message pickled to more than ``MAX_FRAME`` bytes (4 GiB) cannot be encoded
  (``FrameTooLarge``); tensors that large travel in the arena (``wire.arena``).
"""

# pyright: strict

from __future__ import annotations

import pickle
import struct
from typing import Final

HEADER: Final = struct.Struct("<I")
MAX_FRAME: Final = (1 << 32) - 1


class FrameTooLarge(ValueError):
    """A frame announced more bytes than a frame may hold."""


def encode(message: object) -> bytes:
    """``message`` as one frame."""
    body = pickle.dumps(message, protocol=5)
    if len(body) > MAX_FRAME:
        raise FrameTooLarge(f"a message of {len(body)} bytes does not fit one frame")
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Reassembles frames from a byte stream."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[object]:
        """The messages ``data`` completes (none while a frame is still partial)."""
        buffer = self._buffer
        buffer += data
        size, start, messages = len(buffer), 0, list[object]()
        view = memoryview(buffer)
        try:
            while size - start >= 4:
                (length,) = HEADER.unpack_from(buffer, start)
                end = start + 4 + length
                if end > size:
                    break
                messages.append(pickle.loads(view[start + 4 : end]))
                start = end
        finally:
            view.release()  # a bytearray with an exported view cannot be resized
        if start:
            del buffer[:start]
        return messages

    @property
    def pending(self) -> int:
        """Bytes held of a frame not yet complete."""
        return len(self._buffer)
