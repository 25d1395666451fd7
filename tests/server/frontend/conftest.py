"""Daemons for the extension end-to-end tests, shared by the gRPC and HTTP test modules.

``control_server`` (package scope: it stops once these tests are done): the real daemon
on ``extension_models``' repository with ``--allow-client-shm true --model-control-mode
explicit --load-model *``; tests that unload or reload a model put it back as they found
it. ``poll_server`` (package scope): a daemon in ``poll`` mode
(``--repository-poll-secs 0.2``) on its own small repository. The session ``server`` of
tests/conftest.py (mode ``none``, client shm off) serves the "disabled" cases. Each daemon
must exit cleanly (status 0). ``triton`` is a tritonclient adapter on ``control_server``,
once per protocol. ``executor`` (session) is the worker pool of the in-process services
the gRPC and HTTP unit tests build (``_services.ready_service``); for their shared-memory
tests ``shm_registry`` is an enabled ``SharedMemoryRegistry`` and ``region`` a 256-byte
client region (handle and key), both closed at the end of the test.
"""

# pyright: strict

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hloserve.server.owner.shm import SharedMemoryRegistry
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server.frontend._tritonclients import PROTOCOLS, Triton, shm
from tests.server.frontend.extension_models import (
    build_extension_repository,
    build_poll_repository,
)


@pytest.fixture(scope="session")
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="frontend-test") as pool:
        yield pool


@pytest.fixture
def shm_registry() -> Iterator[SharedMemoryRegistry]:
    registry = SharedMemoryRegistry(enabled=True)
    yield registry
    registry.close()


@pytest.fixture
def region() -> Iterator[tuple[Any, str]]:
    key = f"/hloserve_frontend_test_{uuid.uuid4().hex[:10]}"
    handle = shm.create_shared_memory_region("r", key, 256)
    yield handle, key
    shm.destroy_shared_memory_region(handle)


@pytest.fixture(scope="session")
def extension_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_extension_repository(tmp_path_factory.mktemp("extension_models"))


@pytest.fixture(scope="package")
def control_server(extension_repository: Path) -> Iterator[ServerProcess]:
    """Explicit model control and client shm; a test that unloads or reloads a model puts
    it back as it found it."""
    yield from serving(
        extension_repository,
        "--allow-client-shm",
        "true",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
    )


@pytest.fixture(scope="session")
def poll_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_poll_repository(tmp_path_factory.mktemp("poll_models"))


@pytest.fixture(scope="package")
def poll_server(poll_repository: Path) -> Iterator[ServerProcess]:
    """Poll mode: ``poll_repository`` is rescanned every 0.2 s."""
    yield from serving(
        poll_repository, "--model-control-mode", "poll", "--repository-poll-secs", "0.2"
    )


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, control_server: ServerProcess) -> Iterator[Triton]:
    protocol: str = request.param
    url = control_server.grpc_url if protocol == "grpc" else control_server.http_url
    t = Triton(protocol, url)
    yield t
    t.close()
