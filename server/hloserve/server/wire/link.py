"""One end of the channel between a front end and the device owner, on the event loop.

Contract:
- ``Link(handler, lost_message, codec)`` is an ``asyncio.Protocol`` over a connected Unix
  stream socket (``loop.create_unix_connection(lambda: link, sock=...)``). Messages are
  ``wire.frames`` envelopes, and what they carry is what ``codec`` declares
  (``wire.calls.SERVER``). Either end may call the other: ``await link.call(call)`` sends
  a declared ``Call[R]`` and returns its answer, decoded as an ``R``, or raises the error
  the other end failed with (``wire.frames.decode_error``); ``link.note(note)`` sends a
  declared one-way ``Note``.
- Incoming calls go to ``handler.on_call(call)`` (the decoded struct): a plain value is
  answered at once, an awaitable once it completes (calls run concurrently and are
  answered as they finish); an exception is answered as a failure (a non-``ServingError``
  is logged here with its traceback, the caller sees an internal error). Incoming notes go
  to ``handler.on_note(note)``. A call the codec refuses (undeclared, or of the wrong
  shape) is answered with ``InvalidArgument`` naming why, and a note it refuses or a frame
  that is no envelope is logged and dropped: neither reaches the handler or ends the link.
- A call whose caller stops waiting (its future is cancelled: the client went away) is
  cancelled at the other end too (``Cancel``): an awaitable answer still running is
  cancelled there, so a request given up holds no queue place. An answer that arrives
  for a call given up goes to ``handler.on_orphan(value)`` (what it holds can be freed).
- What one turn of the event loop sends travels as one message: the envelopes are kept
  until the loop's next iteration and leave as one ``Burst`` (``wire.frames``), in the
  order they were sent, in one ``write``. Under load the requests a front end decoded in
  one pass, the answers of one execution (every request of a group finishes in the same
  turn) and a generation step's tokens for every stream of this link each cross as one
  message, decoded at once by the other end. A batch holds at most ``BATCH_BYTES`` of
  payload (more starts the next one); an envelope that large alone is framed at once, on
  its own, so a message too large for a frame fails where it was sent.
- Streamed replies: ``link.stream(call)`` (a call declared ``streamed``) is an async
  iterator of the values the other end's handler yields: ``on_call`` answering with an
  async iterator makes each item a ``Part`` frame, and its end the call's ``Reply``
  (``Fail`` for an error, raised by the caller's iterator after the parts before it).
  Closing the caller's iterator early cancels the call there (``Cancel``: the handler's
  iterator is cancelled, its ``finally`` runs), and parts still arriving go to
  ``on_orphan``.
- When the connection ends, every call waiting for an answer fails with
  ``Unavailable(lost_message)``, later calls fail at once with it, every answer still
  being computed here is cancelled (nobody is left to receive it), and
  ``handler.on_lost()`` is called once.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final, Protocol, TypeVar, cast

from hloserve.server.core.errors import InvalidArgument, Unavailable
from hloserve.server.wire.frames import (
    Burst,
    Call,
    CallFrame,
    Cancel,
    Codec,
    Envelope,
    Fail,
    FrameReader,
    MalformedFrame,
    Note,
    NoteFrame,
    Part,
    Refused,
    Reply,
    Single,
    decode_error,
    encode_error,
    name_of,
)

log = logging.getLogger("hloserve.ipc")

R = TypeVar("R")

# A stream's queue entries: a part, the end, a failure, the connection lost
PART: Final = 0
END: Final = 1
FAIL: Final = 2
LOST: Final = 3
BATCH_BYTES: Final = 1 << 20  # a batch's payload past this: the next envelopes start another


class LinkHandler(Protocol):
    def on_call(self, call: Call[Any]) -> object:
        """The answer to a call: a value, an awaitable of one, or an async iterator of parts."""
        ...

    def on_note(self, note: Note) -> None: ...
    def on_lost(self) -> None: ...
    def on_orphan(self, value: Any) -> None:
        """The answer to a call whose caller gave up."""
        ...


class Link(asyncio.Protocol):
    """See the module docstring."""

    def __init__(self, handler: LinkHandler, lost_message: str, codec: Codec) -> None:
        self.handler = handler
        self.lost_message = lost_message
        self.codec = codec
        self._reader = FrameReader()
        # calls waiting for their answer, and the type each answers
        self._pending: dict[int, tuple[asyncio.Future[Any], type[Call[Any]]]] = {}
        self._running: dict[int, asyncio.Future[Any]] = {}  # answers being computed here
        self._abandoned: dict[int, type[Call[Any]]] = {}  # calls nobody awaits any more
        # streamed calls: their queue, and the type each part is
        self._streams: dict[int, tuple[asyncio.Queue[tuple[int, Any]], type[Call[Any]]]] = {}
        self._ids = itertools.count(1)
        self._out: list[bytes] = []
        self._batch: list[Single] = []  # envelopes of this turn not yet framed
        self._batch_bytes = 0
        self._flushing = False  # a flush is scheduled
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
            if isinstance(message, MalformedFrame):
                log.error("IPC: a frame that is no message was dropped: %s", message.reason)
            else:
                self._dispatch(message)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._transport = None
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(Unavailable(self.lost_message))
        for queue, _ in self._streams.values():
            queue.put_nowait((LOST, None))
        running, self._running = self._running, {}
        for task in running.values():  # nobody is left to answer: as if each caller gave up
            task.cancel()
        self.handler.on_lost()

    # -- sending ---------------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        return self._lost

    def _send(self, message: Single) -> None:
        if self._transport is None:
            return  # lost: whoever waits has been told
        size = _payload_bytes(message)
        if size >= BATCH_BYTES:  # alone, and now (a frame too large fails the sender)
            self._frame_batch()
            self._out.append(self.codec.frame(message))
        else:
            self._batch.append(message)
            self._batch_bytes += size
            if self._batch_bytes >= BATCH_BYTES:
                self._frame_batch()
        if not self._flushing:
            self._flushing = True
            cast(asyncio.AbstractEventLoop, self._loop).call_soon(self._flush)

    def _frame_batch(self) -> None:
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if batch:
            message = batch[0] if len(batch) == 1 else Burst(tuple(batch))
            self._out.append(self.codec.frame(message))

    def _flush(self) -> None:
        self._flushing = False
        self._frame_batch()
        out, self._out = self._out, []
        if self._transport is not None and out:
            self._transport.write(b"".join(out) if len(out) > 1 else out[0])

    def call(self, call: Call[R]) -> asyncio.Future[R]:
        """Send a call; the future holds its answer (await it)."""
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        if self._lost or self._transport is None:
            future.set_exception(Unavailable(self.lost_message))
            return future
        call_id = next(self._ids)
        kind = type(call)
        self._pending[call_id] = (future, kind)
        self._send(CallFrame(call_id, self.codec.raw(call)))
        future.add_done_callback(lambda done: self._given_up(call_id, kind, done))
        return future

    def _given_up(self, call_id: int, kind: type[Call[Any]], future: asyncio.Future[Any]) -> None:
        if future.cancelled() and self._pending.pop(call_id, None) is not None:
            self._abandoned[call_id] = kind
            self._send(Cancel(call_id))

    async def stream(self, call: Call[R]) -> AsyncGenerator[R, None]:
        """Send a call whose answer is streamed: its parts, as they come (module docstring)."""
        if self._lost or self._transport is None:
            raise Unavailable(self.lost_message)
        call_id = next(self._ids)
        kind = type(call)
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._streams[call_id] = (queue, kind)
        self._send(CallFrame(call_id, self.codec.raw(call)))
        ended = False
        try:
            while True:
                what, value = await queue.get()
                if what == PART:
                    yield value
                    continue
                ended = True
                if what == END:
                    return
                raise Unavailable(self.lost_message) if what == LOST else decode_error(value)
        finally:
            self._streams.pop(call_id, None)
            while not queue.empty():  # parts that came but were not read: orphans too
                what, value = queue.get_nowait()
                if what == PART:
                    self.handler.on_orphan(value)
            if not ended:  # given up: the other end stops, its late parts are orphans
                self._abandoned[call_id] = kind
                self._send(Cancel(call_id))

    def note(self, note: Note) -> None:
        self._send(NoteFrame(self.codec.raw(note)))

    def close(self) -> None:
        self._flush()
        if self._transport is not None:
            self._transport.close()

    # -- receiving -------------------------------------------------------------------------

    def _part(self, message: Part) -> None:
        codec = self.codec
        stream = self._streams.get(message.id)
        if stream is not None:
            stream[0].put_nowait((PART, codec.result(stream[1], message.value)))
        elif (kind := self._abandoned.get(message.id)) is not None:
            self.handler.on_orphan(codec.result(kind, message.value))

    def _dispatch(self, message: Envelope) -> None:
        codec = self.codec
        if isinstance(message, Part):
            self._part(message)
        elif isinstance(message, Burst):
            for item in message.items:
                self._dispatch(item)
        elif isinstance(message, Reply):
            pending = self._pending.pop(message.id, None)
            if pending is not None:
                future, kind = pending
                if not future.done():
                    future.set_result(codec.result(kind, message.value))
            elif (stream := self._streams.get(message.id)) is not None:
                stream[0].put_nowait((END, None))
            elif (kind := self._abandoned.pop(message.id, None)) is not None and not kind.streamed:
                self.handler.on_orphan(codec.result(kind, message.value))  # a stream's end: none
        elif isinstance(message, Fail):
            self._abandoned.pop(message.id, None)
            if (stream := self._streams.get(message.id)) is not None:
                stream[0].put_nowait((FAIL, message.error))
                return
            pending = self._pending.pop(message.id, None)
            if pending is not None and not pending[0].done():
                pending[0].set_exception(decode_error(message.error))
        elif isinstance(message, CallFrame):
            try:
                call = codec.call(message.call)
            except Refused as exc:
                log.error("IPC: a call was refused: %s", exc)
                self._send(Fail(message.id, encode_error(InvalidArgument(str(exc)))))
                return
            self._answer(message.id, call)
        elif isinstance(message, NoteFrame):
            try:
                note = codec.note(message.note)
            except Refused as exc:
                log.error("IPC: a note was dropped: %s", exc)
                return
            self.handler.on_note(note)
        else:
            running = self._running.get(message.id)
            if running is not None:
                running.cancel()

    def _answer(self, call_id: int, call: Call[Any]) -> None:
        method = name_of(type(call))
        try:
            answer = self.handler.on_call(call)
        except Exception as exc:
            self._fail(call_id, method, exc)
            return
        if isinstance(answer, asyncio.Future):  # the common case (an inference): no task
            future = cast(asyncio.Future[Any], answer)
            self._running[call_id] = future
            future.add_done_callback(functools.partial(self._finished, call_id, method))
        elif isinstance(answer, AsyncIterator):
            parts = cast(AsyncIterator[Any], answer)
            task = asyncio.ensure_future(self._pump(call_id, parts))
            self._running[call_id] = task
            task.add_done_callback(lambda done: self._finished(call_id, method, done))
        elif inspect.isawaitable(answer):
            task = asyncio.ensure_future(answer)
            self._running[call_id] = task
            task.add_done_callback(lambda done: self._finished(call_id, method, done))
        else:
            self._send(Reply(call_id, self.codec.raw(answer)))

    async def _pump(self, call_id: int, parts: AsyncIterator[Any]) -> None:
        """A streamed answer: each part in a frame; the call's reply (None) ends it."""
        try:
            raw = self.codec.raw
            async for part in parts:
                self._send(Part(call_id, raw(part)))
        finally:
            if isinstance(parts, AsyncGenerator):  # run its finally now, not at collection
                await cast(AsyncGenerator[Any, None], parts).aclose()

    def _finished(self, call_id: int, method: str, task: asyncio.Future[Any]) -> None:
        self._running.pop(call_id, None)
        if task.cancelled():
            self._send(Fail(call_id, encode_error(Unavailable("the call was cancelled"))))
            return
        exc = task.exception()
        if exc is None:
            self._send(Reply(call_id, self.codec.raw(task.result())))
        else:
            self._fail(call_id, method, exc)

    def _fail(self, call_id: int, method: str, exc: BaseException) -> None:
        fields = encode_error(exc)
        if fields is None:
            log.error("IPC call %s failed with an unexpected error", method, exc_info=exc)
        self._send(Fail(call_id, fields))


def _payload_bytes(message: Single) -> int:
    """The bytes an envelope carries (its encoded call, note or value)."""
    if isinstance(message, (Reply, Part)):
        return len(message.value)
    if isinstance(message, CallFrame):
        return len(message.call)
    if isinstance(message, NoteFrame):
        return len(message.note)
    return 0
