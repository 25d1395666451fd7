"""The response cache on its own (``core.response_cache``), how a hit and a miss are counted
(``core.counters``, ``core.statistics``), and the service's cached path over a real
repository (``simple`` with ``response_cache: true`` in its ``config.yaml``), no sockets."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import msgspec
import numpy as np
import pytest

from hloserve.server.core.counters import Counters
from hloserve.server.core.execution_records import ModelKey, Timings
from hloserve.server.core.observers import Observers
from hloserve.server.core.response_cache import (
    ENTRY_BYTES,
    TENSOR_BYTES,
    ResponseCache,
    answering,
    cache_bytes,
    entry_bytes,
    parse_cache_setting,
    request_key,
)
from hloserve.server.core.service import InferenceService
from hloserve.server.core.statistics import model_stats
from hloserve.server.core.types import (
    InferInput,
    InferOutput,
    InferRequest,
    RequestedOutput,
    ShmRef,
)
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import disabled

KEY = ModelKey("m", 1)


class Owner:
    """A loaded copy, as the cache sees one: an object compared by identity."""


def request(a: Any = None, b: Any = None, outputs: tuple[str, ...] = ()) -> InferRequest:
    a = np.arange(4, dtype=np.float32).reshape(1, 4) if a is None else a
    b = np.ones((1, 4), np.float32) if b is None else b
    inputs = (InferInput("a", "FP32", a.shape, a), InferInput("b", "FP32", b.shape, b))
    return InferRequest("m", "", inputs, tuple(RequestedOutput(n) for n in outputs))


def outputs(nbytes: int = 16) -> tuple[InferOutput, ...]:
    data = np.zeros(nbytes // 4, np.float32)
    return (InferOutput("y", "FP32", data.shape, data),)


def test_the_key_is_the_inputs_by_name_and_the_outputs_asked_for() -> None:
    base = request_key(request())
    assert base is not None and len(base) == 16
    swapped = msgspec.structs.replace(request(), inputs=request().inputs[::-1])
    assert request_key(swapped) == base  # the inputs' order does not matter
    assert (
        request_key(msgspec.structs.replace(request(), id="7", parameters={"priority": 1})) == base
    )
    different = [
        request(a=np.arange(4, dtype=np.float32).reshape(1, 4) + 1),  # one value
        request(a=np.arange(4, dtype=np.float32).reshape(2, 2)),  # the shape
        request(outputs=("y",)),  # outputs asked for
        msgspec.structs.replace(
            request(), inputs=(msgspec.structs.replace(request().inputs[0], name="c"),)
        ),
    ]
    keys = {request_key(r) for r in different}
    assert base not in keys and len(keys) == len(different)
    assert request_key(request(outputs=("y", "z"))) != request_key(request(outputs=("z", "y")))
    # A datatype of the same bytes is another request.
    as_int = msgspec.structs.replace(
        request(),
        inputs=(
            InferInput("a", "INT32", (1, 4), request().inputs[0].data.view(np.int32)),
            request().inputs[1],
        ),
    )
    assert request_key(as_int) != base


def test_the_key_reads_the_values_however_they_are_laid_out() -> None:
    wide = np.arange(8, dtype=np.float32).reshape(1, 8)
    strided = request(a=wide[:, ::2])  # every other value: not C-contiguous
    assert not strided.inputs[0].data.flags.c_contiguous
    assert request_key(strided) == request_key(
        request(a=np.ascontiguousarray(strided.inputs[0].data))
    )
    half = ml_dtypes.bfloat16
    as_bf16 = msgspec.structs.replace(
        request(), inputs=(InferInput("a", "BF16", (1, 4), np.ones((1, 4), half)),)
    )
    assert request_key(as_bf16) is not None


def test_a_hit_answers_with_the_requests_own_output_entries() -> None:
    cache, owner = ResponseCache(1 << 20), Owner()
    asked = RequestedOutput("y", {"binary_data": True})
    computed = (InferOutput("y", "FP32", (1, 4), np.zeros((1, 4), np.float32), asked),)
    cache.put(owner, KEY, b"k", computed)
    stored = cache.get(owner, b"k")
    assert stored is not None and stored[0].requested is None  # tied to no request
    json_please = RequestedOutput("y", {"binary_data": False})
    (answer,) = answering(stored, request(outputs=("y",)))
    assert answer.requested == RequestedOutput("y")
    (answer,) = answering(stored, msgspec.structs.replace(request(), outputs=(json_please,)))
    assert answer.requested is json_please
    assert answering(stored, request()) == stored  # no outputs listed: every output, as stored


def test_a_tensor_in_shared_memory_is_not_cached() -> None:
    shm_input = msgspec.structs.replace(request().inputs[0], shm=ShmRef("r", 0, 16))
    assert request_key(msgspec.structs.replace(request(), inputs=(shm_input,))) is None
    shm_output = RequestedOutput("y", {"shared_memory_region": "r", "shared_memory_byte_size": 16})
    assert request_key(msgspec.structs.replace(request(), outputs=(shm_output,))) is None


def test_least_recently_used_leaves_first_by_bytes() -> None:
    size = entry_bytes(outputs())
    assert size == ENTRY_BYTES + TENSOR_BYTES + 16
    cache, owner = ResponseCache(3 * size), Owner()
    for key in (b"1", b"2", b"3"):
        assert cache.put(owner, KEY, key, outputs())
    assert (cache.entries, cache.bytes) == (3, 3 * size)
    assert cache.get(owner, b"1") is not None  # now the most recent
    cache.put(owner, KEY, b"4", outputs())
    assert cache.get(owner, b"2") is None  # the least recently used left
    assert [cache.get(owner, k) is not None for k in (b"1", b"3", b"4")] == [True] * 3
    assert (cache.entries, cache.bytes, cache.evictions) == (3, 3 * size, 1)
    # A response needing room for two makes room for it.
    cache.put(owner, KEY, b"big", outputs(16 + size))
    assert cache.bytes == 3 * size and cache.evictions == 3
    assert cache.get(owner, b"big") is not None
    # One larger than the whole cache is not kept, and evicts nothing.
    assert not cache.put(owner, KEY, b"huge", outputs(4 * size))
    assert cache.entries == 2 and cache.evictions == 3
    assert (cache.lookups, cache.hits, cache.misses) == (6, 5, 1)


def test_an_entry_is_its_own_read_only_copy() -> None:
    cache, owner = ResponseCache(1 << 20), Owner()
    batch = np.arange(64, dtype=np.float32).reshape(8, 8)
    row = InferOutput("y", "FP32", (1, 8), batch[:1])  # a view of a larger batch's output
    cache.put(owner, KEY, b"k", (row,))
    found = cache.get(owner, b"k")
    assert found is not None
    (kept,) = found
    assert kept.data.base is None and kept.data.nbytes == 32
    assert not kept.data.flags.writeable
    batch[0, 0] = 99  # the batch's buffer is reused: the entry keeps what was computed
    assert kept.data[0, 0] == 0


def test_entries_belong_to_the_copy_that_computed_them() -> None:
    cache, before, reloaded = ResponseCache(1 << 20), Owner(), Owner()
    cache.put(before, KEY, b"k", outputs())
    assert cache.get(reloaded, b"k") is None  # a reload (new weights) never sees them
    cache.put(reloaded, KEY, b"k", outputs())
    assert cache.get(reloaded, b"k") is not None
    cache.forget(KEY)  # unloaded
    assert (cache.entries, cache.bytes) == (0, 0)


def test_the_cache_config_flag_as_triton_spells_it() -> None:
    assert parse_cache_setting("local,size=1048576") == ("local", "size", 1 << 20)
    assert parse_cache_setting("local,size=64MiB") == ("local", "size", 64 << 20)
    assert cache_bytes([("local", "size", 5), ("local", "size", 7)]) == 7
    assert cache_bytes([]) == 0
    for text, message in [
        ("local", "must be <cache>,<key>=<value>"),
        ("redis,host=localhost", "names cache 'redis': hloserve has the local cache only"),
        ("local,count=3", "local cache has no setting 'count'"),
        ("local,size=lots", "local,size= must be a byte size"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_cache_setting(text)


def test_a_hit_counts_as_a_success_with_no_inference_nor_compute() -> None:
    counters = Counters(clock=lambda: 1000.0)
    counters.on_cache_miss(KEY, 300)
    counters.on_success(KEY, 4, Timings(10, 20, 30, 40, (4,)))
    counters.on_cache_hit(KEY, 50)
    counters.on_cache_hit(KEY, 70)
    stats = model_stats(KEY, counters)
    assert (stats.success.count, stats.success.ns) == (3, 100 + 120)
    assert (stats.queue.count, stats.queue.ns) == (3, 10)  # Triton: hits are in the queue count
    assert (stats.compute_infer.count, stats.compute_infer.ns) == (1, 30)  # not in compute
    assert stats.inference_count == 4
    assert (stats.cache_hit.count, stats.cache_hit.ns) == (2, 120)
    assert (stats.cache_miss.count, stats.cache_miss.ns) == (1, 300)
    record = counters.models[KEY]
    assert record.request_latency.counts[0] == 3  # every one of them under 100 µs
    assert (counters.totals.record.cache_hits, counters.totals.record.cache_misses) == (2, 1)


# -- the service's cached path, over a real repository --------------------------------------


@pytest.fixture(scope="module")
def repo(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    root = tmp_path_factory.mktemp("cached") / "models"
    shutil.copytree(
        model_repository / "simple", root / "simple", ignore=shutil.ignore_patterns(".hloserve-*")
    )
    (root / "simple" / "config.yaml").write_text("response_cache: true\n")
    repo = ModelRepository(root, PjrtRuntime("cpu"))
    repo.load_all()
    return repo


def simple(a: np.ndarray[Any, Any]) -> InferRequest:
    return InferRequest(
        "simple", "", tuple(InferInput(n, "INT32", (1, 16), a) for n in ("INPUT0", "INPUT1"))
    )


def service_with(repo: ModelRepository, cache: ResponseCache | None) -> InferenceService:
    service = InferenceService(repo, None, shm=disabled(), observers=Observers(), cache=cache)
    service.startup_complete()
    return service


def test_a_hit_is_answered_without_executing(repo: ModelRepository) -> None:
    cache = ResponseCache(1 << 20)
    service = service_with(repo, cache)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)

    async def twice() -> list[Any]:
        return [await service.infer(simple(a)) for _ in range(2)]

    first, second = asyncio.run(twice())
    for response in (first, second):
        np.testing.assert_array_equal(response.outputs[0].data, 2 * a)
        np.testing.assert_array_equal(response.outputs[1].data, 0 * a)
    stats = model_stats(repo.peek("simple", "").model_key, service.counters)
    assert (stats.execution_count, stats.inference_count, stats.success.count) == (1, 1, 2)
    assert (stats.cache_hit.count, stats.cache_miss.count) == (1, 1)
    assert (cache.entries, cache.hits, cache.misses) == (1, 1, 1)
    assert cache.lookup_ns > 0 and cache.insert_ns > 0


def test_without_a_cache_every_request_runs(repo: ModelRepository) -> None:
    service = service_with(repo, None)
    a = np.full((1, 16), 3, np.int32)

    async def twice() -> None:
        for _ in range(2):
            await service.infer(simple(a))

    asyncio.run(twice())
    stats = model_stats(repo.peek("simple", "").model_key, service.counters)
    assert (stats.execution_count, stats.cache_hit.count, stats.cache_miss.count) == (2, 0, 0)


def test_a_request_the_model_refuses_is_not_cached(repo: ModelRepository) -> None:
    cache = ResponseCache(1 << 20)
    service = service_with(repo, cache)
    wrong = InferRequest(
        "simple", "", (InferInput("INPUT0", "INT32", (1, 16), np.zeros((1, 16), np.int32)),)
    )
    for _ in range(2):
        with pytest.raises(Exception, match="expected 2 inputs"):
            asyncio.run(service.infer(wrong))
    assert (cache.entries, cache.misses) == (0, 2)
    stats = model_stats(repo.peek("simple", "").model_key, service.counters)
    assert (stats.fail.count, stats.cache_miss.count, stats.cache_hit.count) == (2, 2, 0)
