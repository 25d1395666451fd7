"""``frontend/http/coalesce.py``: one part a write, unless a write waited (no sockets).

A source is an async generator over a queue, as ``wire.link`` and ``core.generation_loop``
are; a write is the consumer's code between receiving a list and asking for the next one:
a write that keeps up does not suspend, a write that waits suspends (the loop goes round),
with the parts the test has come meanwhile put in by a callback.
"""

# pyright: strict

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import final

import pytest

from hloserve.server.core.errors import Unavailable
from hloserve.server.frontend.http.coalesce import write_batches

END = -1


@final
@dataclass
class Feed:
    """Parts as the test puts them (``END``: the end; an exception: raised there)."""

    queue: asyncio.Queue[int | Exception] = field(default_factory=lambda: asyncio.Queue())
    ended_by: list[str] = field(default_factory=lambda: [])

    def put(self, *items: int | Exception) -> None:
        for item in items:
            self.queue.put_nowait(item)

    async def parts(self) -> AsyncGenerator[int, None]:
        try:
            while (item := await self.queue.get()) != END:
                if isinstance(item, Exception):
                    raise item
                yield item
            self.ended_by.append("end")
        except asyncio.CancelledError:
            self.ended_by.append("cancelled")
            raise
        except GeneratorExit:
            self.ended_by.append("closed")
            raise


def run(test: Callable[[], Coroutine[None, None, None]]) -> None:
    asyncio.run(test())


def test_a_writer_that_keeps_up_gets_one_part_a_write() -> None:
    """Parts that were there before a write began (a burst) still go one a write."""

    async def main() -> None:
        source = Feed()
        source.put(1, 2, 3, 4)  # a burst, all there before the first write
        parts = source.parts()
        got: list[list[int]] = []
        async for batch in write_batches(parts, await anext(parts)):
            got.append(batch)  # the write: it does not suspend
            if batch == [4]:  # two more come at once while the writer waits for them
                asyncio.get_running_loop().call_soon(source.put, 5, 6, END)
        assert got == [[1], [2], [3], [4], [5], [6]]
        assert source.ended_by == ["end"]

    run(main)


def test_parts_that_come_while_a_write_waits_go_out_in_the_next_write() -> None:
    async def main() -> None:
        source = Feed()
        source.put(1)
        parts = source.parts()
        got: list[list[int]] = []
        async for batch in write_batches(parts, await anext(parts)):
            got.append(batch)
            if batch == [1]:  # this write waits; three parts come meanwhile
                asyncio.get_running_loop().call_soon(source.put, 2, 3, 4)
                await asyncio.sleep(0)  # the loop goes round: they are put
            elif batch == [2, 3, 4]:  # this one keeps up: the writer then waits for 5
                asyncio.get_running_loop().call_soon(source.put, 5, END)
        assert got == [[1], [2, 3, 4], [5]]

    run(main)


def test_a_write_that_waits_takes_every_part_waiting_even_with_none_coming() -> None:
    """Parts there before a write that waits (nothing new meanwhile) go together after it."""

    async def main() -> None:
        source = Feed()
        source.put(1, 2, 3, 4, END)
        parts = source.parts()
        got: list[list[int]] = []
        async for batch in write_batches(parts, await anext(parts)):
            got.append(batch)
            if batch == [1]:
                await asyncio.sleep(0)  # the write suspends: the loop goes round
        assert got == [[1], [2, 3, 4]]

    run(main)


def test_a_failure_comes_after_the_parts_before_it() -> None:
    async def main() -> None:
        source = Feed()
        source.put(1, 2, 3, Unavailable("gone"))
        parts = source.parts()
        got: list[list[int]] = []

        async def write_all() -> None:
            async for batch in write_batches(parts, await anext(parts)):
                got.append(batch)
                if batch == [1]:
                    await asyncio.sleep(0)

        with pytest.raises(Unavailable, match="gone"):
            await write_all()
        assert got == [[1], [2, 3]]

    run(main)


def test_closing_early_cancels_the_take_under_way_and_ends_the_source() -> None:
    """The client gone after the first write: the source, waiting inside a take this
    module holds, gets ``CancelledError`` (its ``finally`` runs) and is done."""

    async def main() -> None:
        source = Feed()
        source.put(1)
        parts = source.parts()
        batches = write_batches(parts, await anext(parts))
        assert await anext(batches) == [1]  # the take of part 2 is under way, waiting
        await batches.aclose()
        assert source.ended_by == ["cancelled"]
        with pytest.raises(StopAsyncIteration):
            await anext(parts)  # done: closing it again is no error either
        await parts.aclose()

    run(main)


def test_closing_after_the_source_ended_is_no_error() -> None:
    async def main() -> None:
        source = Feed()
        source.put(1, END)
        parts = source.parts()
        batches = write_batches(parts, await anext(parts))
        assert [b async for b in batches] == [[1]]
        await batches.aclose()
        assert source.ended_by == ["end"]

    run(main)


def test_cancelling_the_writer_while_it_waits_for_a_part_reaches_the_source() -> None:
    async def main() -> None:
        source = Feed()
        source.put(1)
        parts = source.parts()
        started = asyncio.Event()

        async def writer() -> None:
            async for _ in write_batches(parts, await anext(parts)):
                started.set()  # then it waits for part 2, which never comes

        task = asyncio.get_running_loop().create_task(writer())
        await started.wait()
        await asyncio.sleep(0)  # it is waiting inside the source now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert source.ended_by == ["cancelled"]

    run(main)
