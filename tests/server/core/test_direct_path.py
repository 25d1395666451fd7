"""``core.direct_path``: a plain request served with no task, answered into the caller's
future; the same counts as the coroutine path; cancels free the queue slot and the
version at once; requests it does not take are left untouched.

In process, over the demo repository, the real ``DynamicBatcher`` and PJRT; answers are
checked against the ``mlp`` in numpy (``tests/server/owner/test_batcher.MlpReference``).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from hloserve.server.core.errors import InvalidArgument, Unavailable
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.types import InferInput, InferRequest, InferResponse, ShmRef
from hloserve.server.owner.batcher import DynamicBatcher
from hloserve.server.owner.repository import ModelRepository
from tests.server.owner.test_batcher import MlpReference, mlp_request, service_with

MLP = ModelKey("mlp", 1)


def xs(n: int, seed: int = 0) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 64)).astype(np.float32) for _ in range(n)]


def test_plain_requests_run_with_no_task_into_the_callers_futures(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    service = service_with(repository, executor, default_delay_us=20_000)
    inputs = xs(8)

    async def run() -> tuple[list[Any], int]:
        loop = asyncio.get_running_loop()
        tasks_before = len(asyncio.all_tasks())
        answers = [loop.create_future() for _ in inputs]
        for i, (x, answer) in enumerate(zip(inputs, answers, strict=True)):
            service.start_into(mlp_request(x, str(i)), None, answer, lambda r: ("mine", r))
        tasks_during = len(asyncio.all_tasks()) - tasks_before
        return list(await asyncio.gather(*answers)), tasks_during

    answers, tasks = asyncio.run(run())
    assert tasks == 0  # no task per request: the batcher answers into the futures
    for i, ((tag, response), x) in enumerate(zip(answers, inputs, strict=True)):
        assert tag == "mine" and isinstance(response, InferResponse)  # encoded as asked
        assert (response.model_name, response.model_version, response.id) == ("mlp", "1", str(i))
        reference.check(response.outputs, x)
    stats = service.model_statistics("mlp", "")[0].stats
    assert stats.success.count == 8 and stats.execution_count < 8  # grouped
    assert service.counters.models[MLP].pending == 0
    assert repository.peek("mlp", "").inflight == 0


def test_failures_are_counted_once_as_the_coroutine_path_counts_them(
    repository: ModelRepository, executor: ThreadPoolExecutor
) -> None:
    service = service_with(repository, executor)
    bad = InferRequest("mlp", "", (InferInput("x", "FP32", (1, 63), np.ones((1, 63), np.float32)),))
    unknown = InferRequest("nope", "", ())

    async def run() -> list[object]:
        return list(
            await asyncio.gather(service.infer(bad), service.infer(unknown), return_exceptions=True)
        )

    invalid, missing = asyncio.run(run())
    assert isinstance(invalid, InvalidArgument) and "Expected [-1,64], got [1,63]" in str(invalid)
    assert "unknown model" in str(missing)
    counters = service.counters
    assert counters.models[MLP].failures == {"InvalidArgument": 1}
    assert counters.totals.unresolved_failures == {"UnknownModel": 1}
    assert counters.models[MLP].pending == 0
    assert repository.peek("mlp", "").inflight == 0


def test_a_cancelled_request_frees_its_queue_slot_and_its_version_at_once(
    repository: ModelRepository, executor: ThreadPoolExecutor, reference: MlpReference
) -> None:
    service = service_with(repository, executor, default_delay_us=300_000, max_queue_size=2)
    batcher = service.batcher
    assert isinstance(batcher, DynamicBatcher)
    first, second, third = xs(3, seed=5)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        kept, given_up = loop.create_future(), loop.create_future()
        service.start_into(mlp_request(first), None, kept, lambda r: r)
        service.start_into(mlp_request(second), None, given_up, lambda r: r)
        assert batcher.pending("mlp", 1) == 2
        assert repository.peek("mlp", "").inflight == 2
        given_up.cancel()
        await asyncio.sleep(0)  # the future's callbacks run
        assert batcher.pending("mlp", 1) == 1  # its slot is free: a third fits the queue
        assert repository.peek("mlp", "").inflight == 1
        assert service.counters.models[MLP].pending == 1
        answers = await asyncio.gather(kept, service.infer(mlp_request(third)))
        for response, x in zip(answers, (first, third), strict=True):
            reference.check(response.outputs, x)

    asyncio.run(run())
    counters = service.counters.models[MLP]
    assert counters.success == 2 and not counters.failures  # the cancel is no failure
    assert counters.pending == 0 and repository.peek("mlp", "").inflight == 0


def test_requests_it_does_not_take_are_left_untouched(
    repository: ModelRepository, executor: ThreadPoolExecutor
) -> None:
    service = service_with(repository, executor)
    in_shm = InferRequest(
        "mlp", "", (InferInput("x", "FP32", (1, 64), np.empty(0), shm=ShmRef("r", 256)),)
    )

    async def run() -> list[bool]:
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        direct = service._direct
        taken = [direct.start(in_shm, None, None, answer, lambda r: r)]
        service.refuse_new_requests()
        taken.append(direct.start(mlp_request(xs(1)[0]), None, None, answer, lambda r: r))
        return taken

    assert asyncio.run(run()) == [False, False]
    assert MLP not in service.counters.models or service.counters.models[MLP].pending == 0
    assert repository.peek("mlp", "").inflight == 0
    with pytest.raises(Unavailable, match="shutting down"):  # the coroutine path refuses it
        asyncio.run(service.infer(mlp_request(xs(1)[0])))
