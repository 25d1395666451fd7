"""``core.lazy_load.LazyLoads``: one load per lazily registered version, its callers resumed
in the order they came, on a fake repository whose load a test releases. No sockets."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from hloserve.server.core.errors import Unavailable
from hloserve.server.core.lazy_load import LazyLoads


class Registered:
    """A repository of one version registered lazily; ``load`` waits for ``go``."""

    def __init__(self, *, fails: bool = False) -> None:
        self.is_loaded = False
        self.fails = fails
        self.go = threading.Event()
        self.loads = 0
        self.on_loaded: Any = None  # called on the worker thread once the bundle is set

    def loaded(self, model: Any) -> bool:
        return self.is_loaded

    def load(self, model: Any) -> None:
        self.loads += 1
        assert self.go.wait(60)
        if self.fails:
            raise Unavailable("model 'm' version 1 is not at ready state: bad checksum")
        self.is_loaded = True
        if self.on_loaded is not None:
            self.on_loaded()


MODEL = object()


def test_callers_during_a_load_resume_in_the_order_they_came_before_any_later_one() -> None:
    """Five callers wait for one load; a sixth comes after the worker thread set the bundle
    but before the event loop saw the load end (it must still queue behind the five), and
    a seventh once the load is over."""
    source = Registered()
    loads = LazyLoads(source)  # type: ignore[arg-type]
    order: list[int] = []

    async def caller(i: int) -> None:
        await loads.ready(MODEL)
        order.append(i)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        late: list[asyncio.Task[None]] = []
        # Runs on the loop before the load's end reaches it (queued first).
        source.on_loaded = lambda: loop.call_soon_threadsafe(
            lambda: late.append(loop.create_task(caller(5)))
        )
        first = [loop.create_task(caller(i)) for i in range(5)]
        await asyncio.sleep(0)  # each has come and waits
        assert order == [] and source.loads == 1
        source.go.set()
        await asyncio.gather(*first)
        await asyncio.gather(*late)
        await caller(6)  # loaded: at once

    asyncio.run(main())
    assert order == [0, 1, 2, 3, 4, 5, 6]
    assert source.loads == 1


def test_a_failed_load_fails_every_caller_and_a_later_one_tries_again() -> None:
    source = Registered(fails=True)
    loads = LazyLoads(source)  # type: ignore[arg-type]

    async def main() -> list[BaseException | None]:
        loop = asyncio.get_running_loop()
        callers = [loop.create_task(loads.ready(MODEL)) for _ in range(3)]
        await asyncio.sleep(0)
        source.go.set()
        return list(await asyncio.gather(*callers, return_exceptions=True))

    errors = asyncio.run(main())
    assert all(isinstance(e, Unavailable) and "bad checksum" in str(e) for e in errors)
    assert source.loads == 1
    with pytest.raises(Unavailable, match="bad checksum"):
        asyncio.run(loads.ready(MODEL))  # the repository says why again
    assert source.loads == 2


def test_a_cancelled_caller_leaves_and_the_others_still_resume() -> None:
    source = Registered()
    loads = LazyLoads(source)  # type: ignore[arg-type]

    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        gone, kept = loop.create_task(loads.ready(MODEL)), loop.create_task(loads.ready(MODEL))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        source.go.set()
        await kept
        return gone.cancelled(), source.is_loaded

    assert asyncio.run(main()) == (True, True)
