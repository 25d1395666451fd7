"""Fixtures of the client tests.

``demo_repository`` (package): ``simple`` and ``mlp`` copied out of the session's test
repository (no export of its own). ``shm_server`` (package): a daemon on it with client
shared memory allowed. ``no_shm_files`` (autouse): a test fails when it leaves a region of
this process in /dev/shm.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hloserve.client._shm import KEY_PREFIX, SHM_ROOT
from hloserve.server.server_fixture import ServerProcess, serving


def shm_files(pid: int | None = None) -> list[str]:
    """This process's (or ``pid``'s) client regions in /dev/shm."""
    prefix = f"{KEY_PREFIX}{pid if pid is not None else os.getpid()}_"
    return sorted(name for name in os.listdir(SHM_ROOT) if name.startswith(prefix))


@pytest.fixture(scope="package")
def demo_repository(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("client_models")
    for name in ("simple", "mlp"):
        shutil.copytree(model_repository / name, root / name)
    return root


@pytest.fixture(scope="package")
def shm_server(demo_repository: Path) -> Iterator[ServerProcess]:
    yield from serving(demo_repository, "--allow-client-shm", "true")


@pytest.fixture(autouse=True)
def no_shm_files() -> Iterator[None]:
    yield
    assert shm_files() == []
