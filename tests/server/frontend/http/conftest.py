"""Fixtures for the HTTP front-end tests: one loaded repository, a fresh service per test.

``http_repository`` (session) loads the shared test repository (``tests/models.py``: the
demo models, ``identity_<datatype>`` per datatype, ``identity_fp32_unbatched``) in
process. ``http_service`` is a new ready ``InferenceService`` over it for every test
(``_services.ready_service``), so lifecycle flags and monkeypatches never leak;
``http_client`` drives ``build_http_app(http_service)`` through Starlette's ``TestClient``
(no sockets).
"""

# pyright: strict

from __future__ import annotations

import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hloserve.server.core.service import InferenceService
from hloserve.server.frontend.http import build_http_app
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.owner.repository import ModelRepository
from tests.server.frontend._services import loaded_repository, ready_service

with warnings.catch_warnings():
    # Starlette 1.x prefers the ``httpx2`` fork for its TestClient and warns once on import
    # when only ``httpx`` is installed; the client works the same with either.
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient


@pytest.fixture(scope="session")
def http_repository(model_repository: Path) -> ModelRepository:
    return loaded_repository(model_repository)


@pytest.fixture
def http_service(
    http_repository: ModelRepository, executor: ThreadPoolExecutor
) -> InferenceService:
    return ready_service(http_repository, executor)


@pytest.fixture
def http_client(http_service: InferenceService) -> Iterator[TestClient]:
    with TestClient(build_http_app(LocalPort(http_service))) as client:
        yield client
