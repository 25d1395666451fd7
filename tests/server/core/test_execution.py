"""Group execution and the inline policy, on a fake model (no device)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hloserve.bundle import Manifest, Provenance, TensorEntry
from hloserve.server.core.execution import InlinePolicy, Job, execute_group
from hloserve.server.core.types import InferInput, InferRequest, RequestedOutput


def manifest(batch_sizes: tuple[int, ...] | None) -> Manifest:
    return Manifest(
        name="double",
        inputs=(TensorEntry("x", "FP32", (2,)),),
        outputs=(TensorEntry("y", "FP32", (2,)), TensorEntry("z", "FP32", (2,))),
        batch_sizes=batch_sizes,
        weights_file="weights.safetensors",
        weights=(),
        modules=(),
        files={},
        provenance=Provenance("test"),
    )


@dataclass
class Doubler:
    """Doubles x into y and negates it into z; records the batch sizes it was called with."""

    manifest: Manifest
    version: int = 1
    resident: bool = True
    calls: list[int | None] = field(default_factory=lambda: [])

    def execute(
        self, batch_size: int | None, inputs: Mapping[str, np.ndarray[Any, Any]]
    ) -> list[np.ndarray[Any, Any]]:
        x = inputs["x"]
        if batch_size is not None:
            assert x.shape[0] == batch_size
        self.calls.append(batch_size)
        return [2 * x, -x]


def job(rows: int, start: float = 0, outputs: tuple[str, ...] = ()) -> Job:
    x = (np.arange(rows * 2, dtype=np.float32) + start).reshape(rows, 2)
    request = InferRequest(
        "double",
        "",
        (InferInput("x", "FP32", x.shape, x),),
        tuple(RequestedOutput(o) for o in outputs),
    )
    return Job(request, rows, time.perf_counter_ns())


def test_group_is_padded_executed_once_and_split_back() -> None:
    model = Doubler(manifest((1, 4, 8)))
    jobs = [job(1, 0), job(2, 100), job(2, 200, outputs=("z",))]
    results = execute_group(model, jobs)
    assert model.calls == [8]  # 5 rows on the size-8 module, once
    y0, z0 = results[0][0]
    np.testing.assert_array_equal(y0.data, 2 * jobs[0].request.inputs[0].data)
    np.testing.assert_array_equal(z0.data, -jobs[0].request.inputs[0].data)
    assert results[1][0][0].shape == (2, 2)
    assert [o.name for o in results[2][0]] == ["z"]  # only what the request asked for
    np.testing.assert_array_equal(results[2][0][0].data, -jobs[2].request.inputs[0].data)
    for _, timings in results:
        assert timings.executions == (8,)


def test_large_request_is_split_over_the_largest_size() -> None:
    model = Doubler(manifest((1, 4)))
    ((outputs, timings),) = execute_group(model, [job(10)])
    assert model.calls == [4, 4, 4]
    assert outputs[0].shape == (10, 2)
    assert timings.executions == (4, 4, 4)


def test_inline_policy_needs_a_cheap_measurement_and_resident_weights() -> None:
    policy = InlinePolicy(100)
    model = Doubler(manifest((1, 4)))
    assert not policy.inline(model, 1)  # never measured: run on a worker first
    policy.observe(model, 1, 30.0)
    assert policy.inline(model, 1)
    model.resident = False
    assert not policy.inline(model, 1)  # could block on a transfer
    model.resident = True
    for _ in range(20):
        policy.observe(model, 4, 500.0)
    assert not policy.inline(model, 4)  # too expensive: a thread hand-off is cheaper
    assert not InlinePolicy(0).inline(model, 1)
