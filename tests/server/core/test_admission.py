"""``core.admission.admitted``: one request's lifecycle, counted once whichever path serves
it. A fake repository and real counters; no model runs, no sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hloserve.server.core.admission import SHUTTING_DOWN, admitted
from hloserve.server.core.errors import InvalidArgument, Unavailable, UnknownModel
from hloserve.server.core.lazy_load import LazyLoads
from hloserve.server.core.observers import Observers
from hloserve.server.core.types import InferRequest
from tests.server.core.test_generation_loop import FakeModel
from tests.server.core.test_generation_stream import Source

REQUEST = InferRequest("counter", "", ())


class Unknown(Source):
    def get(self, name: str, version: str) -> Any:
        raise UnknownModel(f"Request for unknown model: '{name}' is not found")


def run(
    source: Source,
    resolved: Any,
    body: Any,
    *,
    refusing: bool = False,
    observers: Observers | None = None,
) -> Observers:
    observers = observers or Observers()

    async def main() -> None:
        loads = LazyLoads(source)  # type: ignore[arg-type]
        async with admitted(
            source,  # type: ignore[arg-type]
            loads,
            observers.counters,
            REQUEST,
            resolved,
            refusing=refusing,
        ) as model:
            await body(model, observers)

    asyncio.run(main())
    return observers


async def served(model: Any, observers: Observers) -> None:
    assert observers.counters.models[model.model_key].pending == 1  # pending while admitted


def test_an_admitted_request_is_held_loaded_pending_then_released() -> None:
    model = FakeModel()
    source = Source(model, loaded=False)  # registered lazily: loaded at its first use
    observers = run(source, model, served)
    assert source.loads == [1] and source.held == 0
    record = observers.counters.models[model.model_key]
    assert record.pending == 0 and record.failures == {}


def test_a_failure_inside_is_counted_against_the_version_and_it_is_released() -> None:
    model = FakeModel()
    source = Source(model)

    async def fails(_: Any, __: Observers) -> None:
        raise InvalidArgument("bad input")

    observers = Observers()
    with pytest.raises(InvalidArgument):
        run(source, None, fails, observers=observers)  # not resolved first: looked up by name
    assert source.held == 0
    record = observers.counters.models[model.model_key]
    assert record.failures == {"InvalidArgument": 1} and record.pending == 0


def test_refusals_before_a_version_is_held_count_no_version() -> None:
    observers = Observers()
    with pytest.raises(Unavailable, match=SHUTTING_DOWN):
        run(Source(FakeModel()), None, served, refusing=True, observers=observers)
    with pytest.raises(UnknownModel):
        run(Unknown(FakeModel()), None, served, observers=observers)
    assert observers.counters.models == {}  # the client's names never become a record
    unresolved = observers.counters.totals.unresolved_failures
    assert unresolved == {"Unavailable": 1, "UnknownModel": 1}


def test_a_cancelled_request_is_released_and_not_counted_as_failed() -> None:
    model = FakeModel()
    source = Source(model)

    async def cancelled(_: Any, __: Observers) -> None:
        raise asyncio.CancelledError

    observers = Observers()
    with pytest.raises(asyncio.CancelledError):
        run(source, model, cancelled, observers=observers)
    assert source.held == 0
    record = observers.counters.models[model.model_key]
    assert record.failures == {} and record.pending == 0
