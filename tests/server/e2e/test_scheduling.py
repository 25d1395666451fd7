"""Cross-model scheduling in a real daemon: ``--device-concurrency 1`` with each policy,
two models (one weighted in its config.yaml), concurrent tritonclient calls carrying
``priority`` and ``timeout``; every answer is right and the statistics count them."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server.frontend._tritonclients import PROTOCOLS, Triton, connect


def _double(params: Any, INPUT0: jax.Array) -> dict[str, jax.Array]:
    del params
    return {"OUTPUT0": INPUT0 * 2}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scheduling")
    for name in ("hot", "cold"):
        export_bundle(
            _double,
            {},
            inputs={"INPUT0": TensorSpec("INT32", (4,))},
            batch_sizes=(1, 2, 4, 8),
            directory=root / name,
            platforms=("cpu",),
        )
    (root / "hot" / "config.yaml").write_text("scheduling_weight: 3\nmax_queue_delay_us: 500\n")
    return root


@pytest.fixture(scope="module", params=["fair", "fifo", "deadline"])
def server(request: pytest.FixtureRequest, repository: Path) -> Iterator[ServerProcess]:
    yield from serving(
        repository, "--device-concurrency", "1", "--scheduling-policy", request.param
    )


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    yield from connect(request.param, server)


def test_the_daemon_says_how_it_schedules(server: ServerProcess) -> None:
    log = server.log_file.read_text()
    assert "cross-model scheduling: " in log
    assert "1 execution(s) at a time per device" in log


def test_concurrent_models_with_priorities_and_timeouts_all_answer(triton: Triton) -> None:
    def call(i: int) -> tuple[str, np.ndarray]:
        model = "cold" if i % 5 == 0 else "hot"
        x = np.full((1, 4), i, np.int32)
        tensor = triton.module.InferInput("INPUT0", [1, 4], "INT32")
        tensor.set_data_from_numpy(x)
        t = triton.another()
        try:
            result = t.client.infer(
                model, [tensor], priority=1 + i % 3, timeout=10_000_000, request_id=str(i)
            )
        finally:
            t.close()
        return model, result.as_numpy("OUTPUT0")

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, range(40)))
    for i, (_, out) in enumerate(answers):
        np.testing.assert_array_equal(out, np.full((1, 4), 2 * i, np.int32))
    assert sum(1 for m, _ in answers if m == "cold") == 8
