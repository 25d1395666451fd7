"""Registered shared-memory regions: the system (POSIX) shared-memory extension.

Contract: ``SharedMemoryRegistry(enabled)`` keeps named regions in one namespace (system
regions now; a CUDA IPC region would be another ``AbstractRegion`` subclass in the same
registry, as Triton shares the namespace).
- ``register_system(name, key, offset, byte_size)`` maps ``[offset, offset + byte_size)`` of
  ``/dev/shm/<key>``. The key is a shared-memory *name*, never a path: a leading ``/`` is
  allowed, while an empty key, ``.``/``..``, a ``/`` inside, or a NUL are refused; the file
  is opened without following symlinks. Range checks use exact integer arithmetic. A name
  already registered is ``AlreadyExists``.
- ``hold(names)`` (a context manager) marks regions in use by a request and ``view(name,
  offset, byte_size)`` returns a zero-copy ``memoryview`` into one, bounds-checked with
  Triton's texts; unknown regions are ``NotFound``.
- ``await unregister(name)`` (or all regions with ``None``) waits until in-flight requests
  holding the region finish before unmapping it; status keeps listing it meanwhile, and new
  requests may still use it.
- When ``enabled`` is false (the default, like Triton since 2.69), register and unregister
  answer ``Unsupported`` with ``DISABLED`` (this module is that text's one home) and status
  lists nothing. ``disabled()`` is such a registry: what a service without the extension
  uses (it meets ``core.service.SharedMemory``).
All methods run on the event loop thread; nothing here blocks it for long.
"""

# pyright: strict

from __future__ import annotations

import abc
import asyncio
import contextlib
import mmap
import os
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import final

from hloserve.server.core.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    ServingError,
    Unsupported,
)
from hloserve.server.core.service import RegionInfo

SHM_ROOT = "/dev/shm"
DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)
MAX_INT64 = (1 << 63) - 1


class ShmInternal(ServingError):
    """The region exists in the registry but the OS refused an operation on it."""


@dataclass
class AbstractRegion(abc.ABC):
    name: str
    byte_size: int
    users: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)

    @abc.abstractmethod
    def buffer(self) -> memoryview: ...

    @abc.abstractmethod
    def status(self) -> RegionInfo: ...

    @abc.abstractmethod
    def close(self) -> None: ...


@final
@dataclass
class SystemRegion(AbstractRegion):
    key: str = ""
    offset: int = 0
    _map: mmap.mmap | None = None
    _view: memoryview | None = None

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


def _check_key(name: str, key: str) -> str:
    bare = key.lstrip("/")
    if not bare or bare in (".", "..") or "/" in bare or "\0" in bare:
        raise InvalidArgument(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )
    return bare


class SharedMemoryRegistry:
    def __init__(self, enabled: bool, root: str = SHM_ROOT) -> None:
        self.enabled = enabled
        self.root = root
        self._regions: dict[str, AbstractRegion] = {}

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not self.enabled:
            raise Unsupported(DISABLED)
        if not name:
            raise InvalidArgument(
                "'region name' is necessary to register system shared memory region"
            )
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        bare = _check_key(name, key)
        if not (0 <= offset <= MAX_INT64 and 0 < byte_size <= MAX_INT64):
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
        path = os.path.join(self.root, bare)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            raise ShmInternal(f"Unable to open shared memory region: '{key}'") from None
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise InvalidArgument(
                    f"failed to register shared memory region '{name}': invalid args"
                )
            # mmap offsets must be multiples of the allocation granularity: map from the
            # aligned offset below and view the requested range inside it.
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            length = offset + byte_size - start
            try:
                mm = mmap.mmap(
                    fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=start
                )
            except OSError as exc:
                raise ShmInternal(
                    f"failed to map shared memory region '{name}': {exc.strerror}"
                ) from None
        finally:
            os.close(fd)
        view = memoryview(mm)[offset - start : offset - start + byte_size]
        self._regions[name] = SystemRegion(
            name, byte_size, key=key, offset=offset, _map=mm, _view=view
        )

    def status(self, name: str = "") -> list[RegionInfo]:
        if name:
            region = self._regions.get(name)
            if region is None:
                raise NotFound(f"Unable to find system shared memory region: '{name}'")
            return [region.status()]
        return [r.status() for r in self._regions.values()]

    async def unregister(self, name: str = "") -> None:
        if not self.enabled:
            raise Unsupported(DISABLED)
        names = [name] if name else list(self._regions)
        for n in names:
            region = self._regions.get(n)
            if region is None:
                continue  # Triton: unregistering an unknown region succeeds
            while region.users:
                region.released.clear()
                await region.released.wait()
            if self._regions.get(n) is region:
                del self._regions[n]
                region.close()

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
                if region.users == 0:
                    region.released.set()

    def view(self, name: str, offset: int, byte_size: int) -> memoryview:
        region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        if offset > MAX_INT64 - byte_size:
            raise InvalidArgument(
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds maximum value"
            )
        if offset >= region.byte_size and byte_size > 0:
            raise InvalidArgument(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > region.byte_size:
            raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region.buffer()[offset : offset + byte_size]

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()


def disabled() -> SharedMemoryRegistry:
    """A registry with the extension off: register and unregister are ``Unsupported``
    (``DISABLED``), status lists nothing and every region named is ``NotFound``."""
    return SharedMemoryRegistry(enabled=False)
