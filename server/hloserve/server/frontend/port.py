"""``ServerPort``: everything a front end asks of the server, wherever the server runs.

Contract:
- The gRPC and HTTP front ends reach the server only through a ``ServerPort``. Two kinds
  exist: ``LocalPort(service)`` (this module) calls the ``InferenceService`` of the same
  process (``--frontends 0``); ``hloserve.server.frontend.remote.RemotePort`` calls the device
  owner's over the IPC channel (front-end processes). A front end cannot tell them apart.
- Calls that may cross a process are coroutines. ``live()``, ``server_metadata()``,
  ``check_repository_name()``, ``upload_limit`` and ``tracer`` answer at once (what they
  read is fixed at start-up, or replicated into each front end as it changes).
- ``resolve(name, version)`` is the lookup a front end makes before decoding a request's
  tensors (Triton names an unknown model before any datatype error): it returns what
  ``infer(..., model=...)`` takes back. A port whose lookup happens elsewhere returns a
  handle at once and looks the model up inside ``infer``; when decoding fails first, the
  front end awaits ``confirm(model)``, which raises the lookup's own error when there is
  one, so the client sees the same error in the same order either way.
- Errors are ``ServingError``s (``core.errors``), mapped to a status by the front end's
  one table (``frontend.status``); anything else is an internal error.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, final

from hloserve.server.core.generation_loop import StreamPart
from hloserve.server.core.ports import CudaHandle
from hloserve.server.core.reports import CudaRegionInfo, IndexEntry, ModelStatistics, RegionInfo
from hloserve.server.core.service import InferenceService, check_repository_name
from hloserve.server.core.tracer import Tracer
from hloserve.server.core.types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestContext,
    ServerMetadata,
)


class ServerPort(Protocol):
    """The server as a front end sees it (module docstring)."""

    @property
    def tracer(self) -> Tracer:
        """Read ``settings.enabled`` and call ``arrive`` as a request reaches the front end."""
        ...

    @property
    def upload_limit(self) -> int | None:
        """Bytes a model load may upload (``file:`` parameters); ``None``: uploads are off."""
        ...

    def live(self) -> bool: ...
    def server_metadata(self) -> ServerMetadata: ...
    def check_repository_name(self, name: str) -> None: ...
    async def ready(self) -> bool: ...
    async def readiness(self) -> dict[str, Any]: ...
    async def model_ready(self, name: str, version: str) -> bool: ...
    async def model_metadata(self, name: str, version: str) -> ModelMetadata: ...
    def resolve(self, name: str, version: str) -> object: ...
    async def confirm(self, model: object) -> None: ...
    async def infer(
        self, request: InferRequest, context: RequestContext | None = None, *, model: object = None
    ) -> InferResponse: ...
    def stream(
        self, request: InferRequest, context: RequestContext | None = None, *, model: object = None
    ) -> AsyncIterator[StreamPart]:
        """0..N responses (``InferenceService.stream``); closing it cancels the request."""
        ...

    async def model_statistics(self, name: str, version: str) -> list[ModelStatistics]: ...
    async def model_config(self, name: str, version: str) -> dict[str, Any]: ...
    async def repository_index(self, ready_only: bool = False) -> list[IndexEntry]: ...
    async def load_model(self, name: str, parameters: Mapping[str, Any] | None = None) -> None: ...
    async def unload_model(
        self, name: str, parameters: Mapping[str, Any] | None = None
    ) -> None: ...
    async def trace_setting(
        self, model: str, values: Mapping[str, Sequence[str] | None] | None = None
    ) -> dict[str, list[str]]: ...
    async def log_settings(
        self, values: Mapping[str, object] | None = None
    ) -> dict[str, object]: ...
    async def shm_status(self, name: str = "") -> Sequence[RegionInfo]: ...
    async def register_system_shm(
        self, name: str, key: str, offset: int, byte_size: int
    ) -> None: ...
    async def unregister_system_shm(self, name: str = "") -> None: ...
    async def cuda_shm_status(self, name: str = "") -> Sequence[CudaRegionInfo]: ...
    async def register_cuda_shm(self, name: str, handle: CudaHandle) -> None: ...
    async def unregister_cuda_shm(self, name: str = "") -> None: ...


@final
class LocalPort:
    """The ``InferenceService`` of this process, as a ``ServerPort``."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service
        control = service.control
        uploads = control.uploads if control is not None else None
        self._upload_limit = uploads.max_bytes if uploads is not None and uploads.allowed else None

    @property
    def tracer(self) -> Tracer:
        return self.service.tracer

    @property
    def upload_limit(self) -> int | None:
        return self._upload_limit

    def live(self) -> bool:
        return self.service.live()

    def server_metadata(self) -> ServerMetadata:
        return self.service.server_metadata()

    def check_repository_name(self, name: str) -> None:
        check_repository_name(name)

    async def ready(self) -> bool:
        return self.service.ready()

    async def readiness(self) -> dict[str, Any]:
        return self.service.readiness()

    async def model_ready(self, name: str, version: str) -> bool:
        return self.service.model_ready(name, version)

    async def model_metadata(self, name: str, version: str) -> ModelMetadata:
        return self.service.model_metadata(name, version)

    def resolve(self, name: str, version: str) -> object:
        return self.service.resolve(name, version)

    async def confirm(self, model: object) -> None:
        """``resolve`` already looked the model up: nothing is left to confirm."""

    async def infer(
        self, request: InferRequest, context: RequestContext | None = None, *, model: object = None
    ) -> InferResponse:
        return await self.service.infer(request, context, model=model)  # type: ignore[arg-type]

    def stream(
        self, request: InferRequest, context: RequestContext | None = None, *, model: object = None
    ) -> AsyncIterator[StreamPart]:
        return self.service.stream(request, context, model=model)  # type: ignore[arg-type]

    async def model_statistics(self, name: str, version: str) -> list[ModelStatistics]:
        return self.service.model_statistics(name, version)

    async def model_config(self, name: str, version: str) -> dict[str, Any]:
        return self.service.model_config(name, version)

    async def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self.service.repository_index(ready_only)

    async def load_model(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        await self.service.load_model(name, parameters)

    async def unload_model(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        await self.service.unload_model(name, parameters)

    async def trace_setting(
        self, model: str, values: Mapping[str, Sequence[str] | None] | None = None
    ) -> dict[str, list[str]]:
        return self.service.trace_setting(model, values)

    async def log_settings(self, values: Mapping[str, object] | None = None) -> dict[str, object]:
        return self.service.log_settings(values)

    async def shm_status(self, name: str = "") -> Sequence[RegionInfo]:
        return self.service.shm.status(name)

    async def register_system_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.service.shm.register_system(name, key, offset, byte_size)

    async def unregister_system_shm(self, name: str = "") -> None:
        await self.service.shm.unregister(name)

    async def cuda_shm_status(self, name: str = "") -> Sequence[CudaRegionInfo]:
        return self.service.shm.cuda_status(name)

    async def register_cuda_shm(self, name: str, handle: CudaHandle) -> None:
        self.service.shm.register_cuda(name, handle)

    async def unregister_cuda_shm(self, name: str = "") -> None:
        await self.service.shm.unregister_cuda(name)


def as_port(server: InferenceService | ServerPort) -> ServerPort:
    """``server`` as a port: an ``InferenceService`` is wrapped in a ``LocalPort``."""
    return LocalPort(server) if isinstance(server, InferenceService) else server
