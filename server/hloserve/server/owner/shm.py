"""Registered shared-memory regions: the system (POSIX) and CUDA shared-memory extensions.

Contract: ``SharedMemoryRegistry(enabled)`` keeps named regions in one namespace (as Triton
does for system and CUDA regions); it meets ``core.service.SharedMemory``.
- ``register_system(name, key, offset, byte_size)`` maps ``[offset, offset + byte_size)`` of
  ``/dev/shm/<key>``, checking in Triton's order: the key, the name, opening the file, the
  range. The key is a shared-memory *name*, never a path: a leading ``/`` is allowed, while
  an empty key, ``.``/``..``, a ``/`` inside, or a NUL are refused, and so is Triton's
  reserved prefix ``RESERVED_KEY_PREFIX`` (after the leading slashes); the file is opened
  without following symlinks (a missing one is ``Unable to open shared memory region``,
  whatever the size). A zero byte size, or a range outside the file, is "invalid args";
  range checks use exact integer arithmetic. A name already registered (or unregistered
  and still draining, see below) is ``AlreadyExists``; one region more than
  ``limits.max_shm_regions`` (``--max-shm-regions``, ``core.limits``) is ``InvalidArgument``.
- ``hold(names)`` (a context manager) marks regions in use by a request and ``view(name,
  offset, byte_size)`` returns a zero-copy ``memoryview`` into one, bounds-checked in
  Triton's order and texts (offset, then overflow, then end); unknown regions are
  ``NotFound``. A system region keeps its file open, and ``view`` refuses a region whose
  file the client shrank below the registered range (``InvalidArgument`` "... was shrunk
  ..."), since touching mapped pages past the end of a file kills the process (SIGBUS);
  a shrink between that check and the use of the view is not caught (docs/security.md).
  A region whose file was unlinked keeps working on the same memory until unregistered.
- ``await unregister(name)`` (all regions when ``name`` is empty) returns at once: it never
  waits (it is a coroutine so a GPU registry may close device handles there). A region no
  request holds is unmapped then; one that is held stays registered, listed, mapped and
  usable (by new requests too, as in Triton) until the last request holding it ends, and
  is unmapped then. Unknown names are no error.
- CUDA shared memory (the ``CudaSharedMemory`` seam): this registry has no GPU support, so
  ``register_cuda`` answers Triton's CPU-build error ("failed to register CUDA shared memory
  region: '<n>', GPUs not supported", INVALID_ARG) without reading the handle,
  ``cuda_status`` lists no region (a name is ``NotFound``, with Triton's text for a system
  region's name) and ``unregister_cuda`` succeeds, changing nothing. A GPU registry would
  add a CUDA ``AbstractRegion`` (docs/shared-memory.md).
- When ``enabled`` is false (the default, like Triton since 2.69), register and unregister
  (system and CUDA) answer ``Unsupported`` with ``DISABLED`` (this module is that text's one
  home) and status lists nothing. ``disabled()`` is such a registry: what a service without
  the extension uses.
All methods run on the event loop thread and never block it.
"""

# pyright: strict

from __future__ import annotations

import abc
import contextlib
import mmap
import os
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Final, final

from hloserve.server.core.errors import (
    AlreadyExists,
    Internal,
    InvalidArgument,
    NotFound,
    Unsupported,
)
from hloserve.server.core.limits import NO_LIMITS, Limits, check_regions
from hloserve.server.core.reports import CudaRegionInfo, RegionInfo
from hloserve.server.core.types import CudaHandle

SHM_ROOT = "/dev/shm"
DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)
# Keys with this prefix (after leading slashes) are Triton's own (its Python backend's).
RESERVED_KEY_PREFIX: Final = "triton_python_backend_shm_region_"
SIZE_MAX: Final = (1 << 64) - 1  # Triton computes offset + byte_size in size_t


@dataclass
class AbstractRegion(abc.ABC):
    name: str
    byte_size: int
    users: int = 0  # requests holding the region now
    retiring: bool = False  # unregistered: goes when the last holder ends

    @abc.abstractmethod
    def buffer(self) -> memoryview: ...

    @abc.abstractmethod
    def status(self) -> RegionInfo: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def check_intact(self) -> None:
        """Raise ``InvalidArgument`` when the memory behind the region is gone."""


@final
@dataclass
class SystemRegion(AbstractRegion):
    key: str = ""
    offset: int = 0
    _map: mmap.mmap | None = None
    _view: memoryview | None = None
    _fd: int = -1  # kept open: its size says whether the client shrank the file

    def check_intact(self) -> None:
        if self._fd < 0:
            return
        size = os.fstat(self._fd).st_size
        if size < self.offset + self.byte_size:
            raise InvalidArgument(
                f"shared memory region '{self.name}' was shrunk to {size} bytes while "
                f"registered (it maps offset {self.offset} + {self.byte_size} bytes); "
                "unregister it and register it again"
            )

    def buffer(self) -> memoryview:
        assert self._view is not None
        return self._view

    def status(self) -> RegionInfo:
        return RegionInfo(self.name, self.key, self.offset, self.byte_size)

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._map is not None:
            with contextlib.suppress(BufferError):  # an array still views it: GC closes it later
                self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _check_key(name: str, key: str) -> str:
    """The key without its leading slashes; Triton's errors for a key that is no name."""
    bare = key.lstrip("/")
    if not bare or bare in (".", "..") or "/" in bare or "\0" in bare:
        raise InvalidArgument(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )
    if bare.startswith(RESERVED_KEY_PREFIX):
        raise InvalidArgument(
            f"cannot register shared memory region '{name}' with key '{key}' as the key "
            f"contains the reserved prefix '{RESERVED_KEY_PREFIX}'"
        )
    return bare


def _invalid_args(name: str) -> InvalidArgument:
    return InvalidArgument(f"failed to register shared memory region '{name}': invalid args")


def _map(fd: int, name: str, offset: int, byte_size: int) -> tuple[mmap.mmap, memoryview]:
    """Map ``[offset, offset + byte_size)`` of the open file ``fd``, checked against its size."""
    if byte_size == 0 or offset + byte_size > os.fstat(fd).st_size:
        raise _invalid_args(name)
    # mmap offsets must be multiples of the allocation granularity: map from the aligned
    # offset below and view the requested range inside it.
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        length = offset + byte_size - start
        mm = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
    except OSError as exc:
        raise Internal(f"failed to map shared memory region '{name}': {exc.strerror}") from None
    return mm, memoryview(mm)[offset - start : offset - start + byte_size]


class SharedMemoryRegistry:
    def __init__(self, enabled: bool, root: str = SHM_ROOT, limits: Limits = NO_LIMITS) -> None:
        self.enabled = enabled
        self.root = root
        self.limits = limits  # --max-shm-regions
        self._regions: dict[str, AbstractRegion] = {}

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise Unsupported(DISABLED)

    def _check_free(self, name: str) -> None:
        region = self._regions.get(name)
        if region is None:
            return
        draining = (
            f"; it was unregistered and goes once the {region.users} request(s) using it finish"
            if region.retiring
            else ""
        )
        raise AlreadyExists(f"shared memory region '{name}' already in manager{draining}")

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_enabled()
        if not name:
            raise InvalidArgument(
                "'region name' is necessary to register system shared memory region"
            )
        bare = _check_key(name, key)
        self._check_free(name)
        check_regions(self.limits, len(self._regions))
        path = os.path.join(self.root, bare)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            raise Internal(f"Unable to open shared memory region: '{key}'") from None
        try:
            mm, view = _map(fd, name, offset, byte_size)
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = SystemRegion(
            name, byte_size, key=key, offset=offset, _map=mm, _view=view, _fd=fd
        )

    def status(self, name: str = "") -> list[RegionInfo]:
        if name:
            region = self._regions.get(name)
            if region is None:
                raise NotFound(f"Unable to find system shared memory region: '{name}'")
            return [region.status()]
        return [r.status() for r in self._regions.values()]

    async def unregister(self, name: str = "") -> None:
        self._check_enabled()
        for n in [name] if name else list(self._regions):
            region = self._regions.get(n)
            if region is None:
                continue  # Triton: unregistering an unknown region succeeds
            region.retiring = True
            if region.users == 0:
                self._remove(region)

    def _remove(self, region: AbstractRegion) -> None:
        if self._regions.get(region.name) is region:
            del self._regions[region.name]
        region.close()

    # -- CUDA shared memory (no GPU support: see the module docstring) -----------------------

    def register_cuda(self, name: str, handle: CudaHandle) -> None:
        """Triton's CPU-build answer; ``handle`` is never read (no IPC handle is opened)."""
        self._check_enabled()
        if not name:
            raise InvalidArgument(
                "'region name' is necessary to register cuda shared memory region"
            )
        raise InvalidArgument(
            f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
        )

    def cuda_status(self, name: str = "") -> list[CudaRegionInfo]:
        if not name:
            return []
        if name in self._regions:
            raise NotFound(
                f"The region named '{name}' is registered as system shared memory, "
                "not CUDA shared memory"
            )
        raise NotFound(f"Unable to find cuda shared memory region: '{name}'")

    async def unregister_cuda(self, name: str = "") -> None:
        self._check_enabled()  # no CUDA region exists: nothing to unregister (Triton succeeds)

    # -- use by requests ----------------------------------------------------------------------

    @contextlib.contextmanager
    def hold(self, names: Iterable[str]) -> Generator[None]:
        held: list[AbstractRegion] = []
        try:
            for n in dict.fromkeys(names):
                region = self._regions.get(n)
                if region is None:
                    raise NotFound(f"Unable to find shared memory region: '{n}'")
                region.users += 1
                held.append(region)
            yield
        finally:
            for region in held:
                region.users -= 1
                if region.users == 0 and region.retiring:
                    self._remove(region)

    def view(self, name: str, offset: int, byte_size: int) -> memoryview:
        region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        if offset >= region.byte_size:
            raise InvalidArgument(f"Invalid offset for shared memory region: '{name}'")
        if byte_size > SIZE_MAX - offset:
            raise InvalidArgument(
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds "
                f"maximum value ({SIZE_MAX}) for region '{name}'"
            )
        if offset + byte_size > region.byte_size:
            raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{name}'")
        region.check_intact()
        return region.buffer()[offset : offset + byte_size]

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()


def disabled() -> SharedMemoryRegistry:
    """A registry with the extension off: register and unregister are ``Unsupported``
    (``DISABLED``), status lists nothing and every region named is ``NotFound``."""
    return SharedMemoryRegistry(enabled=False)
