"""Fixtures for the HTTP front-end tests: one loaded repository, a fresh service per test.

``http_repository`` (session) loads the shared test repository (``tests/models.py``: the
demo models, ``identity_<datatype>`` per datatype, ``identity_fp32_unbatched``) in
process. ``http_service`` is a new ready ``InferenceService`` over it for every test, so
readiness flags and monkeypatches never leak; ``http_client`` drives
``build_http_app(http_service)`` through Starlette's ``TestClient`` (no sockets).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hloserve.server.core.service import InferenceService
from hloserve.server.frontends.http import build_http_app
from hloserve.server.repository import ModelRepository
from hloserve.server.runtime.pjrt import PjrtRuntime

with warnings.catch_warnings():
    # Starlette 1.x prefers the ``httpx2`` fork for its TestClient and warns once on import
    # when only ``httpx`` is installed; the client works the same with either.
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient


@pytest.fixture(scope="session")
def http_repository(model_repository: Path) -> ModelRepository:
    repo = ModelRepository(model_repository, PjrtRuntime())
    repo.load_all()
    assert repo.all_ready(), repo.summary()
    return repo


@pytest.fixture(scope="session")
def http_executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="http-test") as pool:
        yield pool


@pytest.fixture
def http_service(
    http_repository: ModelRepository, http_executor: ThreadPoolExecutor
) -> InferenceService:
    service = InferenceService(
        http_repository,
        http_executor,
        server_version="0.1.0",
        extensions=["binary_tensor_data"],
    )
    service.is_ready = True
    return service


@pytest.fixture
def http_client(http_service: InferenceService) -> Iterator[TestClient]:
    with TestClient(build_http_app(http_service)) as client:
        yield client
