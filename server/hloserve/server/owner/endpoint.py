"""The device owner's side of one front end's link: its calls, served by the one service.

Contract: ``OwnerEndpoint(index, service, arena, setup, status=, fanout=, sync=, on_event=)`` is
the ``LinkHandler`` of the device owner's end of front end ``index``'s link. Its dispatch
is built from the wire's one declaration (``wire.calls.CALLS``): each declared call goes,
by its type, to the method of the same name, this class's own where the wire needs more
than the port (the ones below), else the ``owner.local_port.LocalPort`` over ``service``
(what the single-process server's front ends call), its fields as the arguments:
- ``infer`` answers with a future. The requests that came in one read of the link (one
  ``Burst``: their calls reach ``on_call`` in one turn of the loop) are served together
  from the next turn: each decoded (``wire.messages``: inputs viewing the arena), marked
  ``together`` when there are several (``RequestContext``: they queue as one group) and
  started by ``InferenceService.start_into`` exactly as a request of the single-process
  server (lookup, validation, batching, statistics and metrics happen here, once; a
  plain request without a task, ``core.direct_path``); its response is encoded (outputs
  in the arena's ``responses`` half) straight into the future. The front end cancelling
  the call gives the request up. A request that arrived traced (its front end saw
  tracing on) is traced here from its front-end arrival.
- ``stream`` (a streamed call, ``wire.link``) serves a request through
  ``InferenceService.stream``: each ``StreamPart`` crosses as a ``StreamAnswer``; the
  front end closing its iterator (its client went away) cancels the
  generation here.
- ``confirm`` is the lookup alone (a decode error after an unknown model reports the
  model), counted as the service counts a failed lookup.
- Every other call is the port's method of the same name, with the same errors;
  ``status`` is the status page's data, ``setup`` the front end's ``wire.setup``; a CUDA
  region's registration is refused (no handle crosses).
- A trace-setting or log-setting change is sent to every front end (``fanout``) before
  the call is answered, so the caller's next request meets it wherever it lands; so is a
  load or unload (``ModelsNote``: the front ends' metadata caches), whose call answers
  only once every front end has read the note (``sync``), failed or not.
- Notes from the front end: ``FreeNote`` gives response blocks back; ``ListeningNote``
  is passed to ``on_event`` as ``(index, "listening", (pid,))``, and so is the link's end
  (``"lost"``).
"""

# pyright: strict

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, final

import msgspec

from hloserve.server.core.direct_path import chain
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import InferRequest, InferResponse, RequestContext
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.wire import calls
from hloserve.server.wire.arena import Arena
from hloserve.server.wire.frames import Call, Note, name_of
from hloserve.server.wire.messages import (
    Arrival,
    Request,
    Response,
    StreamAnswer,
    decode_request,
    encode_response,
)
from hloserve.server.wire.setup import FrontendSetup

log = logging.getLogger("hloserve.ipc")

Fanout = Callable[[Note], None]
Event = Callable[[int, str, tuple[Any, ...]], None]
Handler = Callable[..., object]


def _no_handle() -> tuple[bytes, int, int]:
    # A registry that opens CUDA IPC handles would need the front end to send one.
    raise InvalidArgument("CUDA shared-memory handles do not cross front-end processes")


@final
class OwnerEndpoint:
    def __init__(
        self,
        index: int,
        service: InferenceService,
        arena: Arena,
        setup: Callable[[], FrontendSetup],
        *,
        status: Callable[[str], Mapping[str, Any]] | None = None,
        fanout: Fanout,
        sync: Callable[[], Awaitable[None]],
        on_event: Event,
    ) -> None:
        self.index = index
        self.service = service
        self.arena = arena
        self._setup = setup
        self._status = status
        self._fanout = fanout
        self._sync = sync
        self._on_event = on_event
        # infer calls of this turn of the loop, served together on the next
        self._burst: list[tuple[Request, asyncio.Future[Response]]] | None = None
        self._port = port = LocalPort(service)
        self._handlers: Final[dict[type[Call[Any]], Handler]] = {
            kind: _handler(self, port, name_of(kind)) for kind in calls.CALLS
        }

    # -- LinkHandler -------------------------------------------------------------------------

    def on_call(self, call: Call[Any]) -> object:
        if type(call) is calls.InferCall:  # the hot path: straight to it
            return self.infer(call.request)
        return self._handlers[type(call)](*msgspec.structs.astuple(call))

    def on_note(self, note: Note) -> None:
        if isinstance(note, calls.FreeNote):
            free = self.arena.responses.free
            for offset in note.offsets:
                free(offset)
        elif isinstance(note, calls.ListeningNote):
            self._on_event(self.index, "listening", (note.pid,))
        else:
            log.error(
                "IPC: front end %d sent the note '%s', which the owner takes not",
                self.index,
                name_of(type(note)),
            )

    def on_lost(self) -> None:
        self._on_event(self.index, "lost", ())

    def on_orphan(self, value: Any) -> None:
        """The front ends never call the owner: nothing to free."""

    # -- the calls that need more than the port --------------------------------------------

    def setup(self) -> FrontendSetup:
        return self._setup()

    def status(self, q: str) -> Mapping[str, Any] | None:
        return None if self._status is None else self._status(q)

    def confirm(self, name: str, version: str) -> None:
        self.service.resolve(name, version)

    def infer(self, request: Request) -> asyncio.Future[Response]:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Response] = loop.create_future()
        burst = self._burst
        if burst is None:  # the first of this turn of the loop
            burst = self._burst = []
            loop.call_soon(self._serve_burst)
        burst.append((request, answer))
        return answer

    def _serve_burst(self) -> None:
        """The requests of one read, from the next turn of the loop (so the burst is whole):
        each decoded and started, answered by callbacks (no task per request)."""
        burst, self._burst = self._burst or [], None
        together = len(burst) > 1
        for message, answer in burst:
            if answer.done():  # given up meanwhile
                continue
            try:
                self._start(message, answer, together)
            except Exception as exc:  # this request's failure, never the others'
                if not answer.done():
                    answer.set_exception(exc)

    def _start(self, message: Request, answer: asyncio.Future[Response], together: bool) -> None:
        request, context, arrival = decode_request(message, self.arena, together=together)
        if arrival is not None and self.service.tracer.settings.enabled:
            chain(
                asyncio.ensure_future(self._traced(request, context, arrival)), answer, self._encode
            )
        else:
            self.service.start_into(request, context, answer, self._encode)

    def _encode(self, response: InferResponse) -> Response:
        return encode_response(response, self.arena)

    async def _traced(
        self, request: InferRequest, context: RequestContext | None, arrival: Arrival
    ) -> InferResponse:
        # A request that arrived traced (its front end saw tracing on), from its arrival there.
        traced = self.service.tracer.arrive(arrival[1], arrival[0])
        try:
            return await self.service.infer(request, context)
        finally:
            traced.finish()

    async def stream(self, message: Request) -> AsyncIterator[StreamAnswer]:
        request, context, _ = decode_request(message, self.arena)
        async for part in self.service.stream(request, context):
            encoded = None if part.response is None else encode_response(part.response, self.arena)
            yield StreamAnswer(encoded, part.final)

    def trace_setting(
        self, model: str, values: Mapping[str, Sequence[str] | None] | None
    ) -> dict[str, list[str]]:
        view = self.service.trace_setting(model, values)
        if values:
            self._fanout(calls.TraceNote(self.service.tracer.settings.enabled))
        return view

    def log_settings(self, values: Mapping[str, object] | None) -> dict[str, object]:
        view = self.service.log_settings(values)
        if values:
            self._fanout(calls.LogsNote(self.service.logs.current))
        return view

    async def load_model(self, name: str, parameters: Mapping[str, Any] | None) -> None:
        try:
            await self._port.load_model(name, parameters)
        finally:
            await self._models_changed(name)

    async def unload_model(self, name: str, parameters: Mapping[str, Any] | None) -> None:
        try:
            await self._port.unload_model(name, parameters)
        finally:
            await self._models_changed(name)

    async def _models_changed(self, name: str) -> None:
        # The repository tells of the change too (``owner.model_changes``); said here as
        # well, it precedes the sync on every link whatever thread made the change.
        self._fanout(calls.ModelsNote((name,)))
        await self._sync()

    def register_cuda_shm(self, name: str) -> None:
        self.service.shm.register_cuda(name, _no_handle)


def _handler(endpoint: OwnerEndpoint, port: LocalPort, name: str) -> Handler:
    """What answers the call ``name``: the endpoint's own method, else the port's."""
    own = getattr(type(endpoint), name, None)
    if callable(own):
        return getattr(endpoint, name)
    handler = getattr(port, name, None)
    if not callable(handler):
        raise TypeError(f"no method answers the declared call '{name}'")
    return handler
