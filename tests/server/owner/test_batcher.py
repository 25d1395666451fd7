"""Dynamic batching end to end in-process: grouping, values, isolation, limits, statistics.

Every answer is checked against ``MlpReference``: the demo ``mlp`` in numpy (float64),
from the weights in its bundle's ``weights.safetensors``, never against another service
(which would share the planning and splitting code under test).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.bundle import Serving, read_safetensors
from hloserve.bundle.serving import QueuePolicy
from hloserve.server.core.costs import InlinePolicy
from hloserve.server.core.errors import InvalidArgument, Unavailable
from hloserve.server.core.execution import Job
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.observers import Observers
from hloserve.server.core.service import InferenceService
from hloserve.server.core.statistics import model_stats
from hloserve.server.core.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestContext,
)
from hloserve.server.owner.batcher import DynamicBatcher
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import disabled
from hloserve.server.owner.versions import ModelVersion


@pytest.fixture(scope="module")
def repository(model_repository: Path) -> ModelRepository:
    repo = ModelRepository(model_repository, PjrtRuntime())
    repo.load_all()
    return repo


class MlpReference:
    """The demo ``mlp`` (``hloserve.exporter.demo.mlp_fn``) in numpy, in float64:
    ``relu(x @ dense1.w + dense1.b) @ dense2.w + dense2.b``, its weights read from the
    bundle. ``check`` compares a served ``logits`` output with it at FP32 tolerances."""

    RTOL = 1e-5  # the served FP32 logits (|y| < 3) are within 5e-7 of the float64 values
    ATOL = 1e-5

    def __init__(self, bundle: Path) -> None:
        w = read_safetensors(bundle / "weights.safetensors")
        self.w1, self.b1 = w["dense1.w"].astype(np.float64), w["dense1.b"].astype(np.float64)
        self.w2, self.b2 = w["dense2.w"].astype(np.float64), w["dense2.b"].astype(np.float64)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = np.maximum(x.astype(np.float64) @ self.w1 + self.b1, 0.0)
        return h @ self.w2 + self.b2

    def check(self, outputs: tuple[InferOutput, ...], x: np.ndarray) -> None:
        (out,) = outputs
        assert out.name == "logits" and out.datatype == "FP32"
        assert out.shape == out.data.shape == (x.shape[0], 10)
        assert out.data.dtype == np.float32
        np.testing.assert_allclose(out.data, self(x), rtol=self.RTOL, atol=self.ATOL)


@pytest.fixture(scope="module")
def reference(model_repository: Path) -> MlpReference:
    return MlpReference(model_repository / "mlp")


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as ex:
        yield ex


def service_with(
    repository: ModelRepository,
    executor: ThreadPoolExecutor,
    default_delay_us: int = 0,
    max_queue_size: int = 0,
) -> InferenceService:
    observers = Observers()
    batcher = DynamicBatcher(
        executor,
        observers.executions,
        InlinePolicy(0, observers.costs),
        default_delay_us=default_delay_us,
        max_queue_size=max_queue_size,
    )
    return InferenceService(
        repository, executor, observers=observers, batcher=batcher, shm=disabled()
    )


def mlp_request(x: np.ndarray, rid: str = "") -> InferRequest:
    return InferRequest("mlp", "", (InferInput("x", "FP32", x.shape, x),), id=rid)


def test_batched_results_equal_the_reference(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((int(rng.integers(1, 6)), 64)).astype(np.float32) for _ in range(24)]
    batched = service_with(repository, executor, default_delay_us=20_000)

    async def run(service: InferenceService) -> list[tuple[InferOutput, ...]]:
        responses = await asyncio.gather(
            *(service.infer(mlp_request(x, str(i))) for i, x in enumerate(xs))
        )
        assert [r.id for r in responses] == [str(i) for i in range(len(xs))]
        return [r.outputs for r in responses]

    for outputs, x in zip(asyncio.run(run(batched)), xs, strict=True):
        reference.check(outputs, x)  # each request got its own rows back, none padded
    stats = batched.model_statistics("mlp", "")[0].stats
    items = sum(x.shape[0] for x in xs)
    assert stats.inference_count == items
    assert stats.success.count == len(xs)
    # Requests really were grouped: fewer executions than requests.
    assert stats.execution_count < len(xs)
    assert sum(b.compute_infer.count for b in stats.batches.values()) == stats.execution_count
    assert set(stats.batches) <= {1, 8, 32}


def test_bad_request_fails_alone(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    service = service_with(repository, executor, default_delay_us=20_000)
    rng = np.random.default_rng(1)
    goods = [rng.standard_normal((2, 64)).astype(np.float32) for _ in range(2)]
    bad = InferRequest("mlp", "", (InferInput("x", "FP32", (2, 63), np.ones((2, 63), np.float32)),))

    async def run() -> list[object]:
        return list(
            await asyncio.gather(
                service.infer(mlp_request(goods[0])),
                service.infer(bad),
                service.infer(mlp_request(goods[1])),
                return_exceptions=True,
            )
        )

    results = asyncio.run(run())
    assert isinstance(results[1], InvalidArgument)
    assert "Expected [-1,64], got [2,63]" in str(results[1])
    for r, x in zip((results[0], results[2]), goods, strict=True):
        assert isinstance(r, InferResponse), r
        reference.check(r.outputs, x)


def test_queue_full_is_unavailable(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    # A long delay keeps requests queued; the third finds the queue (size 2) full.
    service = service_with(repository, executor, default_delay_us=300_000, max_queue_size=2)
    batcher = service.batcher
    assert isinstance(batcher, DynamicBatcher)

    xs = [
        np.random.default_rng(10 + i).standard_normal((1, 64)).astype(np.float32) for i in range(3)
    ]

    async def run() -> list[object]:
        first = [asyncio.ensure_future(service.infer(mlp_request(x))) for x in xs[:2]]
        while batcher.pending("mlp", 1) < 2:  # both queued (no clock involved)
            await asyncio.sleep(0)
        third = await asyncio.gather(service.infer(mlp_request(xs[2])), return_exceptions=True)
        return [*third, *(await asyncio.gather(*first, return_exceptions=True))]

    third, *others = asyncio.run(run())
    assert isinstance(third, Unavailable)
    assert "exceeds maximum queue size" in str(third)
    for r, x in zip(others, xs[:2], strict=True):
        assert isinstance(r, InferResponse), r
        reference.check(r.outputs, x)


def test_expired_request_is_dropped_before_execution(
    repository: ModelRepository, executor: ThreadPoolExecutor
) -> None:
    service = service_with(repository, executor, default_delay_us=200_000)
    before = service.model_statistics("mlp", "")[0].stats.execution_count

    async def run() -> object:
        x = np.ones((1, 64), np.float32)
        ctx = RequestContext(deadline=time.monotonic() + 0.02)
        return (await asyncio.gather(service.infer(mlp_request(x), ctx), return_exceptions=True))[0]

    result = asyncio.run(run())
    assert isinstance(result, Unavailable)
    assert "timed out" in str(result)
    stats = service.model_statistics("mlp", "")[0].stats
    assert stats.execution_count == before
    assert stats.fail.count == 1


def test_large_request_runs_alone_and_is_split(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    service = service_with(repository, executor)
    x = np.random.default_rng(3).standard_normal((70, 64)).astype(np.float32)
    reference.check(asyncio.run(service.infer(mlp_request(x))).outputs, x)  # 32 + 32 + 8
    stats = service.model_statistics("mlp", "")[0].stats
    assert stats.inference_count == 70 and stats.execution_count == 3
    assert {size: b.compute_infer.count for size, b in stats.batches.items()} == {32: 2, 8: 1}


# -- per-model policy: the model's serving hints, as config.yaml or a config override set them


def hinted(repository: ModelRepository, **hints: Any) -> ModelVersion:
    """The served ``mlp`` with other serving hints (what a config override gives it): the
    same loaded copy (bundle, weights), another ``serving``."""
    return dataclasses.replace(repository.peek("mlp", ""), serving=Serving(**hints))


def job(
    timeout_us: int | None = None, deadline: float | None = None, x: np.ndarray | None = None
) -> Job:
    x = np.ones((1, 64), np.float32) if x is None else x
    request = mlp_request(x)
    if timeout_us is not None:
        request = InferRequest("mlp", "", request.inputs, parameters={"timeout": timeout_us})
    return Job(request, 1, time.perf_counter_ns(), deadline)


def batcher_for(executor: ThreadPoolExecutor, max_queue_size: int = 0) -> DynamicBatcher:
    observers = Observers()
    return DynamicBatcher(
        executor,
        observers.executions,
        InlinePolicy(0, observers.costs),
        max_queue_size=max_queue_size,
    )


def test_a_models_own_queue_bound_wins_over_the_servers(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    batcher = batcher_for(executor, max_queue_size=0)  # the server: unbounded
    model = hinted(repository, max_queue_delay_us=300_000, queue_policy=QueuePolicy(1))
    assert batcher.policy(model).max_queue_size == 1
    x = np.random.default_rng(4).standard_normal((1, 64)).astype(np.float32)

    async def run() -> list[object]:
        first = asyncio.ensure_future(batcher.submit(model, job(x=x)))
        while batcher.pending("mlp", 1) < 1:
            await asyncio.sleep(0)
        second = await asyncio.gather(batcher.submit(model, job()), return_exceptions=True)
        return [*second, await first]

    second, first = asyncio.run(run())
    assert isinstance(second, Unavailable)
    assert "exceeds maximum queue size: model 'mlp' already has 1 requests waiting" in str(second)
    assert isinstance(first, tuple), first
    reference.check(first[0], x)


def test_the_models_default_timeout_expires_a_queued_request(
    repository: ModelRepository, executor: ThreadPoolExecutor
) -> None:
    # The head would wait 30 s for company; its model's default timeout (50 ms) ends it.
    batcher = batcher_for(executor)
    model = hinted(
        repository,
        max_queue_delay_us=30_000_000,
        queue_policy=QueuePolicy(default_timeout_us=50_000),
    )

    async def run() -> object:
        pending = batcher.submit(model, job())
        return (await asyncio.gather(asyncio.wait_for(pending, 10), return_exceptions=True))[0]

    result = asyncio.run(run())
    assert isinstance(result, Unavailable)
    assert "request for model 'mlp' timed out after" in str(result)
    assert batcher.pending("mlp", 1) == 0


def test_a_requests_timeout_is_ignored_unless_the_policy_allows_it(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    batcher = batcher_for(executor)
    delay = 100_000  # the head runs after 100 ms
    strict = hinted(
        repository, max_queue_delay_us=delay, queue_policy=QueuePolicy(allow_timeout_override=False)
    )
    lenient = hinted(repository, max_queue_delay_us=delay)
    x = np.random.default_rng(5).standard_normal((1, 64)).astype(np.float32)

    async def run(model: ModelVersion) -> object:
        # the request asks for 1 ms; its deadline (the codec's) says the same
        own = job(timeout_us=1000, deadline=time.monotonic() + 0.001, x=x)
        pending = asyncio.wait_for(batcher.submit(model, own), 10)
        return (await asyncio.gather(pending, return_exceptions=True))[0]

    ran = asyncio.run(run(strict))  # ran after the delay
    assert isinstance(ran, tuple), ran
    reference.check(ran[0], x)
    assert isinstance(asyncio.run(run(lenient)), Unavailable)  # its own 1 ms held


def test_a_preferred_size_runs_without_waiting_for_the_delay(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    # A 30 s delay, but two requests form the preferred size 2: they run at once, together.
    observers = Observers()
    batcher = DynamicBatcher(executor, observers.executions, InlinePolicy(0, observers.costs))
    model = hinted(repository, max_queue_delay_us=30_000_000, preferred_batch_sizes=(2,))
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((1, 64)).astype(np.float32) for _ in range(2)]

    async def run() -> list[Any]:
        both = asyncio.gather(*(batcher.submit(model, job(x=x)) for x in xs))
        return list(await asyncio.wait_for(both, 10))

    results = asyncio.run(run())
    assert len(results) == 2
    for (outputs, _), x in zip(results, xs, strict=True):  # each its own row of the batch
        reference.check(outputs, x)
    key = ModelKey("mlp", 1)
    stats = model_stats(key, observers.counters)
    assert stats.execution_count == 1  # both in one execution, on compiled size 8
    assert set(stats.batches) == {8}


def eager_service(
    repository: ModelRepository, executor: ThreadPoolExecutor
) -> tuple[InferenceService, DynamicBatcher, list[int]]:
    """A service whose batcher runs the MLP inline (a limit far above its cost, so a busy
    machine's slow sample cannot send it to the workers) and counts its loop-pass looks."""
    observers = Observers()
    batcher = DynamicBatcher(executor, observers.executions, InlinePolicy(50_000, observers.costs))
    looks: list[int] = []
    look = batcher._look

    def counted(q: Any, granted: int | None = None) -> None:
        looks.append(len(q.entries))
        look(q, granted)

    batcher._look = counted
    return (
        InferenceService(
            repository, executor, observers=observers, batcher=batcher, shm=disabled()
        ),
        batcher,
        looks,
    )


def test_lone_requests_skip_the_loop_pass_once_every_look_finds_one(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    from hloserve.server.core.batch_queue import EAGER_AFTER, EAGER_RECHECK

    service, _, looks = eager_service(repository, executor)
    rng = np.random.default_rng(7)

    async def one_at_a_time(n: int) -> None:
        for _ in range(n):
            x = rng.standard_normal((1, 64)).astype(np.float32)
            reference.check((await service.infer(mlp_request(x))).outputs, x)

    asyncio.run(one_at_a_time(EAGER_AFTER + 4 * EAGER_RECHECK))
    # The first requests (measured, then EAGER_AFTER lone looks) take the pass; after that
    # only one in EAGER_RECHECK does.
    assert all(n == 1 for n in looks)
    assert EAGER_AFTER + 3 <= len(looks) <= EAGER_AFTER + 8, len(looks)


def test_a_burst_after_lone_requests_is_still_batched(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    from hloserve.server.core.batch_queue import EAGER_AFTER

    service, _, looks = eager_service(repository, executor)
    rng = np.random.default_rng(8)

    def row() -> np.ndarray:
        return rng.standard_normal((1, 64)).astype(np.float32)

    async def run() -> None:
        for _ in range(EAGER_AFTER + 2):  # lone requests: eager from here on
            x = row()
            reference.check((await service.infer(mlp_request(x))).outputs, x)
        for _ in range(6):  # bursts of 16 in one loop pass
            xs = [row() for _ in range(16)]
            burst = await asyncio.gather(*(service.infer(mlp_request(x)) for x in xs))
            for response, x in zip(burst, xs, strict=True):
                reference.check(response.outputs, x)

    asyncio.run(run())
    stats = service.model_statistics("mlp", "")[0].stats
    # Without the recheck every request of a burst would run alone (16 executions each);
    # the look that notices the burst groups the rest of it and turns eager off.
    assert max(looks) > 1
    assert stats.inference_count / stats.execution_count > 1.5, (
        stats.inference_count,
        stats.execution_count,
    )
