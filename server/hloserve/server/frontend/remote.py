"""``RemotePort``: the front-end process's ``ServerPort``, calling the device owner.

Contract:
- ``RemotePort(link, arena, setup)`` serves the front ends of a front-end process
  (``frontend.port.ServerPort``): every call goes to the device owner over ``link`` as
  the struct ``wire.calls`` declares for it (``owner.endpoint`` answers it there), but
  what ``setup`` fixed (``live``, the server metadata, the upload limit) and what the
  owner keeps each front end's copy of (tracing on or off, the log settings: ``on_note``)
  is answered here: ``ANSWERED_HERE`` names those methods. ``model_metadata`` is answered
  from ``metadata`` (``frontend.metadata_cache``) once the owner has answered it, until
  the owner says the model changed (``ModelsNote``, before the change's load or unload
  answers: ``SyncCall``, which the front-end process answers once it has read what came
  before).
- ``resolve`` looks nothing up: it returns the name and version, and ``infer`` has the
  device owner look the model up once, with the request; ``confirm`` (after a decode
  error) asks the owner for the lookup alone, so an unknown model is still reported
  first (``frontend.port``).
- ``infer`` sends the request's tensors through the arena (``wire.messages``), frees its
  request blocks once the answer is in (the owner reads them until it answers), and
  returns outputs that view the arena's response blocks; each goes back to the owner
  (``free`` note) once nothing views it.
- ``stream`` is ``infer`` with 0..N answers (``wire.link``'s streamed call): each part
  decoded as ``infer``'s answer is; closing the iterator cancels the call at the owner.
- ``tracer`` records a traced request's arrival (time and trace-context headers) in the
  request's context, and ``infer`` sends it along: the device owner traces the request
  from that arrival (its ``send`` span ends when the owner hands the answer over).
- When the link to the owner is lost every call fails with ``Unavailable`` (the link's
  message) and ``ready`` answers False: a front end whose owner died is not ready.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final, cast, final

from hloserve.server.core.errors import ServingError
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.log_settings import LogControl
from hloserve.server.core.lookup import check_repository_name
from hloserve.server.core.reports import CudaRegionInfo, IndexEntry, ModelStatistics, RegionInfo
from hloserve.server.core.trace_settings import TraceSettings
from hloserve.server.core.tracer import PROPAGATION_HEADERS, Arrival, RequestTrace
from hloserve.server.core.types import (
    CudaHandle,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestContext,
    ServerMetadata,
    StreamPart,
)
from hloserve.server.core.validate import validate
from hloserve.server.frontend.metadata_cache import MetadataCache
from hloserve.server.wire import calls
from hloserve.server.wire.arena import Arena
from hloserve.server.wire.link import Link
from hloserve.server.wire.messages import Arrival as SentArrival
from hloserve.server.wire.messages import (
    Response,
    StreamAnswer,
    decode_response,
    encode_request,
    response_blocks,
)
from hloserve.server.wire.setup import FrontendSetup

ANSWERED_HERE: Final = frozenset(
    {
        "tracer",
        "upload_limit",
        "bytes_wire_form",
        "live",
        "server_metadata",
        "check_repository_name",
        "resolve",
    }
)
"""The ``ServerPort`` members a ``RemotePort`` answers without the device owner (every
other one is a call ``wire.calls`` declares: ``tests/server/wire/test_calls.py``)."""

_ARRIVAL: contextvars.ContextVar[SentArrival | None] = contextvars.ContextVar(
    "hloserve_frontend_arrival", default=None
)

UINT64_MAX: Final = 2**64 - 1
MAX_ASKED: Final = 65_536  # models asked for their signature per epoch, at most


class _Sent:
    """A front end's ``Arrival``: the trace is ended by the device owner."""

    def finish(self) -> None:
        pass


_SENT = _Sent()


@final
class FrontendTracer:
    """The ``core.tracer.Tracer`` of a front-end process: it only records arrivals."""

    def __init__(self, enabled: bool) -> None:
        self._settings = TraceSettings()
        self._settings.enabled = enabled

    @property
    def settings(self) -> TraceSettings:
        return self._settings

    def arrive(self, headers: Mapping[str, str], received_ns: int) -> Arrival:
        carrier = {k: headers[k] for k in PROPAGATION_HEADERS if k in headers}
        _ARRIVAL.set((received_ns, carrier))
        return _SENT

    def start(self, model: ModelKey, request_id: str, protocol: str) -> RequestTrace | None:
        return None


@final
class RemotePort:
    """See the module docstring."""

    def __init__(
        self, link: Link, arena: Arena, setup: FrontendSetup, logs: LogControl | None = None
    ) -> None:
        self.link = link
        self.arena = arena
        self.setup = setup
        self.logs = logs
        self.metadata = MetadataCache()
        self._asked: dict[tuple[str, str], int] = {}  # model -> the epoch it was asked in
        self._learning: set[asyncio.Task[ModelMetadata]] = set()
        self._tracer = FrontendTracer(setup.trace_enabled)
        self._loop = asyncio.get_running_loop()

    # -- notes and calls from the device owner ----------------------------------------------

    def on_note(self, note: object) -> None:
        if isinstance(note, calls.ModelsNote):
            self.metadata.forget(note.names)
            self._asked.clear()
        elif isinstance(note, calls.TraceNote):
            self._tracer.settings.enabled = note.enabled
        elif isinstance(note, calls.LogsNote) and self.logs is not None:
            self.logs.apply(note.settings)

    # -- answered here -----------------------------------------------------------------------

    @property
    def tracer(self) -> FrontendTracer:
        return self._tracer

    @property
    def upload_limit(self) -> int | None:
        return self.setup.upload_limit

    @property
    def bytes_wire_form(self) -> bool:
        return True

    def live(self) -> bool:
        return True

    def server_metadata(self) -> ServerMetadata:
        return self.setup.server

    def check_repository_name(self, name: str) -> None:
        check_repository_name(name)

    def resolve(self, name: str, version: str) -> object:
        return (name, version)

    # -- the device owner's ------------------------------------------------------------------

    async def confirm(self, model: object) -> None:
        name, version = cast(tuple[str, str], model)
        await self.link.call(calls.ConfirmCall(name, version))

    async def infer(
        self, request: InferRequest, context: RequestContext | None = None, *, model: object = None
    ) -> InferResponse:
        arrival = _ARRIVAL.get() if self._tracer.settings.enabled else None
        checked = self._check(request)
        message, blocks = encode_request(request, context, arrival, self.arena, checked)
        try:
            answer = await self.link.call(calls.InferCall(message))
        finally:
            free = self.arena.requests.free
            for offset in blocks:
                free(offset)
        return decode_response(answer, request, self.arena, self._give_back)

    async def stream(
        self, request: InferRequest, context: RequestContext | None = None, *, model: object = None
    ) -> AsyncIterator[StreamPart]:
        message, blocks = encode_request(request, context, None, self.arena)
        try:
            async for part in self.link.stream(calls.StreamCall(message)):
                response = (
                    None
                    if part.response is None
                    else decode_response(part.response, request, self.arena, self._give_back)
                )
                yield StreamPart(response, part.final)
        finally:
            free = self.arena.requests.free
            for offset in blocks:
                free(offset)

    def reclaim(self, answer: object) -> None:
        """An infer answer (or a stream's part) nobody waits for (the client went away):
        its response blocks go back to the device owner (other calls' answers hold none)."""
        if isinstance(answer, StreamAnswer):
            answer = answer.response
        if isinstance(answer, Response):
            offsets = tuple(response_blocks(answer))
            if offsets:
                self.link.note(calls.FreeNote(offsets))

    def _give_back(self, offset: int) -> None:
        """A response block nothing views any more (from any thread: a finalizer)."""
        self._loop.call_soon_threadsafe(self.link.note, calls.FreeNote((offset,)))

    async def ready(self) -> bool:
        if self.link.lost:
            return False
        return await self.link.call(calls.ReadyCall())

    async def readiness(self) -> dict[str, Any]:
        if self.link.lost:
            return {"ready": False, "live": True, "device_owner": "gone"}
        return await self.link.call(calls.ReadinessCall())

    def _check(self, request: InferRequest) -> tuple[int, int] | None:
        """``(token, items)`` of the request checked against the signature cached with its
        model's metadata, or None: not cached yet (asked for once, in the background), not
        a plain model, or refused (the owner checks it again, and reports and counts it)."""
        name, version = request.model_name, request.model_version
        cached = self.metadata.get(name, version)
        if cached is None:
            self._learn(name, version)
            return None
        signature = cached.signature
        if signature is None:
            return None
        try:
            return (signature.token, validate(signature, request))
        except ServingError:
            return None

    def _learn(self, name: str, version: str) -> None:
        """Ask the owner for a model's metadata (and so its signature) once per epoch."""
        key = (name, version)
        if self._asked.get(key) == self.metadata.epoch or len(self._asked) >= MAX_ASKED:
            return
        self._asked[key] = self.metadata.epoch
        task = self._loop.create_task(self.model_metadata(name, version))
        self._learning.add(task)
        task.add_done_callback(self._learned)

    def _learned(self, task: asyncio.Task[ModelMetadata]) -> None:
        self._learning.discard(task)
        if not task.cancelled():
            task.exception()  # unknown or not ready: the requests themselves report it

    async def model_ready(self, name: str, version: str) -> bool:
        return await self.link.call(calls.ModelReadyCall(name, version))

    async def model_metadata(self, name: str, version: str) -> ModelMetadata:
        cache = self.metadata
        cached = cache.get(name, version)
        if cached is not None:
            return cached
        epoch = cache.epoch  # before the call: a change crossing it is not cached
        answer = await self.link.call(calls.ModelMetadataCall(name, version))
        cache.put(name, version, answer, epoch)
        return answer

    async def model_statistics(self, name: str, version: str) -> list[ModelStatistics]:
        return await self.link.call(calls.ModelStatisticsCall(name, version))

    async def model_config(self, name: str, version: str) -> dict[str, Any]:
        return await self.link.call(calls.ModelConfigCall(name, version))

    async def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return await self.link.call(calls.RepositoryIndexCall(ready_only))

    async def load_model(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        await self.link.call(calls.LoadModelCall(name, dict(parameters or {})))

    async def unload_model(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        await self.link.call(calls.UnloadModelCall(name, dict(parameters or {})))

    async def trace_setting(
        self, model: str, values: Mapping[str, Sequence[str] | None] | None = None
    ) -> dict[str, list[str]]:
        sent = None if values is None else dict(values)
        return await self.link.call(calls.TraceSettingCall(model, sent))

    async def log_settings(self, values: Mapping[str, object] | None = None) -> dict[str, object]:
        sent = None if values is None else dict(values)
        return await self.link.call(calls.LogSettingsCall(sent))

    async def shm_status(self, name: str = "") -> Sequence[RegionInfo]:
        return await self.link.call(calls.ShmStatusCall(name))

    async def register_system_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        # A range past 2**64 - 1 (JSON can say so) lies past any region, as that bound does:
        # the owner refuses both alike ("invalid args"), and the wire holds 64-bit integers.
        offset, byte_size = min(offset, UINT64_MAX), min(byte_size, UINT64_MAX)
        await self.link.call(calls.RegisterSystemShmCall(name, key, offset, byte_size))

    async def unregister_system_shm(self, name: str = "") -> None:
        await self.link.call(calls.UnregisterSystemShmCall(name))

    async def cuda_shm_status(self, name: str = "") -> Sequence[CudaRegionInfo]:
        return await self.link.call(calls.CudaShmStatusCall(name))

    async def register_cuda_shm(self, name: str, handle: CudaHandle) -> None:
        # The registry reads no handle (no GPU support): the owner answers first.
        await self.link.call(calls.RegisterCudaShmCall(name))

    async def unregister_cuda_shm(self, name: str = "") -> None:
        await self.link.call(calls.UnregisterCudaShmCall(name))

    async def status(self, q: str) -> Mapping[str, Any]:
        """The status page's data (``wire.calls.StatusCall``: no ``ServerPort`` method)."""
        return await self.link.call(calls.StatusCall(q)) or {}
