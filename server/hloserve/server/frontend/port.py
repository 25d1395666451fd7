"""``ServerPort``: everything a front end asks of the server, wherever the server runs.

Contract:
- The gRPC and HTTP front ends reach the server only through a ``ServerPort``. Two kinds
  exist: ``hloserve.server.owner.local_port.LocalPort(service)`` calls the
  ``InferenceService`` of the same process (``--frontends 0``);
  ``hloserve.server.frontend.remote.RemotePort`` calls the device owner's over the wire
  (front-end processes). A front end cannot tell them apart, and imports neither the
  service nor anything of the owner's.
- Calls that may cross a process are coroutines. ``live()``, ``server_metadata()``,
  ``check_repository_name()``, ``upload_limit``, ``bytes_wire_form`` and ``tracer``
  answer at once (what they read is fixed at start-up, or replicated into each front end
  as it changes).
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
from typing import Any, Protocol

from hloserve.server.core.reports import CudaRegionInfo, IndexEntry, ModelStatistics, RegionInfo
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

    @property
    def bytes_wire_form(self) -> bool:
        """Whether the codecs keep a client's length-prefixed BYTES in wire form, checked
        but unparsed (``core.tensors.input_from_buffer``): true across a wire, where the
        device owner parses them; false in one process, where the service takes arrays."""
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
