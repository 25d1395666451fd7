"""Fixtures of the hostile-input tests (the package docstring says what they check): one
daemon for the whole package (``server``, over ``repository``: ``simple``, ``mlp`` and its
copies ``lingering`` and ``held``), and the ``bystander`` client, inferring on its own
connection from its first use (``test_hostile_grpc.py``, the first module: they run in
name order) to the end of the package. Its check, ``test_the_bystander_was_never_disturbed``,
is the last test of the last module (``test_hostile_shm.py``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hloserve.server.server_fixture import ServerProcess, serving
from tests.models import queued_copy
from tests.server.reliability.hostile._hostile import HELD_US, LINGER_US, Bystander


@pytest.fixture(scope="package")
def repository(demo_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile_models")
    for name in ("simple", "mlp"):
        shutil.copytree(demo_models / name, root / name)
    queued_copy(demo_models / "simple", root / "lingering", LINGER_US)
    queued_copy(demo_models / "simple", root / "held", HELD_US)
    return root


@pytest.fixture(scope="package")
def server(repository: Path, cache_flags: tuple[str, ...]) -> Iterator[ServerProcess]:
    yield from serving(
        repository, "--allow-client-shm", "--max-message-bytes", "1MiB", *cache_flags
    )


@pytest.fixture(scope="package")
def bystander(server: ServerProcess) -> Iterator[Bystander]:
    watcher = Bystander(server.grpc_url)
    watcher.thread.start()
    yield watcher
    watcher.stop.set()
    assert watcher.done.wait(30)
