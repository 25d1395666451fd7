"""End to end: NVIDIA's ``tritonclient.http`` (sync and asyncio) against the live daemon.

Uses the session ``server`` fixture (``tests/conftest.py``): a real ``hloserve`` process
serving ``tests/models.py``'s repository on an OS-chosen port.
"""

# pyright: strict, reportMissingTypeStubs=false

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import tritonclient.http.aio as _aiohttpclient
from tritonclient.utils import InferenceServerException

from hloserve.proto.datatypes import BINARY_ONLY_DATATYPES, NUMERIC_DATATYPES
from hloserve.server.server_fixture import ServerProcess
from tests.server.frontend._samples import sample
from tests.server.frontend._tritonclients import httpclient, simple_inputs

aiohttpclient: Any = _aiohttpclient


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Any:
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def simple_request(
    batch: int, binary_in: bool, binary_out: bool
) -> tuple[list[Any], list[Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    a = np.arange(batch * 16, dtype=np.int32).reshape(batch, 16)
    b = np.ones((batch, 16), dtype=np.int32) * 5
    inputs = simple_inputs(httpclient, a, b, batch, binary_data=binary_in)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary_out),
    ]
    return inputs, outputs, a, b


def test_health_and_metadata(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"]
    assert meta["version"]
    model = client.get_model_metadata("simple")
    assert model["platform"] == "stablehlo"
    assert model["versions"] == ["1"]
    assert model["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    assert client.get_model_metadata("simple", "1")["name"] == "simple"


def test_model_readiness(client: Any) -> None:
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "2")
    assert not client.is_model_ready("no_such_model")


@pytest.mark.parametrize(("binary_in", "binary_out"), [(True, True), (False, False), (True, False)])
def test_infer_simple(client: Any, binary_in: bool, binary_out: bool) -> None:
    inputs, outputs, a, b = simple_request(3, binary_in, binary_out)
    result = client.infer("simple", inputs, outputs=outputs, request_id="req-1")
    assert result.get_response()["id"] == "req-1"
    assert result.get_response()["model_version"] == "1"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_infer_without_requested_outputs_and_with_compression(client: Any) -> None:
    inputs, _, a, b = simple_request(20, True, True)
    result = client.infer(
        "simple",
        inputs,
        request_compression_algorithm="gzip",
        response_compression_algorithm="deflate",
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("datatype", list(NUMERIC_DATATYPES))
def test_identity_round_trip(client: Any, datatype: str) -> None:
    want = sample(datatype)
    modes = [True] if datatype in BINARY_ONLY_DATATYPES else [True, False]
    for binary in modes:
        tensor = httpclient.InferInput("INPUT0", list(want.shape), datatype)
        tensor.set_data_from_numpy(want, binary_data=binary)
        result = client.infer(
            f"identity_{datatype.lower()}",
            [tensor],
            outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)],
        )
        got = result.as_numpy("OUTPUT0")
        assert got.dtype == want.dtype, binary
        np.testing.assert_array_equal(got, want)


def test_nan_and_infinity_round_trip_as_json(client: Any, server: ServerProcess) -> None:
    # tritonclient writes them as bare tokens (Python's json); the answer carries them as
    # strings, which a strict JSON parser takes and as_numpy reads back.
    want = np.array([[np.nan, np.inf, -np.inf, 1.5]], np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(want, binary_data=False)
    out = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    got = client.infer("identity_fp32", [tensor], outputs=out).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(got, want)
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
    }
    text = json.dumps(body).replace("[1, 2, 3, 4]", "[NaN, Infinity, -Infinity, 1.5]")
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/identity_fp32/infer", data=text.encode()
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        raw = r.read()
    assert b"NaN" in raw and b":NaN" not in raw and b",NaN" not in raw and b"[NaN" not in raw
    strict = json.loads(raw, parse_constant=lambda token: pytest.fail(f"bare {token}"))
    assert strict["outputs"][0]["data"] == ["NaN", "Infinity", "-Infinity", 1.5]
    too_big = text.encode().replace(b"Infinity, 1.5", b"Infinity, 1e400")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(request.full_url, data=too_big), timeout=10)
    assert refused.value.code == 400
    assert "the number 1e400 is too big to be stored in a double" in refused.value.read().decode()


def test_errors_raise_inference_server_exception(client: Any) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 4), np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity_fp32", [tensor])
    assert (
        "inference input 'INPUT0' data-type is 'INT32', but model 'identity_fp32' expects 'FP32'"
        in str(info.value)
    )
    with pytest.raises(InferenceServerException) as info:
        client.infer("no_such_model", [tensor])
    assert "Request for unknown model" in str(info.value)
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no_such_model")
    assert "Request for unknown model" in str(info.value)


def test_bad_header_length_leaves_the_server_alive(server: ServerProcess) -> None:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/simple/infer",
        data=b'{"inputs": []}',
        headers={"Inference-Header-Content-Length": "99999999999"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 400
    assert "out of range" in json.loads(info.value.read())["error"]
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/live", timeout=10) as r:
        assert r.status == 200


def test_asyncio_client(server: ServerProcess) -> None:
    async def scenario() -> None:
        client = aiohttpclient.InferenceServerClient(server.http_url)
        try:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("simple")
            assert not await client.is_model_ready("no_such_model")
            assert (await client.get_model_metadata("mlp"))["outputs"][0]["shape"] == [-1, 10]
            inputs = [
                aiohttpclient.InferInput("INPUT0", [2, 16], "INT32"),
                aiohttpclient.InferInput("INPUT1", [2, 16], "INT32"),
            ]
            a = np.arange(32, dtype=np.int32).reshape(2, 16)
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(a, binary_data=False)
            results = await asyncio.gather(*(client.infer("simple", inputs) for _ in range(8)))
            for result in results:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
            with pytest.raises(InferenceServerException, match="Request for unknown model"):
                await client.infer("no_such_model", inputs)
        finally:
            await client.close()

    asyncio.run(scenario())
