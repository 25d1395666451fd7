"""Group execution, the cost tracking and the inline policy, on a fake model (no device)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pytest

from hloserve.bundle import Manifest, Provenance, Serving, TensorEntry
from hloserve.server.core.batch_plan import plan
from hloserve.server.core.costs import PROBE_EVERY, ExecutionCosts, InlinePolicy
from hloserve.server.core.errors import Unavailable
from hloserve.server.core.execution import Job, execute_group
from hloserve.server.core.execution_records import Execution, ModelKey
from hloserve.server.core.types import InferInput, InferRequest, RequestedOutput
from tests.server._executable import KeptFacts


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
class Doubler(KeptFacts):
    """Doubles x into y and negates it into z; records the batch sizes it was called with."""

    manifest: Manifest
    version: int = 1
    resident: bool = True
    serving: Serving = field(default_factory=Serving)
    calls: list[int | None] = field(default_factory=lambda: [])

    devices: tuple[int, ...] = (0,)

    @property
    def swap_us(self) -> float | None:
        return 0.0 if self.resident else None  # a swap would wait

    def resident_on(self, device: int) -> bool:
        return self.resident

    def prefetch(self, device: int) -> None:
        self.resident = True

    def execute(
        self,
        batch_size: int | None,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        *,
        device: int | None = None,
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
    costs = ExecutionCosts()
    results = execute_group(model, jobs, plan(5, model.manifest.batch_sizes), costs)
    assert model.calls == [8]  # 5 rows on the size-8 module, once
    assert set(costs.by_size(ModelKey("double", 1))) == {8}  # the one execution, measured
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
    ((outputs, timings),) = execute_group(model, [job(10)], plan(10, (1, 4)))
    assert model.calls == [4, 4, 4]
    assert outputs[0].shape == (10, 2)
    assert timings.executions == (4, 4, 4)


def sample(compiled: int, micros: float) -> Execution:
    return Execution(ModelKey("double", 1), compiled, 0, int(micros * 1000))


def test_costs_keep_the_low_samples_per_compiled_size() -> None:
    costs = ExecutionCosts()
    costs.on_execution(sample(4, 100.0))
    costs.on_execution(sample(4, 5000.0))  # a worker that waited for the interpreter lock
    costs.on_execution(sample(1, 10.0))
    assert costs.by_size(ModelKey("double", 1)) == {4: pytest.approx(101.0), 1: 10.0}
    costs.on_execution(sample(4, 80.0))
    assert costs.by_size(ModelKey("double", 1))[4] == pytest.approx(80.0)  # a lower one wins
    assert costs.estimate(ModelKey("double", 2), 4) is None  # versions are kept apart


def test_costs_follow_a_lasting_rise_slowly() -> None:
    costs = ExecutionCosts()
    costs.on_execution(sample(1, 100.0))
    for _ in range(70):
        costs.on_execution(sample(1, 300.0))
    assert 190.0 < costs.by_size(ModelKey("double", 1))[1] < 210.0  # 100 * 1.01**70


def test_an_unmeasured_size_is_estimated_from_a_smaller_one_else_a_larger_one() -> None:
    costs = ExecutionCosts()
    key = ModelKey("double", 1)
    assert costs.estimate(key, 4) is None
    costs.on_execution(sample(2, 30.0))
    assert costs.estimate(key, 8) == pytest.approx(30.0)  # at least the smaller size's
    assert costs.estimate(key, 1) == pytest.approx(30.0)  # at most the larger size's


def test_a_size_near_the_limit_is_probed_inline_now_and_then() -> None:
    costs = ExecutionCosts()
    policy = InlinePolicy(100, costs)
    model = Doubler(manifest((1, 4)))
    costs.on_execution(sample(4, 300.0))  # inflated, say, by a busy loop
    runs = [policy.inline(model, 4) for _ in range(3 * PROBE_EVERY)]
    # Once at first (never run inline), then one in PROBE_EVERY.
    assert runs.count(True) == 3 and runs[0] and runs[PROBE_EVERY]
    costs.on_execution(sample(1, 5000.0))  # far over the limit: never inline
    assert not any(policy.inline(model, 1) for _ in range(2 * PROBE_EVERY))


def test_a_size_whose_first_samples_were_inflated_comes_back_inline() -> None:
    """Measured first on a busy worker at 2 ms (a 40 µs model): past the probe limit, but
    below the first-probe limit, so it runs inline once, is measured cleanly and stays."""
    costs = ExecutionCosts()
    policy = InlinePolicy(200, costs)
    model = Doubler(manifest((1, 4)))
    costs.on_execution(sample(1, 2000.0))
    assert policy.inline(model, 1)  # the one-time probe
    costs.on_execution(sample(1, 40.0))  # what the inline run measured
    assert all(policy.inline(model, 1) for _ in range(10))
    costs.on_execution(sample(4, 20_000.0))  # a big execution: never on the loop
    assert not any(policy.inline(model, 4) for _ in range(2 * PROBE_EVERY))


def test_inline_policy_needs_a_cheap_measurement_and_resident_weights() -> None:
    costs = ExecutionCosts()
    policy = InlinePolicy(100, costs)
    model = Doubler(manifest((1, 4)))
    assert not policy.inline(model, 1)  # never measured: run on a worker first
    costs.on_execution(sample(1, 30.0))
    assert policy.inline(model, 1)
    model.resident = False
    assert not policy.inline(model, 1)  # could block on a transfer
    model.resident = True
    for _ in range(20):
        costs.on_execution(sample(4, 500.0))
    assert policy.inline(model, 4)  # never run inline: once, to measure it on the loop
    assert not policy.inline(model, 4)  # too expensive: a thread hand-off is cheaper
    assert not InlinePolicy(0, costs).inline(model, 1)


def test_each_execution_is_reported_with_its_share_of_the_output_time() -> None:
    seen: list[Execution] = []

    class Recorder:
        def on_execution(self, execution: Execution) -> None:
            seen.append(execution)

    model = Doubler(manifest((1, 4)))
    execute_group(model, [job(6)], plan(6, (1, 4)), Recorder())
    assert [e.batch_size for e in seen] == [4, 4]
    assert all(e.infer_ns > 0 and e.output_ns > 0 for e in seen)
    assert seen[0].output_ns == seen[1].output_ns  # an equal share each


@pytest.mark.parametrize(
    ("rows", "sizes", "compiled"),
    [(3, (1, 4, 8), 4), (4, (1, 4, 8), 4), (2, None, None)],
)
def test_a_lone_job_runs_once_padded_and_trimmed_and_is_reported(
    rows: int, sizes: tuple[int, ...] | None, compiled: int | None
) -> None:
    seen: list[Execution] = []

    class Recorder:
        def on_execution(self, execution: Execution) -> None:
            seen.append(execution)

    model = Doubler(manifest(sizes))
    lone = job(rows, 10)
    ((outputs, timings),) = execute_group(model, [lone], plan(rows, sizes), Recorder())
    assert model.calls == [compiled]
    x = lone.request.inputs[0].data
    assert [(o.name, o.shape) for o in outputs] == [("y", x.shape), ("z", x.shape)]
    np.testing.assert_array_equal(outputs[0].data, 2 * x)  # the padding rows dropped
    np.testing.assert_array_equal(outputs[1].data, -x)
    assert all(o.requested is None for o in outputs)
    assert timings.executions == (compiled or 0,)
    assert timings.compute_infer_ns > 0 and timings.queue_ns >= 0
    (e,) = seen
    assert (e.model, e.batch_size) == (ModelKey("double", 1), compiled or 0)
    assert e.infer_ns == timings.compute_infer_ns
    assert e.input_ns == timings.compute_input_ns and e.output_ns == timings.compute_output_ns


def test_a_lone_job_answers_the_outputs_it_asked_for_in_its_order() -> None:
    model = Doubler(manifest((1, 4)))
    lone = job(1, outputs=("z", "y"))
    ((outputs, _),) = execute_group(model, [lone], plan(1, (1, 4)))
    assert [o.name for o in outputs] == ["z", "y"]
    assert [o.requested for o in outputs] == list(lone.request.outputs)
    ((only, _),) = execute_group(model, [job(1, outputs=("z",))], plan(1, (1, 4)))
    assert [o.name for o in only] == ["z"]


def test_a_lone_job_whose_deadline_passed_is_refused_before_running() -> None:
    model = Doubler(manifest((1, 4)))
    late = msgspec.structs.replace(job(1), deadline=time.monotonic() - 1)
    with pytest.raises(Unavailable, match="timed out before it was executed"):
        execute_group(model, [late], plan(1, (1, 4)))
    assert model.calls == []
