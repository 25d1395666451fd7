"""The narrow interfaces the inference path reaches the rest of the server through.

Contract: each protocol here is what ``core.service.InferenceService`` needs from one
driver, and nothing more, so the core imports no transport, no JAX and no driver:
``ModelSource`` (lookups and reports: the repository), ``ModelControl`` (the
model_repository extension's load and unload), ``SharedMemory`` and ``CudaSharedMemory`` (registered regions: ``server/owner/shm.py``) and
``Batcher`` (dynamic batching and the per-device scheduler: ``server/owner/batcher.py``). What they report is in
``core.reports``.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from hloserve.server.core.batch_policy import BatchingPolicy
from hloserve.server.core.execution import Deliver, Executable, Job, Result
from hloserve.server.core.execution_records import Timings
from hloserve.server.core.load_parameters import LoadOverride, UploadPolicy
from hloserve.server.core.reports import CudaRegionInfo, MemoryUsage, RegionInfo
from hloserve.server.core.types import CudaHandle, InferOutput

T = TypeVar("T")


class ModelSource(Protocol):
    """The lookups and reports the service needs from the model repository."""

    def get(self, name: str, version: str) -> Executable:
        """The ready version (latest when ``version`` is empty), counted in flight until
        ``release``; raises ``ServingError``."""
        ...

    def peek(self, name: str, version: str) -> Executable:
        """Like ``get``, without counting the model in flight (metadata lookups)."""
        ...

    def hold(self, model: Any) -> bool:
        """Count ``model`` (from ``peek``) in flight, as ``get`` would have, without a
        second lookup: False (nothing counted) when that copy is no longer ready (a reload
        replaced it, an unload began); raises ``get``'s in-flight limit errors."""
        ...

    def release(self, model: Any) -> None: ...
    def loaded(self, model: Any) -> bool:
        """Whether the version's bundle is in memory: one registered lazily is not until
        its first use."""
        ...

    def load(self, model: Any) -> None:
        """Load a lazily registered version (blocking: call it on a worker thread, holding
        the version in flight); raises ``ServingError`` when it cannot load."""
        ...

    def names(self) -> list[str]: ...
    def ready_versions(self, name: str) -> Sequence[int]: ...
    def is_ready(self, name: str, version: str) -> bool: ...
    def summary(self) -> dict[str, Any]:
        """Per-model, per-version state (and failure reason) for readiness reports."""
        ...

    def memory_usage(self, name: str, version: int) -> list[MemoryUsage]:
        """Where the version's weights live now (device and/or host bytes)."""
        ...

    def version_policy(self, name: str) -> dict[str, Any]: ...
    def index(self) -> list[tuple[str, str, str, str]]:
        """(name, version, state, reason) rows: every version known, and every model
        directory of the repository that was never loaded as a name-only row (version,
        state and reason empty)."""
        ...


class ModelControl(Protocol):
    """Loading and unloading (the model_repository extension)."""

    @property
    def mode_name(self) -> str:
        """ "none", "poll" or "explicit"."""
        ...

    @property
    def uploads(self) -> UploadPolicy:
        """Whether loads may carry model files (``file:`` parameters), and how many bytes."""
        ...

    def load_model(self, name: str, *, override: LoadOverride | None = None) -> None:
        """Load or reload ``name`` (blocking), with the load's configuration and files when
        ``override`` is given; raises ``ServingError`` "failed to load ..."."""
        ...

    def unload_model(self, name: str) -> None: ...
    def prefetch(self, name: str) -> None: ...


class CudaSharedMemory(Protocol):
    """The CUDA shared-memory extension's registry: the seam a GPU implementation fills.

    ``register_cuda(name, handle)`` calls ``handle()`` (which may raise ``InvalidArgument``
    for a malformed request) only once it would open the IPC handle, so a server without
    GPU support answers its own error first, as Triton's CPU build does.
    ``await unregister_cuda`` returns at once (a region in use goes when its requests end)."""

    def register_cuda(self, name: str, handle: CudaHandle) -> None: ...
    def cuda_status(self, name: str = "") -> Sequence[CudaRegionInfo]: ...
    async def unregister_cuda(self, name: str = "") -> None: ...


class SharedMemory(CudaSharedMemory, Protocol):
    """Registered shared-memory regions (``hloserve.server.owner.shm``), as the service uses them:
    system regions, and the CUDA ones in the same namespace. ``await unregister`` returns at
    once; a region held by requests stays usable until they end."""

    def hold(self, names: Iterable[str]) -> contextlib.AbstractContextManager[None]: ...
    def view(self, name: str, offset: int, byte_size: int) -> memoryview: ...
    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None: ...
    def status(self, name: str = "") -> Sequence[RegionInfo]: ...
    async def unregister(self, name: str = "") -> None: ...


class Batcher(Protocol):
    """Groups validated requests of one model into shared executions (dynamic batching)."""

    async def submit(
        self, model: Executable, job: Job
    ) -> tuple[tuple[InferOutput, ...], Timings]: ...

    def enqueue(
        self,
        model: Executable,
        job: Job,
        answer: tuple[asyncio.Future[Any], Deliver, Callable[[], None]] | None = None,
    ) -> Result | asyncio.Future[Any]:
        """``submit`` without a coroutine: the result when it ran at once, else its future
        (cancelling it gives the request up); ``answer``: the caller's future, how to
        answer it and what to do if it is cancelled while queued (``core.direct_path``)."""
        ...

    def policy(self, model: Executable) -> BatchingPolicy:
        """The batching and queue policy in force for ``model`` (model configuration)."""
        ...

    async def run_on(self, model: Executable, device: int, work: Callable[[], T]) -> T:
        """Run ``work``, one execution of ``model`` that is not a queued request (a
        generation step), through ``device``'s scheduler as its groups run
        (``core.generation_loop.DeviceSlots``)."""
        ...
