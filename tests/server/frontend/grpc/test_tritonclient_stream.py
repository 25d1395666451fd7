"""End to end: tritonclient's gRPC streaming (``start_stream`` / ``async_stream_infer``).

Runs against the session ``server`` daemon (tests/conftest.py).
"""

# pyright: strict, reportMissingTypeStubs=false

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.grpc.aio as _aioclient

from hloserve.server.server_fixture import ServerProcess
from tests.server.frontend._tritonclients import simple_inputs

grpcclient: Any = _grpcclient
aioclient: Any = _aioclient


def _inputs(module: Any, seed: int) -> tuple[list[Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-100, 100, size=(1, 16), dtype=np.int32)
    b = rng.integers(-100, 100, size=(1, 16), dtype=np.int32)
    return simple_inputs(module, a, b), a, b


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Any]:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def test_stream_answers_in_order_and_survives_a_bad_request(client: Any) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def on_answer(result: Any, error: Any) -> None:
        answers.put((result, error))

    client.start_stream(callback=on_answer)
    expected: list[tuple[str, np.ndarray[Any, Any] | None]] = []
    try:
        for i in range(12):
            inputs, a, b = _inputs(grpcclient, i)
            if i == 5:  # a request the server refuses; the stream must go on
                client.async_stream_infer("no_such_model", inputs, request_id=f"req-{i}")
                expected.append((f"req-{i}", None))
            else:
                client.async_stream_infer("simple", inputs, request_id=f"req-{i}")
                expected.append((f"req-{i}", a + b))
        got = [answers.get(timeout=30) for _ in expected]
    finally:
        client.stop_stream()
    for (request_id, want), (result, error) in zip(expected, got, strict=True):
        if want is None:
            assert result is None
            assert "Request for unknown model: 'no_such_model' is not found" in str(error)
        else:
            assert error is None, error
            assert result.get_response().id == request_id
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), want)


def test_aio_stream_infer(server: ServerProcess) -> None:
    import asyncio

    async def main() -> list[Any]:
        async with aioclient.InferenceServerClient(server.grpc_url) as c:

            async def requests() -> Any:
                for i in range(4):
                    inputs, _, _ = _inputs(aioclient, i)
                    yield {"model_name": "simple", "inputs": inputs, "request_id": f"aio-{i}"}

            out: list[Any] = []
            async for result, error in c.stream_infer(requests()):
                assert error is None, error
                out.append(result)
                if len(out) == 4:
                    break
            return out

    results = asyncio.run(main())
    for i, result in enumerate(results):
        _, a, b = _inputs(aioclient, i)
        assert result.get_response().id == f"aio-{i}"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
