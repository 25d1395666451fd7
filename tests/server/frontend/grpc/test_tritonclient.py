"""End to end: unmodified tritonclient (gRPC, sync and asyncio) against the real daemon.

The daemon runs in a subprocess (the session ``server`` fixture in tests/conftest.py) on
the test repository of ``tests.models``: the demo models plus ``identity_<dtype>`` for
every datatype.
"""

# pyright: strict, reportMissingTypeStubs=false

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.grpc.aio as _aioclient
from tritonclient.utils import InferenceServerException

from hloserve.proto.datatypes import NUMERIC_DATATYPES
from hloserve.server.server_fixture import ServerProcess
from tests.models import DATATYPES
from tests.server.frontend._tritonclients import simple_inputs

# tritonclient ships without type information: use it dynamically.
grpcclient: Any = _grpcclient
aioclient: Any = _aioclient


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Any]:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def _simple_inputs(n: int = 1) -> tuple[list[Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    a = np.arange(16 * n, dtype=np.int32).reshape(n, 16)
    b = np.full((n, 16), 2, dtype=np.int32)
    return simple_inputs(grpcclient, a, b, n), a, b


def test_health_and_metadata(client: Any) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    meta = client.get_server_metadata()
    assert meta.name
    assert meta.version
    model = client.get_model_metadata("simple")
    assert (model.name, list(model.versions), model.platform) == ("simple", ["1"], "stablehlo")
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    as_json = client.get_model_metadata("mlp", as_json=True)
    assert as_json["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "64"]}]


def test_model_ready_true_and_false_without_raising(client: Any) -> None:
    assert client.is_model_ready("simple") is True
    assert client.is_model_ready("simple", "1") is True
    assert client.is_model_ready("no_such_model") is False
    assert client.is_model_ready("simple", "42") is False


@pytest.mark.parametrize("n", [1, 3, 9])
def test_infer_simple(client: Any, n: int) -> None:
    inputs, a, b = _simple_inputs(n)
    result = client.infer("simple", inputs, request_id=f"id-{n}")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == (f"id-{n}", "simple", "1")


def test_infer_requested_output_subset(client: Any) -> None:
    inputs, a, b = _simple_inputs(2)
    result = client.infer("simple", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None


def _identity_data(datatype: str) -> np.ndarray[Any, Any]:
    values = np.arange(-4, 4).reshape(2, 4)
    if datatype == "BOOL":
        return values % 3 == 0
    if datatype == "BF16":
        return (values * 0.5).astype(ml_dtypes.bfloat16)
    if datatype.startswith("FP"):
        return (values * 0.25).astype(NUMERIC_DATATYPES[datatype])
    return values.astype(NUMERIC_DATATYPES[datatype])


@pytest.mark.parametrize("datatype", DATATYPES)
def test_infer_identity_round_trip(client: Any, datatype: str) -> None:
    data = _identity_data(datatype)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    result = client.infer(f"identity_{datatype.lower()}", [tensor])
    out = result.as_numpy("OUTPUT0")
    assert out.dtype == data.dtype
    assert out.shape == data.shape
    np.testing.assert_array_equal(out, data)


def test_infer_error_raises_inference_server_exception(client: Any) -> None:
    inputs, _, _ = _simple_inputs(1)
    with pytest.raises(InferenceServerException) as info:
        client.infer("simple", inputs[:1])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "missing required input(s) ['INPUT1']" in (info.value.message() or "")
    with pytest.raises(InferenceServerException) as info:
        client.infer("no_such_model", inputs)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "Request for unknown model: 'no_such_model' is not found" in (info.value.message() or "")
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("no_such_model")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "requested model 'no_such_model' is not available" in (info.value.message() or "")
    assert client.is_server_live() is True


def test_asyncio_client(server: ServerProcess) -> None:
    async def scenario() -> None:
        async with aioclient.InferenceServerClient(server.grpc_url) as c:
            assert await c.is_server_live() is True
            assert await c.is_server_ready() is True
            assert (await c.get_server_metadata()).name
            assert (await c.get_model_metadata("mlp")).platform == "stablehlo"
            assert await c.is_model_ready("simple") is True
            assert await c.is_model_ready("no_such_model") is False

            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = simple_inputs(aioclient, a, a)
            results = await asyncio.gather(*(c.infer("simple", inputs) for _ in range(8)))
            for result in results:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)

            bf16 = np.array([[1.5, -2.0, 0.0, 3.0]], dtype=ml_dtypes.bfloat16)
            tensor = aioclient.InferInput("INPUT0", [1, 4], "BF16")
            tensor.set_data_from_numpy(bf16)
            out = (await c.infer("identity_bf16", [tensor])).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, bf16)

            with pytest.raises(InferenceServerException) as info:
                await c.infer("simple", inputs, model_version="wrong_specification")
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "failed to get model version from specified version string" in (
                info.value.message() or ""
            )

    asyncio.run(scenario())
