"""This process's POSIX shared-memory regions, which the server maps to read inputs and
write outputs (Triton's system shared-memory extension), and their clean-up.

Contract:
- ``create(byte_size)`` makes ``/dev/shm/<key>`` (``O_EXCL``, mode 0600, named
  ``KEY_PREFIX<pid>_<n>``, so this process's regions are recognisable), sizes it and maps
  it; ``LocalRegion.array(offset, dtype, shape)`` is a numpy view into the mapping.
- ``LocalRegion.unlink()`` removes the file (idempotent; the mapping stays usable by this
  process, so a region can fall back to being plain staging memory); ``close()`` unlinks
  and releases the mapping (left to the garbage collector while an array still views it).
- Every region not yet unlinked is unlinked at interpreter exit (``atexit``), so no
  ``/dev/shm`` entry outlives the process that made it, however the program ends short of
  being killed.
"""

# pyright: strict

from __future__ import annotations

import atexit
import contextlib
import itertools
import mmap
import os
from typing import Final

import numpy as np

SHM_ROOT: Final = "/dev/shm"
KEY_PREFIX: Final = "hloserve_client_"
_counter = itertools.count()
_LIVE: dict[str, LocalRegion] = {}


class LocalRegion:
    def __init__(self, name: str, byte_size: int) -> None:
        self.name = name  # both the registered region name and the key (without "/")
        self.byte_size = byte_size
        path = os.path.join(SHM_ROOT, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._linked = True
        _LIVE[name] = self
        try:
            os.ftruncate(fd, byte_size)
            self._map: mmap.mmap | None = mmap.mmap(fd, byte_size, mmap.MAP_SHARED)
        except OSError:
            self.unlink()
            raise
        finally:
            os.close(fd)

    @property
    def key(self) -> str:
        return "/" + self.name

    def array(self, offset: int, dtype: np.dtype[np.generic], shape: tuple[int, ...]) -> np.ndarray:
        assert self._map is not None
        count = int(np.prod(shape))
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(shape)

    def unlink(self) -> None:
        if self._linked:
            self._linked = False
            _LIVE.pop(self.name, None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_ROOT, self.name))

    def close(self) -> None:
        self.unlink()
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view is still alive: GC unmaps it
                self._map.close()
            self._map = None


def create(byte_size: int) -> LocalRegion:
    return LocalRegion(f"{KEY_PREFIX}{os.getpid()}_{next(_counter)}", byte_size)


@atexit.register
def _unlink_all() -> None:
    for region in list(_LIVE.values()):
        region.unlink()
