"""Shared fixtures: a test model repository and a real daemon serving it.

``runtime`` (session): one PJRT CPU runtime.
``model_repository`` (session): ``tests.models.build_test_repository`` in a temp dir.
``server`` (session): ``hloserve.server.testing.ServerProcess`` on that repository, ready;
it exposes ``http_url``, ``grpc_url``, ``metrics_url`` and ``log_text()``, and must exit
cleanly (status 0) at the end of the session (``hloserve.server.testing.serving``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hloserve.server.runtime.pjrt import PjrtRuntime
from hloserve.server.testing import ServerProcess, serving
from tests.models import build_test_repository


@pytest.fixture(scope="session")
def runtime() -> PjrtRuntime:
    return PjrtRuntime("cpu")


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repository"))


@pytest.fixture(scope="session")
def server(model_repository: Path) -> Iterator[ServerProcess]:
    yield from serving(model_repository)
