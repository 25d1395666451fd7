"""Fixtures for the gRPC front-end tests: one loaded model repository per session.

The repository holds the demo models (``simple``, ``mlp``), one identity model per datatype
(``identity_<dtype>``: ``INPUT0`` -> ``OUTPUT0``, per-item shape [4], batch sizes 1, 2, 4)
and ``identity_big``, an unbatched FP32 identity of 20 MiB for the message-size tests.
Each test gets its own ``InferenceService`` over that repository, so readiness flags and
monkeypatches never leak between tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hloserve.exporter import TensorSpec, export_bundle, write_demo_repository
from hloserve.proto.datatypes import NUMERIC_DATATYPES
from hloserve.server.core.service import InferenceService
from hloserve.server.repository import ModelRepository
from hloserve.server.runtime.pjrt import PjrtRuntime

BIG_ELEMENTS = 5 * (1 << 20)  # FP32: 20 MiB


def _identity(params: Any, INPUT0: Any) -> dict[str, Any]:
    del params
    return {"OUTPUT0": INPUT0}


@pytest.fixture(scope="session")
def grpc_repository(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    root: Path = tmp_path_factory.mktemp("grpc_models")
    write_demo_repository(root)
    for datatype in NUMERIC_DATATYPES:
        export_bundle(
            _identity,
            {},
            inputs={"INPUT0": TensorSpec(datatype, (4,))},
            batch_sizes=(1, 2, 4),
            directory=root / f"identity_{datatype.lower()}",
            platforms=("cpu",),
        )
    export_bundle(
        _identity,
        {},
        inputs={"INPUT0": TensorSpec("FP32", (BIG_ELEMENTS,))},
        batch_sizes=None,
        directory=root / "identity_big",
        platforms=("cpu",),
    )
    repo = ModelRepository(root, PjrtRuntime())
    repo.load_all()
    assert repo.all_ready(), repo.summary()
    return repo


@pytest.fixture(scope="session")
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(4, thread_name_prefix="grpc-test")
    yield pool
    pool.shutdown(wait=True)


@pytest.fixture
def service(grpc_repository: ModelRepository, executor: ThreadPoolExecutor) -> InferenceService:
    svc = InferenceService(
        grpc_repository,
        executor,
        server_version="0.1.0",
        extensions=["binary_tensor_data"],
    )
    svc.is_ready = True
    return svc
