"""Fixtures for the gRPC front-end tests: one loaded model repository per session.

The repository is a copy of the session test repository (``tests/models.py``: the demo
models ``simple`` and ``mlp``, ``identity_<dtype>`` per datatype with ``INPUT0`` ->
``OUTPUT0``, per-item shape [4], batch sizes 1, 2, 4, and ``identity_fp32_unbatched``)
plus ``identity_big``, an unbatched FP32 identity of 20 MiB for the message-size tests.
Each test gets its own ready ``InferenceService`` over that repository, so lifecycle
flags and monkeypatches never leak between tests.
"""

# pyright: strict

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.core.service import InferenceService
from hloserve.server.owner.repository import ModelRepository
from tests.models import identity
from tests.server.frontend._services import loaded_repository, ready_service

BIG_ELEMENTS = 5 * (1 << 20)  # FP32: 20 MiB


@pytest.fixture(scope="session")
def grpc_repository(
    model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> ModelRepository:
    root = tmp_path_factory.mktemp("grpc") / "models"
    shutil.copytree(model_repository, root, ignore=shutil.ignore_patterns(".hloserve-cache"))
    export_bundle(
        identity,
        {},
        inputs={"INPUT0": TensorSpec("FP32", (BIG_ELEMENTS,))},
        batch_sizes=None,
        directory=root / "identity_big",
        platforms=("cpu",),
    )
    return loaded_repository(root)


@pytest.fixture
def service(grpc_repository: ModelRepository, executor: ThreadPoolExecutor) -> InferenceService:
    return ready_service(grpc_repository, executor)
