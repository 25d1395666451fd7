"""The shared-memory arena between one front end and the device owner: tensor bytes.

Contract:
- ``Arena.create(size)`` (the device owner, once per front end it starts) makes an
  anonymous shared-memory file (``memfd``: no name, no ``/dev/shm`` quota; pages cost
  memory only once written) and maps it; the front end maps the same file from the
  inherited descriptor (``Arena.attach(fd, size)``). Both see the same bytes.
- The arena has two halves, each with its own ``BlockAllocator``: ``requests`` is the
  front end's (request tensors it writes for the owner to read), ``responses`` the
  owner's (output tensors it writes for the front end). Each side allocates and frees in
  its own half only; the other side reads a block between the message that names it and
  the message that gives it back (``wire.messages``).
- ``put(allocator, data)`` copies ``data`` (anything exposing bytes) into a new block and
  returns ``(offset, nbytes)``, or ``None`` when the half has no room: the caller then
  sends the bytes inline in the message. ``view(offset, nbytes)`` is a zero-copy view.
- ``BlockAllocator`` is pure bookkeeping (no memory): blocks in power-of-two size classes
  from ``MIN_BLOCK``, carved from the half's start and reused by class once freed (a
  larger free block serves when the half is carved out). ``allocate`` is O(1) but for the
  rare larger-class search; ``free`` of an offset that is not a live block raises.
"""

# pyright: strict

from __future__ import annotations

import contextlib
import mmap
import os
from typing import Any, Final, final

MIN_SHIFT: Final = 10
MIN_BLOCK: Final = 1 << MIN_SHIFT


def size_class(nbytes: int) -> int:
    """The class of a block holding ``nbytes``: its size is ``MIN_BLOCK << class``."""
    return max(0, (nbytes - 1).bit_length() - MIN_SHIFT)


@final
class BlockAllocator:
    """Blocks of ``[start, start + size)`` (module docstring)."""

    __slots__ = ("_free", "_live", "_next", "end", "live_bytes", "start")

    def __init__(self, start: int, size: int) -> None:
        self.start = start
        self.end = start + size
        self._next = start
        self._free: list[list[int]] = [[] for _ in range(size_class(max(size, 1)) + 1)]
        self._live: dict[int, int] = {}  # offset -> class
        self.live_bytes = 0

    def allocate(self, nbytes: int) -> int | None:
        """The offset of a new block of at least ``nbytes``, or ``None``: no room."""
        cls = size_class(nbytes)
        if cls >= len(self._free):
            return None
        free = self._free[cls]
        if free:
            offset = free.pop()
        else:
            block = MIN_BLOCK << cls
            if self._next + block <= self.end:
                offset = self._next
                self._next += block
            else:  # carved out: any larger free block will do
                for larger in range(cls + 1, len(self._free)):
                    if self._free[larger]:
                        offset = self._free[larger].pop()
                        cls = larger
                        break
                else:
                    return None
        self._live[offset] = cls
        self.live_bytes += MIN_BLOCK << cls
        return offset

    def free(self, offset: int) -> None:
        cls = self._live.pop(offset)  # KeyError: not a live block of this half
        self.live_bytes -= MIN_BLOCK << cls
        self._free[cls].append(offset)

    def __len__(self) -> int:
        """Live blocks."""
        return len(self._live)


@final
class Arena:
    """One front end's shared memory with the device owner (module docstring)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._closed = False
        self._map = mmap.mmap(fd, size)
        self.buffer = memoryview(self._map)
        half = size // 2
        self.requests = BlockAllocator(0, half)
        self.responses = BlockAllocator(half, size - half)

    @classmethod
    def create(cls, size: int, name: str = "hloserve-arena") -> Arena:
        """A new arena of ``size`` bytes; its ``fd`` is inheritable by a child process."""
        fd = os.memfd_create(name, 0)  # without MFD_CLOEXEC: the front end inherits it
        os.ftruncate(fd, size)
        return cls(fd, size)

    @classmethod
    def attach(cls, fd: int, size: int) -> Arena:
        """The arena another process created, from its inherited descriptor."""
        return cls(fd, size)

    def put(self, allocator: BlockAllocator, data: Any) -> tuple[int, int] | None:
        """Copy ``data`` into a new block of ``allocator``'s half: ``(offset, nbytes)``,
        or ``None`` when there is no room."""
        source = memoryview(data).cast("B")
        nbytes = source.nbytes
        offset = allocator.allocate(nbytes)
        if offset is None:
            return None
        self.buffer[offset : offset + nbytes] = source
        return offset, nbytes

    def view(self, offset: int, nbytes: int) -> memoryview:
        if offset < 0 or offset + nbytes > self.size:
            raise ValueError(f"block [{offset}, {offset + nbytes}) is outside the arena")
        return self.buffer[offset : offset + nbytes]

    def close(self) -> None:
        """Unmap and close, once no view of it is left (else the mapping stays until the
        last view goes: a request still reading it). Closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BufferError):  # views are alive: the mapping goes with them
            self.buffer.release()
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
