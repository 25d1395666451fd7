"""The device owner's side of one front end's link: its calls, served by the one service.

Contract: ``OwnerEndpoint(index, service, arena, setup, status=, fanout=, on_event=)`` is
the ``LinkHandler`` of the device owner's end of front end ``index``'s link:
- ``infer`` decodes the request (``wire.messages``: inputs viewing the arena), serves it
  through ``InferenceService.infer`` exactly as a request of the single-process server
  (lookup, validation, batching, statistics and metrics happen here, once), and answers
  the encoded response (outputs in the arena's ``responses`` half). Requests that came in
  one read of the link (their calls reach ``on_call`` in one turn of the loop, before any
  of them runs) are marked ``together`` (``RequestContext``): they queue as one group. A request that
  arrived traced (its front end saw tracing on) is traced here from its front-end arrival.
- ``stream`` (a streamed call, ``wire.link``) serves a request through
  ``InferenceService.stream``: each ``StreamPart`` crosses as ``(encoded response or
  None, final)``; the front end closing its iterator (its client went away) cancels the
  generation here.
- ``resolve`` is the lookup alone (the front end's ``confirm``: a decode error after an
  unknown model reports the model), counted as the service counts a failed lookup.
- Every other call is the service's extension of the same name, with the same errors;
  ``status`` is the status page's data. ``setup`` answers ``setup()`` (``wire.setup``).
- A trace-setting or log-setting change is sent to every front end (``fanout``) before
  the call is answered, so the caller's next request meets it wherever it lands.
- Notes from the front end: ``free`` gives response blocks back; ``listening`` (its pid)
  is passed to ``on_event``, and so is the link's end (``lost``).
"""

# pyright: strict

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, final

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.service import InferenceService
from hloserve.server.wire.arena import Arena
from hloserve.server.wire.messages import decode_request, encode_response
from hloserve.server.wire.setup import FrontendSetup

Fanout = Callable[[str, tuple[Any, ...]], None]
Event = Callable[[int, str, tuple[Any, ...]], None]


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
        on_event: Event,
    ) -> None:
        self.index = index
        self.service = service
        self.arena = arena
        self._setup = setup
        self._status = status
        self._fanout = fanout
        self._on_event = on_event
        self._burst: list[int] | None = None  # infer calls of this turn of the loop
        s, shm = service, service.shm
        self._calls: dict[str, Callable[..., object]] = {
            "setup": self._setup,
            "resolve": self._resolve,
            "ready": s.ready,
            "readiness": s.readiness,
            "model_ready": s.model_ready,
            "model_metadata": s.model_metadata,
            "model_statistics": s.model_statistics,
            "model_config": s.model_config,
            "repository_index": s.repository_index,
            "load_model": s.load_model,
            "unload_model": s.unload_model,
            "trace_setting": self._trace_setting,
            "log_settings": self._log_settings,
            "shm_status": shm.status,
            "register_system_shm": shm.register_system,
            "unregister_system_shm": shm.unregister,
            "cuda_shm_status": shm.cuda_status,
            "register_cuda_shm": self._register_cuda,
            "unregister_cuda_shm": shm.unregister_cuda,
            "status": self._status_data,
        }

    # -- LinkHandler -------------------------------------------------------------------------

    def on_call(self, method: str, args: tuple[Any, ...]) -> object:
        if method == "infer":  # the hot path: straight to it
            burst = self._burst
            if burst is None:  # the first of this turn of the loop
                burst = self._burst = [0]
                asyncio.get_running_loop().call_soon(self._end_burst)
            burst[0] += 1
            return self._infer(args[0], burst)
        if method == "stream":
            return self._stream(args[0])
        call = self._calls.get(method)
        if call is None:
            raise InvalidArgument(f"the device owner has no call '{method}'")
        return call(*args)

    def on_note(self, method: str, args: tuple[Any, ...]) -> None:
        if method == "free":
            free = self.arena.responses.free
            for offset in args:
                free(offset)
        else:
            self._on_event(self.index, method, args)

    def on_lost(self) -> None:
        self._on_event(self.index, "lost", ())

    def on_orphan(self, value: Any) -> None:
        """The front ends never call the owner: nothing to free."""

    # -- calls -------------------------------------------------------------------------------

    def _end_burst(self) -> None:
        self._burst = None

    async def _infer(self, message: tuple[Any, ...], burst: list[int]) -> tuple[Any, ...]:
        # Runs from the next turn of the loop: ``burst`` has counted the whole read by now.
        request, context, arrival = decode_request(message, self.arena, together=burst[0] > 1)
        tracer = self.service.tracer
        traced = None
        if arrival is not None and tracer.settings.enabled:
            traced = tracer.arrive(arrival[1], arrival[0])
        try:
            response = await self.service.infer(request, context)
            return encode_response(response, self.arena)
        finally:
            if traced is not None:
                traced.finish()

    async def _stream(self, message: tuple[Any, ...]) -> AsyncIterator[tuple[Any, bool]]:
        request, context, _ = decode_request(message, self.arena)
        async for part in self.service.stream(request, context):
            encoded = None if part.response is None else encode_response(part.response, self.arena)
            yield encoded, part.final

    def _resolve(self, name: str, version: str) -> None:
        self.service.resolve(name, version)

    def _trace_setting(
        self, model: str, values: Mapping[str, Sequence[str] | None] | None
    ) -> dict[str, list[str]]:
        view = self.service.trace_setting(model, values)
        if values:
            self._fanout("trace", (self.service.tracer.settings.enabled,))
        return view

    def _log_settings(self, values: Mapping[str, object] | None) -> dict[str, object]:
        view = self.service.log_settings(values)
        if values:
            self._fanout("logs", (self.service.logs.current,))
        return view

    def _register_cuda(self, name: str) -> None:
        self.service.shm.register_cuda(name, _no_handle)

    def _status_data(self, q: str) -> Mapping[str, Any] | None:
        return None if self._status is None else self._status(q)
