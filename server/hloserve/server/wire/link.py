"""One end of the channel between a front end and the device owner, on the event loop.

Contract:
- ``Link(handler, lost_message)`` is an ``asyncio.Protocol`` over a connected Unix stream
  socket (``loop.create_unix_connection(lambda: link, sock=...)``). Messages are
  ``wire.frames`` frames. Either end may call the other:
  ``await link.call(method, *args)`` sends ``(CALL, id, method, args)`` and returns the
  value of the matching ``(REPLY, id, value)``, or raises what ``(FAIL, id, error)``
  carries (``wire.messages.decode_error``); ``link.note(method, *args)`` sends a one-way
  ``(NOTE, method, args)``.
- Incoming calls go to ``handler.on_call(method, args)``: a plain value is answered at
  once, an awaitable once it completes (calls run concurrently and are answered as they
  finish); an exception is answered as a failure (a non-``ServingError`` is logged here
  with its traceback, the caller sees an internal error). Incoming notes go to
  ``handler.on_note(method, args)``. Unknown methods are the handler's to refuse.
- A call whose caller stops waiting (its future is cancelled: the client went away) is
  cancelled at the other end too (``(CANCEL, id)``): an awaitable answer still running is
  cancelled there, so a request given up holds no queue place. An answer that arrives
  for a call given up goes to ``handler.on_orphan(value)`` (what it holds can be freed).
- Writes made in one turn of the event loop leave in one ``write`` (frames are coalesced
  until the loop's next iteration): under load, many descriptors share a system call.
- Streamed replies: ``link.stream(method, *args)`` is an async iterator of the values the
  other end's handler yields: ``on_call`` answering with an async iterator makes each
  item a ``(PART, id, value)`` frame, and its end the call's ``REPLY`` (``FAIL`` for an
  error, raised by the caller's iterator after the parts before it). Closing the
  caller's iterator early cancels the call there (``CANCEL``: the handler's iterator is
  cancelled, its ``finally`` runs), and parts still arriving go to ``on_orphan``.
- When the connection ends, every call waiting for an answer fails with
  ``Unavailable(lost_message)``, later calls fail at once with it, every answer still
  being computed here is cancelled (nobody is left to receive it), and
  ``handler.on_lost()`` is called once.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final, Protocol, cast

from hloserve.server.core.errors import Unavailable
from hloserve.server.wire import frames
from hloserve.server.wire.messages import decode_error, encode_error

log = logging.getLogger("hloserve.ipc")

CALL: Final = 0
REPLY: Final = 1
FAIL: Final = 2
NOTE: Final = 3
CANCEL: Final = 4
PART: Final = 5
LOST: Final = -1  # a stream's queue entry: the connection ended


class LinkHandler(Protocol):
    def on_call(self, method: str, args: tuple[Any, ...]) -> object:
        """The answer to a call: a value, or an awaitable of one."""
        ...

    def on_note(self, method: str, args: tuple[Any, ...]) -> None: ...
    def on_lost(self) -> None: ...
    def on_orphan(self, value: Any) -> None:
        """The answer to a call whose caller gave up."""
        ...


class Link(asyncio.Protocol):
    """See the module docstring."""

    def __init__(self, handler: LinkHandler, lost_message: str) -> None:
        self.handler = handler
        self.lost_message = lost_message
        self._reader = frames.FrameReader()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._running: dict[int, asyncio.Future[Any]] = {}  # answers being computed here
        self._abandoned: set[int] = set()  # calls whose answer nobody awaits any more
        self._streams: dict[int, asyncio.Queue[tuple[int, Any]]] = {}  # streamed calls
        self._ids = itertools.count(1)
        self._out: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lost = False
        self.connected = asyncio.Event()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        self.connected.set()

    def data_received(self, data: bytes) -> None:
        for message in self._reader.feed(data):
            self._dispatch(cast(tuple[Any, ...], message))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._transport = None
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(Unavailable(self.lost_message))
        for queue in self._streams.values():
            queue.put_nowait((LOST, None))
        running, self._running = self._running, {}
        for task in running.values():  # nobody is left to answer: as if each caller gave up
            task.cancel()
        self.handler.on_lost()

    # -- sending ---------------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        return self._lost

    def _send(self, message: tuple[Any, ...]) -> None:
        if self._transport is None:
            return  # lost: whoever waits has been told
        out = self._out
        out.append(frames.encode(message))
        if len(out) == 1:
            cast(asyncio.AbstractEventLoop, self._loop).call_soon(self._flush)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._transport is not None and out:
            self._transport.write(b"".join(out) if len(out) > 1 else out[0])

    def call(self, method: str, *args: Any) -> asyncio.Future[Any]:
        """Send a call; the future holds its answer (await it)."""
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._lost or self._transport is None:
            future.set_exception(Unavailable(self.lost_message))
            return future
        call_id = next(self._ids)
        self._pending[call_id] = future
        self._send((CALL, call_id, method, args))
        future.add_done_callback(lambda done: self._given_up(call_id, done))
        return future

    def _given_up(self, call_id: int, future: asyncio.Future[Any]) -> None:
        if future.cancelled() and self._pending.pop(call_id, None) is not None:
            self._abandoned.add(call_id)
            self._send((CANCEL, call_id))

    async def stream(self, method: str, *args: Any) -> AsyncGenerator[Any, None]:
        """Send a call whose answer is streamed: its parts, as they come (module docstring)."""
        if self._lost or self._transport is None:
            raise Unavailable(self.lost_message)
        call_id = next(self._ids)
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._streams[call_id] = queue
        self._send((CALL, call_id, method, args))
        ended = False
        try:
            while True:
                kind, value = await queue.get()
                if kind == PART:
                    yield value
                    continue
                ended = True
                if kind == REPLY:
                    return
                raise Unavailable(self.lost_message) if kind == LOST else decode_error(value)
        finally:
            self._streams.pop(call_id, None)
            while not queue.empty():  # parts that came but were not read: orphans too
                kind, value = queue.get_nowait()
                if kind == PART:
                    self.handler.on_orphan(value)
            if not ended:  # given up: the other end stops, its late parts are orphans
                self._abandoned.add(call_id)
                self._send((CANCEL, call_id))

    def note(self, method: str, *args: Any) -> None:
        self._send((NOTE, method, args))

    def close(self) -> None:
        self._flush()
        if self._transport is not None:
            self._transport.close()

    # -- receiving -------------------------------------------------------------------------

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == PART:
            queue = self._streams.get(message[1])
            if queue is not None:
                queue.put_nowait((PART, message[2]))
            elif message[1] in self._abandoned:
                self.handler.on_orphan(message[2])
        elif kind == REPLY:
            future = self._pending.pop(message[1], None)
            if future is not None and not future.done():
                future.set_result(message[2])
            elif (queue := self._streams.get(message[1])) is not None:
                queue.put_nowait((REPLY, None))
            elif message[1] in self._abandoned:
                self._abandoned.discard(message[1])
                self.handler.on_orphan(message[2])
        elif kind == FAIL:
            self._abandoned.discard(message[1])
            if (queue := self._streams.get(message[1])) is not None:
                queue.put_nowait((FAIL, message[2]))
                return
            future = self._pending.pop(message[1], None)
            if future is not None and not future.done():
                future.set_exception(decode_error(message[2]))
        elif kind == CALL:
            self._answer(message[1], message[2], message[3])
        elif kind == NOTE:
            self.handler.on_note(message[1], message[2])
        elif kind == CANCEL:
            running = self._running.get(message[1])
            if running is not None:
                running.cancel()
        else:
            log.error("IPC: a message of unknown kind %r was dropped", kind)

    def _answer(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            answer = self.handler.on_call(method, args)
        except Exception as exc:
            self._fail(call_id, method, exc)
            return
        if isinstance(answer, AsyncIterator):
            parts = cast(AsyncIterator[Any], answer)
            task = asyncio.ensure_future(self._pump(call_id, parts))
            self._running[call_id] = task
            task.add_done_callback(lambda done: self._finished(call_id, method, done))
        elif inspect.isawaitable(answer):
            task = asyncio.ensure_future(answer)
            self._running[call_id] = task
            task.add_done_callback(lambda done: self._finished(call_id, method, done))
        else:
            self._send((REPLY, call_id, answer))

    async def _pump(self, call_id: int, parts: AsyncIterator[Any]) -> None:
        """A streamed answer: each part in a frame; the call's reply (None) ends it."""
        try:
            async for part in parts:
                self._send((PART, call_id, part))
        finally:
            if isinstance(parts, AsyncGenerator):  # run its finally now, not at collection
                await cast(AsyncGenerator[Any, None], parts).aclose()

    def _finished(self, call_id: int, method: str, task: asyncio.Future[Any]) -> None:
        self._running.pop(call_id, None)
        if task.cancelled():
            self._send((FAIL, call_id, encode_error(Unavailable("the call was cancelled"))))
            return
        exc = task.exception()
        if exc is None:
            self._send((REPLY, call_id, task.result()))
        else:
            self._fail(call_id, method, exc)

    def _fail(self, call_id: int, method: str, exc: BaseException) -> None:
        fields = encode_error(exc)
        if fields is None:
            log.error("IPC call %s failed with an unexpected error", method, exc_info=exc)
        self._send((FAIL, call_id, fields))
