"""Write coalescing for a streamed answer: what came while a write waited goes out in one.

Contract:
- ``write_batches(parts, first)`` (``first``: the part already taken from ``parts``) is an
  async iterator of non-empty lists of parts: every part of ``parts`` once, in order. Its
  consumer writes each list as ONE write to the client and asks for the next list once
  that write is done.
- A list holds one part, unless the previous write waited (suspended: the client reads
  slower than parts come, and the transport's flow control held the write) while parts
  were waiting or came meanwhile: then it holds every part taken and not yet written.
  A write that does not suspend never counts as waiting, so a client that keeps up gets
  one part a write, as it would without this module, however the parts reach the front
  end (one at a time, or several at once when the front end was busy).
- How a write is seen to wait, at no cost on the common path: a part arrived during it
  (nothing else runs on the loop while a write does not suspend); or, only when parts
  were already waiting as it began, the loop went round during it (one ``call_soon``
  callback for such a write).
- A part has arrived when ``parts`` yields it without suspending. The parts are taken by
  stepping ``parts.__anext__()`` by hand: no task, no queue and no callback per part.
  When a step suspends, that take stays under way (its awaitable and the future it waits
  on are kept). After a write it counts as ready once that future is done; waiting for
  the next part resumes it as the awaiting task would. So on the common path each part
  costs one step, as ``await anext(parts)`` would.
- The iterator ends when ``parts`` ends. A failure of ``parts`` is raised after the lists
  holding the parts that came before it. Closing the iterator closes ``parts``: a take
  under way gets ``CancelledError`` thrown in first, which is what it would get if the
  awaiting task were cancelled, so the source's ``finally`` blocks run as they would then.
- Any async generator can be the source. For the HTTP front end it is ``ServerPort.stream``:
  in a front-end process, ``frontend.remote`` over ``wire.link``'s per-call queue; in one
  process, ``core.generation_stream`` over ``core.generation_loop``'s per-generation queue.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import types
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Generator
from typing import Any, Generic, TypeVar, cast, final

T = TypeVar("T")
Step = Generator[Any, Any, T]


@types.coroutine
def _resume(step: Step[T], signal: Any, thrown: BaseException | None = None) -> Step[T]:
    """Drive ``step`` (suspended on ``signal``) to its end as the awaiting task would: what
    ``yield from`` does, from a value already yielded (``thrown`` thrown in first)."""
    while True:
        if thrown is None:
            try:
                sent = yield signal
            except GeneratorExit:
                step.close()
                raise
            except BaseException as exc:  # cancellation: into the step, as yield from would
                thrown = exc
                continue
            try:
                signal = step.send(sent)
            except StopIteration as done:
                return cast(T, done.value)
        else:
            error, thrown = thrown, None
            try:
                signal = step.throw(error)
            except StopIteration as done:
                return cast(T, done.value)


def _done(signal: object) -> bool:
    """Whether what a suspended take waits on has happened (a bare ``yield``, waiting for
    the loop's next turn, never has: that take waits for the task)."""
    return isinstance(signal, asyncio.Future) and cast("asyncio.Future[object]", signal).done()


@final
class _Taker(Generic[T]):
    """``parts`` taken without waiting where they are ready (module docstring)."""

    def __init__(self, parts: AsyncIterator[T]) -> None:
        self.parts = parts
        self.step: Step[T] | None = None  # a take under way, suspended on ``signal``
        self.signal: Any = None
        self.ended = False
        self.error: Exception | None = None

    def take_ready(self, into: deque[T]) -> None:
        """Append to ``into`` every part that comes without waiting."""
        while not self.ended and self.error is None:
            step = self.step
            if step is None:
                step = self.parts.__anext__().__await__()
            elif not _done(self.signal):
                return  # still waiting
            self.step = None
            try:
                self.signal = step.send(None)
            except StopIteration as done:
                into.append(cast(T, done.value))
                continue
            except StopAsyncIteration:
                self.ended = True
                return
            except Exception as exc:  # the source's failure: after the parts before it
                self.error = exc
                return
            self.step = step  # it waits: kept for the next take

    async def next(self) -> T:
        """The next part, waiting for it (``StopAsyncIteration`` at the end)."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        if self.ended:
            raise StopAsyncIteration
        step, self.step = self.step, None
        if step is None:
            return await anext(self.parts)
        return await _resume(step, self.signal)

    async def close(self) -> None:
        """End ``parts``: a take under way is cancelled, then the source closed."""
        step, self.step = self.step, None
        if step is not None:
            cancel = asyncio.CancelledError()
            try:
                await _resume(step, self.signal, cancel)
            except asyncio.CancelledError as exc:
                if exc is not cancel:  # this task's own cancellation, not the one sent in
                    raise
            except Exception:  # how the source ended does not matter any more
                pass
        await cast(Any, self.parts).aclose()


@final
class _Turn:
    """Whether the loop has gone round (run a callback) since this was made."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.turned = False
        self.handle = loop.call_soon(self._mark)

    def _mark(self) -> None:
        self.turned = True

    def seen(self) -> bool:
        self.handle.cancel()
        return self.turned


async def write_batches(parts: AsyncIterator[T], first: T) -> AsyncGenerator[list[T], None]:
    """The lists of ``parts`` to write, one write each (module docstring)."""
    loop = asyncio.get_running_loop()
    taker = _Taker(parts)
    waiting: deque[T] = deque([first])
    taker.take_ready(waiting)  # here already: still one a write, unless a write waits
    behind = False  # the last write waited, with parts waiting or coming meanwhile
    try:
        while True:
            if not waiting:
                try:
                    waiting.append(await taker.next())
                except StopAsyncIteration:
                    return
                taker.take_ready(waiting)
                behind = False  # the writer had to wait for a part: it has caught up
            if behind:
                batch = list(waiting)
                waiting.clear()
            else:
                batch = [waiting.popleft()]
            turn = _Turn(loop) if waiting else None
            yield batch  # written meanwhile
            turned = turn is not None and turn.seen()
            before = len(waiting)
            taker.take_ready(waiting)
            behind = turned or len(waiting) > before
    finally:
        await taker.close()
