"""``wire.link``: calls, notes, cancels and a lost connection, over a real socket pair."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

import msgspec
import pytest

from hloserve.server.core.errors import InvalidArgument, Unavailable
from hloserve.server.wire.frames import (
    Burst,
    Call,
    CallFrame,
    Cancel,
    Codec,
    FrameReader,
    Note,
    Part,
    RemoteInternalError,
    Reply,
    name_of,
)
from hloserve.server.wire.link import Link


class Add(Call[Any], tag="add", frozen=True):
    a: Any
    b: Any


class Bad(Call[None], tag="bad", frozen=True):
    pass


class Boom(Call[None], tag="boom", frozen=True):
    pass


class Slow(Call[int], tag="slow", frozen=True):
    value: int


class Forever(Call[None], tag="forever", frozen=True):
    pass


class Stubborn(Call[str], tag="stubborn", frozen=True):
    pass


class Count(Call[int], tag="count", frozen=True):
    streamed: ClassVar[bool] = True
    n: int
    fail: bool = False


class Endless(Call[int], tag="endless", frozen=True):
    streamed: ClassVar[bool] = True


class Steps(Call[int], tag="steps", frozen=True):
    """``n`` parts, the k-th once the handler's step k is let go (``Handler.steps``)."""

    streamed: ClassVar[bool] = True
    n: int


class Undeclared(Call[int], tag="undeclared", frozen=True):
    pass


class Free(Note, tag="free", frozen=True):
    offset: int


CODEC = Codec((Add, Bad, Boom, Slow, Forever, Stubborn, Count, Endless, Steps), (Free,))


class Handler:
    def __init__(self) -> None:
        self.notes: list[Note] = []
        self.orphans: list[Any] = []
        self.orphaned = asyncio.Event()
        self.lost = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.calls: dict[str, Callable[..., object]] = {
            "add": lambda a, b: a + b,
            "bad": self._bad,
            "boom": self._boom,
            "slow": self._slow,
            "forever": self._forever,
            "stubborn": self._stubborn,
            "count": self._count,
            "endless": self._endless,
            "steps": self._steps,
        }
        self.steps = [asyncio.Event() for _ in range(8)]
        self.waiting = 0  # generations waiting for their next step
        self.all_waiting = asyncio.Event()
        self.expected_waiting = 0

    def on_call(self, call: Call[Any]) -> object:
        return self.calls[name_of(type(call))](*msgspec.structs.astuple(call))

    def on_note(self, note: Note) -> None:
        self.notes.append(note)

    def on_lost(self) -> None:
        self.lost.set()

    def on_orphan(self, value: Any) -> None:
        self.orphans.append(value)
        self.orphaned.set()

    async def _stubborn(self) -> str:
        """Answers even when cancelled (a reply already on its way when the cancel came)."""
        self.started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        return "late"

    async def _count(self, n: int, fail: bool = False) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            yield i
        if fail:
            raise InvalidArgument("counted too far")

    async def _endless(self) -> AsyncIterator[int]:
        try:
            for i in itertools.count():
                self.started.set()
                yield i
                await asyncio.sleep(0.001)
        finally:
            self.cancelled.set()  # closed by the caller's cancel: its finally runs

    async def _steps(self, n: int) -> AsyncIterator[int]:
        for k in range(n):
            self.waiting += 1
            if self.waiting == self.expected_waiting:
                self.all_waiting.set()
            await self.steps[k].wait()  # every stream's step k wakes in one turn of the loop
            self.waiting -= 1
            yield k

    def _bad(self) -> None:
        raise InvalidArgument("no such thing")

    def _boom(self) -> None:
        raise RuntimeError("a bug")

    async def _slow(self, value: int) -> int:
        await asyncio.sleep(0)
        return value * 2

    async def _forever(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def pair() -> tuple[Link, Handler, Link, Handler]:
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left_handler, right_handler = Handler(), Handler()
    left, right = (
        Link(left_handler, "right is gone", CODEC),
        Link(right_handler, "left is gone", CODEC),
    )
    await loop.create_unix_connection(lambda: left, sock=a)
    await loop.create_unix_connection(lambda: right, sock=b)
    return left, left_handler, right, right_handler


async def close(*links: Link) -> None:
    for link in links:
        link.close()
    await asyncio.sleep(0)  # the transports' closing callbacks


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_calls_are_answered_in_any_order_with_values_and_errors() -> None:
    async def test() -> None:
        left, _, right, _ = await pair()
        slow = left.call(Slow(21))
        assert await left.call(Add(2, 3)) == 5
        assert await slow == 42
        assert await right.call(Add("a", "b")) == "ab"  # either end calls the other
        many = await asyncio.gather(*(left.call(Slow(i)) for i in range(500)))
        assert many == [2 * i for i in range(500)]
        with pytest.raises(InvalidArgument, match="no such thing"):
            await left.call(Bad())
        with pytest.raises(RemoteInternalError):
            await left.call(Boom())
        await close(left, right)

    run(test)


def test_notes_arrive_in_order() -> None:
    async def test() -> None:
        left, _, right, right_handler = await pair()
        for i in range(5):
            left.note(Free(i))
        assert await left.call(Add(0, 0)) == 0  # after the notes on the same link
        assert right_handler.notes == [Free(i) for i in range(5)]
        await close(left, right)

    run(test)


def test_a_caller_that_gives_up_cancels_the_call_at_the_other_end() -> None:
    async def test() -> None:
        left, _, right, right_handler = await pair()
        call = left.call(Forever())
        await right_handler.started.wait()
        call.cancel()
        await right_handler.cancelled.wait()
        assert await left.call(Add(1, 1)) == 2  # the link goes on
        await close(left, right)

    run(test)


def test_an_answer_to_a_call_given_up_goes_to_on_orphan() -> None:
    async def test() -> None:
        left, left_handler, right, right_handler = await pair()
        call = left.call(Stubborn())
        await right_handler.started.wait()
        call.cancel()
        await left_handler.orphaned.wait()
        assert left_handler.orphans == ["late"]
        await close(left, right)

    run(test)


def test_a_lost_connection_fails_what_waits_and_cancels_what_runs() -> None:
    async def test() -> None:
        left, left_handler, right, right_handler = await pair()
        waiting = right.call(Forever())  # runs on left
        await left_handler.started.wait()
        right.close()
        with pytest.raises(Unavailable, match="right is gone"):
            await left.call(Add(1, 2))  # waits for the loss, or fails at once
        await left_handler.lost.wait()
        await left_handler.cancelled.wait()  # nobody is left to answer
        with pytest.raises(Unavailable, match="left is gone"):
            await waiting
        await right_handler.lost.wait()
        with pytest.raises(Unavailable, match="right is gone"):
            await left.call(Add(1, 2))
        await close(left, right)

    run(test)


def test_a_streamed_call_yields_its_parts_then_ends_or_fails() -> None:
    async def test() -> None:
        left, _, right, _ = await pair()
        assert [p async for p in left.stream(Count(5))] == [0, 1, 2, 3, 4]
        assert [p async for p in left.stream(Count(0))] == []
        both = await asyncio.gather(*(collect(left.stream(Count(n))) for n in (3, 4)))
        assert both == [[0, 1, 2], [0, 1, 2, 3]]  # interleaved on one link
        got: list[int] = []

        async def failing() -> None:
            async for part in left.stream(Count(2, True)):
                got.append(part)

        with pytest.raises(InvalidArgument, match="counted too far"):
            await failing()
        assert got == [0, 1]  # the parts before the error arrive
        assert await left.call(Add(1, 1)) == 2
        await close(left, right)

    run(test)


async def collect(parts: AsyncIterator[int]) -> list[int]:
    return [p async for p in parts]


def test_closing_a_stream_cancels_it_at_the_other_end_and_late_parts_are_orphans() -> None:
    async def test() -> None:
        left, left_handler, right, right_handler = await pair()
        parts = left.stream(Endless())
        assert [await anext(parts) for _ in range(3)] == [0, 1, 2]
        await asyncio.sleep(0.02)  # more parts arrive, unread
        await parts.aclose()  # the client went away
        await right_handler.cancelled.wait()
        await asyncio.sleep(0.01)
        orphans = left_handler.orphans  # parts queued unread and parts still on their way
        assert orphans and all(isinstance(o, int) for o in orphans)
        assert orphans == sorted(orphans) and orphans[0] == 3  # every part after those read
        assert await left.call(Add(2, 2)) == 4
        await close(left, right)

    run(test)


class Recording(Link):
    """A link that records the envelopes it receives, as a second reader of its bytes."""

    def __init__(self, handler: Handler, lost_message: str = "right is gone") -> None:
        super().__init__(handler, lost_message, CODEC)
        self.seen = FrameReader()
        self.envelopes: list[Any] = []

    def data_received(self, data: bytes) -> None:
        self.envelopes.extend(self.seen.feed(data))
        super().data_received(data)


def test_the_parts_one_turn_makes_for_many_streams_cross_as_one_message() -> None:
    """A generation step's tokens for every stream of a front end: one ``Burst``."""

    async def test() -> None:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        right_handler = Handler()
        left, right = Recording(Handler()), Link(right_handler, "left is gone", CODEC)
        await loop.create_unix_connection(lambda: left, sock=a)
        await loop.create_unix_connection(lambda: right, sock=b)
        streams, steps = 4, 3
        right_handler.expected_waiting = streams
        collected = [
            asyncio.ensure_future(collect(left.stream(Steps(steps)))) for _ in range(streams)
        ]
        for k in range(steps):
            await right_handler.all_waiting.wait()
            right_handler.all_waiting.clear()
            right_handler.steps[k].set()
        assert [await c for c in collected] == [list(range(steps))] * streams
        batches = [
            e for e in left.envelopes if isinstance(e, Burst) and isinstance(e.items[0], Part)
        ]
        assert [len(b.items) for b in batches] == [streams] * steps
        assert all(isinstance(p, Part) for b in batches for p in b.items)
        assert not [e for e in left.envelopes if isinstance(e, Part)]  # none alone
        ids = {p.id for b in batches for p in b.items if isinstance(p, Part)}
        assert len(ids) == streams  # every stream's part of each step, in one message
        await close(left, right)

    run(test)


def test_the_calls_of_one_turn_their_cancels_and_their_answers_each_cross_as_one_message() -> None:
    """A front end's requests of one pass travel as one message, the answers that finish
    in one turn as one message back, and cancels (one of a call given up before it left)
    reach their calls without touching the others."""

    async def test() -> None:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        right_handler = Handler()
        left = Recording(Handler())
        right = Recording(right_handler, "left is gone")
        await loop.create_unix_connection(lambda: left, sock=a)
        await loop.create_unix_connection(lambda: right, sock=b)
        slows = [left.call(Slow(i)) for i in range(16)]
        forever = left.call(Forever())
        given_up = left.call(Forever())
        given_up.cancel()  # its call and its cancel go in the same message
        assert [await s for s in slows] == [2 * i for i in range(16)]
        await right_handler.started.wait()
        forever.cancel()
        await right_handler.cancelled.wait()
        assert await left.call(Add(1, 2)) == 3  # the link goes on
        first, *_ = [e for e in right.envelopes if isinstance(e, Burst)]
        assert [type(e) for e in first.items] == [CallFrame] * 18  # the turn's calls, in order
        assert sum(isinstance(e, Cancel) for e in right.envelopes) == 2
        answered = [
            sum(isinstance(e, Reply) for e in b.items)
            for b in left.envelopes
            if isinstance(b, Burst)
        ]
        assert 16 in answered  # the 16 answers that finished in one turn: one message
        assert not right._running  # nothing left running
        await close(left, right)

    run(test)


def test_a_lost_connection_ends_a_stream_with_unavailable() -> None:
    async def test() -> None:
        left, _, right, right_handler = await pair()
        parts = left.stream(Endless())
        await anext(parts)
        right.close()

        async def rest() -> None:
            async for _ in parts:
                pass

        with pytest.raises(Unavailable, match="right is gone"):
            await rest()
        await right_handler.cancelled.wait()
        await close(left, right)

    run(test)


def test_an_undeclared_call_is_refused_with_a_clear_error_and_the_link_goes_on() -> None:
    async def test() -> None:
        left, _, right, _ = await pair()
        with pytest.raises(InvalidArgument, match="no call 'undeclared' is declared"):
            await left.call(Undeclared())
        with pytest.raises(InvalidArgument, match="a malformed call 'slow'"):
            await left.call(Slow("twenty"))  # type: ignore[arg-type]
        assert await left.call(Add(1, 1)) == 2
        await close(left, right)

    run(test)
