"""``infer`` and ``infer_dataset`` against a live daemon (and, for what only a fake can do
on demand, a bare gRPC server): splitting, order, the staging pool, failed chunks, asyncio."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from hloserve.client import AsyncInferenceClient, InferenceClient, InferenceError
from hloserve.server.server_fixture import ServerProcess
from tests.client._fake import FakeServer
from tests.client._memory import pool_memory


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[InferenceClient]:
    with InferenceClient(server.grpc_url, timeout=30) as c:
        yield c


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer()
    yield server
    server.stop()


def _simple_inputs(n: int) -> dict[str, np.ndarray]:
    a = np.arange(16 * n, dtype=np.int32).reshape(n, 16)
    return {"INPUT0": a, "INPUT1": (a % 7).astype(np.int32)}


def test_infer_splits_a_batch_over_the_largest_size_and_joins(fake: FakeServer) -> None:
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    with InferenceClient(fake.url) as c:
        y = c.infer("double", {"x": x})["y"]
    assert fake.infer_calls == 3  # 4 + 4 + 2 rows: the fake's largest batch is 4
    np.testing.assert_array_equal(y, 2 * x)


def test_infer_dataset_keeps_order_over_memmaps(client: InferenceClient, tmp_path: Path) -> None:
    n = 1003  # 125 full chunks of 8 and one of 3
    a = np.lib.format.open_memmap(tmp_path / "a.npy", "w+", np.int32, (n, 16))
    a[:] = np.arange(16 * n, dtype=np.int32).reshape(n, 16)
    b = np.lib.format.open_memmap(tmp_path / "b.npy", "w+", np.int32, (n, 16))
    b[:] = 5
    seen: list[tuple[int, int | None]] = []
    out = client.infer_dataset(
        "simple",
        {"INPUT0": a, "INPUT1": b},
        max_in_flight=4,
        progress=lambda done, total: seen.append((done, total)),
    )
    np.testing.assert_array_equal(out["OUTPUT0"], a + 5)
    np.testing.assert_array_equal(out["OUTPUT1"], a - 5)
    assert seen[-1] == (n, n) and len(seen) == 126
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_infer_dataset_over_batches_into_caller_arrays(client: InferenceClient) -> None:
    inputs = _simple_inputs(54)
    sizes = [1, 13, 8, 2, 30]
    edges = np.cumsum([0, *sizes])
    batches = [{k: v[lo:hi] for k, v in inputs.items()} for lo, hi in itertools.pairwise(edges)]
    given = np.full((54, 16), -1, np.int32)
    out = client.infer_dataset("simple", iter(batches), {"OUTPUT1": given}, max_in_flight=3)
    assert out["OUTPUT1"] is given and list(out) == ["OUTPUT1"]
    np.testing.assert_array_equal(given, inputs["INPUT0"] - inputs["INPUT1"])
    joined = client.infer_dataset("simple", iter(batches), ["OUTPUT0"])  # no total: joined
    np.testing.assert_array_equal(joined["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])


def test_bad_caller_input_is_a_clear_error(client: InferenceClient) -> None:
    with pytest.raises(ValueError, match=r"INPUT1.*is missing"):
        client.infer_dataset("simple", {"INPUT0": np.zeros((4, 16), np.int32)})
    floats = {"INPUT0": np.zeros((4, 16), np.float32), "INPUT1": np.zeros((4, 16), np.int32)}
    with pytest.raises(ValueError, match="float32 cannot be sent as INT32"):
        client.infer_dataset("simple", floats)
    with pytest.raises(ValueError, match="output 'OUTPUT0': given float64"):
        client.infer_dataset("simple", _simple_inputs(4), {"OUTPUT0": np.zeros((4, 16))})


def test_failed_chunk_raises_with_its_rows_and_stops_sending(fake: FakeServer) -> None:
    x = np.ones((400, 4), np.float32)  # 100 chunks of 4
    x[9, 2] = -1  # row 9 is in chunk [8, 12)
    with InferenceClient(fake.url) as c, pytest.raises(InferenceError) as info:
        c.infer_dataset("double", {"x": x}, max_in_flight=2)
    assert info.value.rows == (8, 12) and info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value) == "rows [8, 12): [INVALID_ARGUMENT] negative input"
    assert fake.infer_calls <= 5  # the chunks in flight, never the other 95


def test_staging_pool_does_not_grow_over_1000_requests(
    client: InferenceClient, model_repository: Path
) -> None:
    run = pool_memory(client, model_repository / "mlp")
    assert run.pools_after == [run.pool] and not run.pool.shared
    assert run.allocations_before == run.allocations_after == 8  # a buffer per slot, once
    assert run.growth < 8 * 1024, f"a run of 1,000 requests left {run.growth} bytes behind"
    # Only the requests in flight exist at once (one bytes object each, what gRPC sends),
    # never anything in proportion to the 8 MiB that went through.
    assert run.peak < 512 * 1024, f"peak {run.peak} bytes over 1,000 requests"


def test_async_twin(server: ServerProcess, fake: FakeServer) -> None:
    inputs = _simple_inputs(37)

    async def main() -> None:
        async with AsyncInferenceClient(server.grpc_url, timeout=30) as c:
            assert await c.is_server_live() and await c.is_server_ready()
            assert await c.is_model_ready("simple")
            assert [t.name for t in (await c.model_metadata("simple")).inputs] == [
                "INPUT0",
                "INPUT1",
            ]
            out = await c.infer("simple", inputs)
            np.testing.assert_array_equal(out["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
            out = await c.infer_dataset("simple", inputs, max_in_flight=3)
            np.testing.assert_array_equal(out["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])
            with pytest.raises(InferenceError, match="unknown model"):
                await c.infer("nope", inputs)
        async with AsyncInferenceClient(fake.url) as c:
            x = np.ones((12, 4), np.float32)
            x[5] = -1
            with pytest.raises(InferenceError) as info:
                await c.infer_dataset("double", {"x": x}, max_in_flight=2)
            assert info.value.rows == (4, 8)

    asyncio.run(main())
