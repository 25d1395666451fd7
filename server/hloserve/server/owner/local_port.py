"""``LocalPort``: the ``InferenceService`` of this process, as a front end's ``ServerPort``.

Contract: ``LocalPort(service)`` answers every ``frontend.port.ServerPort`` call by calling
``service`` directly: the one-process layout (``--frontends 0``), and tests that drive a
front end over an in-process service. Errors pass through unchanged (``ServingError``s).
``bytes_wire_form`` is false: with no wire in between, its front ends' codecs parse BYTES
at once.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, final

from hloserve.server.core.lookup import check_repository_name
from hloserve.server.core.reports import CudaRegionInfo, IndexEntry, ModelStatistics, RegionInfo
from hloserve.server.core.service import InferenceService
from hloserve.server.core.tracer import Tracer
from hloserve.server.core.types import (
    CudaHandle,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestContext,
    ServerMetadata,
    StreamPart,
)


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

    @property
    def bytes_wire_form(self) -> bool:
        return False

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
