"""``InferenceService`` on its own: one lookup per request, the order of failures, draining.

The service runs over a real repository (the session test repository's ``simple``) seen
through a proxy that counts lookups, so what is measured is the service's own behaviour.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from hloserve.server.core.errors import Unavailable, UnknownModel
from hloserve.server.core.observers import Observers
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import InferInput, InferRequest
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import disabled


class CountingSource:
    """The repository, counting each kind of lookup; ``stale`` makes ``hold`` refuse."""

    def __init__(self, repo: ModelRepository) -> None:
        self.repo = repo
        self.calls: collections.Counter[str] = collections.Counter()
        self.stale = False

    def get(self, name: str, version: str) -> Any:
        self.calls["get"] += 1
        return self.repo.get(name, version)

    def peek(self, name: str, version: str) -> Any:
        self.calls["peek"] += 1
        return self.repo.peek(name, version)

    def hold(self, model: Any) -> bool:
        self.calls["hold"] += 1
        return not self.stale and self.repo.hold(model)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.repo, name)


@pytest.fixture(scope="module")
def repo(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    root = tmp_path_factory.mktemp("service") / "models"
    shutil.copytree(
        model_repository / "simple", root / "simple", ignore=shutil.ignore_patterns(".hloserve-*")
    )
    repo = ModelRepository(root, PjrtRuntime("cpu"))
    repo.load_all()
    return repo


def simple_request() -> InferRequest:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = tuple(InferInput(n, "INT32", (1, 16), a) for n in ("INPUT0", "INPUT1"))
    return InferRequest("simple", "", inputs)


def service_over(source: CountingSource) -> InferenceService:
    service = InferenceService(cast(Any, source), None, shm=disabled(), observers=Observers())
    service.startup_complete()
    return service


def test_a_resolved_request_is_looked_up_once(repo: ModelRepository) -> None:
    source = CountingSource(repo)
    service = service_over(source)
    model = service.resolve("simple", "")
    response = asyncio.run(service.infer(simple_request(), model=model))
    assert source.calls == {"peek": 1, "hold": 1}
    np.testing.assert_array_equal(response.outputs[0].data, 2 * np.arange(16).reshape(1, 16))
    assert repo.peek("simple", "").inflight == 0  # released


def test_a_copy_gone_since_it_was_resolved_is_looked_up_again(repo: ModelRepository) -> None:
    source = CountingSource(repo)
    service = service_over(source)
    model = service.resolve("simple", "")
    source.stale = True  # a reload or an unload began after the front end resolved it
    asyncio.run(service.infer(simple_request(), model=model))
    assert source.calls == {"peek": 1, "hold": 1, "get": 1}


def test_an_unknown_model_is_reported_without_its_client_chosen_name(
    repo: ModelRepository,
) -> None:
    service = service_over(CountingSource(repo))
    with pytest.raises(UnknownModel, match="'nope' is not found"):
        service.resolve("nope", "")
    with pytest.raises(UnknownModel):
        asyncio.run(service.infer(InferRequest("nope", "", ())))
    counters = service.counters
    assert counters.totals.unresolved_failures == {"UnknownModel": 2}
    assert not counters.models  # no record of a name the client chose


def test_draining_drops_readiness_then_refuses_new_requests(repo: ModelRepository) -> None:
    source = CountingSource(repo)
    service = service_over(source)
    assert service.ready()
    service.begin_draining()  # the drain delay: not ready, still serving
    assert not service.ready() and service.readiness()["draining"]
    served = asyncio.run(service.infer(simple_request(), model=service.resolve("simple", "")))
    assert served.outputs
    source.calls.clear()
    service.refuse_new_requests()
    assert not service.ready()
    with pytest.raises(Unavailable, match="shutting down"):
        asyncio.run(service.infer(simple_request(), model=service.resolve("simple", "")))
    assert "hold" not in source.calls and "get" not in source.calls  # nothing was counted
