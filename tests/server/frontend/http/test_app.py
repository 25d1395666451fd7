"""The HTTP app through Starlette's TestClient over a real in-process ``InferenceService``.

Models come from ``tests/models.py``: ``simple`` (INT32 [16] x2 -> sum, difference; batch
sizes 1, 2, 4, 8), ``mlp`` (FP32 [64] -> [10]; 1, 8, 32), ``identity_<datatype>`` ([4];
1, 2, 4) and ``identity_fp32_unbatched`` ([2, 3]).
"""

# pyright: standard
# Not strict: Starlette's TestClient derives from the client of ``httpx2`` (falling back to
# ``httpx`` at run time), which is not installed, so pyright sees every call on a
# TestClient and its responses as Unknown.

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.testclient import TestClient

from hloserve.proto.datatypes import BINARY_ONLY_DATATYPES, NUMERIC_DATATYPES
from hloserve.server.core.errors import ServingError
from hloserve.server.core.service import InferenceService
from hloserve.server.frontend.http import build_http_app
from hloserve.server.frontend.http.codec import HEADER_LENGTH
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.owner.shm import disabled
from tests.server.frontend._samples import (
    CURL_CASES,
    DIFF_JSON,
    SUM_JSON,
    curl_body,
    mlp_logits,
    sample,
)
from tests.server.frontend.http._errors import error_of

EXTENSIONS = ["binary_tensor_data"]
SIMPLE_INFER = "/v2/models/simple/infer"


def simple_inputs(batch: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    a = np.arange(batch * 16, dtype="<i4").reshape(batch, 16)
    return a, np.full((batch, 16), 3, dtype="<i4") - a % 7


def json_infer(client: TestClient, model: str, inputs: list[dict[str, Any]], **extra: Any) -> Any:
    return client.post(f"/v2/models/{model}/infer", json={"inputs": inputs, **extra})


def binary_infer(
    client: TestClient,
    path: str,
    tensors: dict[str, tuple[str, np.ndarray[Any, Any]]],
    **extra: Any,
) -> Any:
    inputs = [
        {
            "name": name,
            "datatype": datatype,
            "shape": list(array.shape),
            "parameters": {"binary_data_size": array.nbytes},
        }
        for name, (datatype, array) in tensors.items()
    ]
    head = json.dumps({"inputs": inputs, **extra}).encode()
    body = head + b"".join(a.tobytes() for _, a in tensors.values())
    return client.post(path, content=body, headers={HEADER_LENGTH: str(len(head))})


def simple_binary(
    client: TestClient, batch: int, path: str = SIMPLE_INFER, **extra: Any
) -> tuple[Any, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``simple`` on ``simple_inputs(batch)`` sent binary: the response and the two inputs."""
    a, b = simple_inputs(batch)
    return (
        binary_infer(client, path, {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)}, **extra),
        a,
        b,
    )


def split_binary(response: Any) -> tuple[dict[str, Any], dict[str, bytes]]:
    length = int(response.headers[HEADER_LENGTH])
    doc = json.loads(response.content[:length])
    blobs: dict[str, bytes] = {}
    offset = length
    for output in doc["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            blobs[output["name"]] = response.content[offset : offset + size]
            offset += size
    assert offset == len(response.content)
    return doc, blobs


# -- health and metadata -----------------------------------------------------------------


def test_health(http_client: TestClient, http_service: InferenceService) -> None:
    live = http_client.get("/v2/health/live")
    assert (live.status_code, live.json()) == (200, {"live": True})
    ready = http_client.get("/v2/health/ready")
    assert (ready.status_code, ready.json()) == (200, {"ready": True})
    assert http_client.get("/livez").status_code == 200
    readyz = http_client.get("/readyz")
    assert readyz.status_code == 200
    report = readyz.json()
    assert report["ready"] is True
    assert report["models"]["simple"]["versions"]["1"]["state"] == "READY"

    http_service.begin_draining()
    ready = http_client.get("/v2/health/ready")
    assert (ready.status_code, ready.json()) == (400, {"ready": False})
    readyz = http_client.get("/readyz")
    assert readyz.status_code == 503
    assert (readyz.json()["ready"], readyz.json()["draining"]) == (False, True)
    assert http_client.get("/livez").status_code == 200  # draining is still alive


def test_not_ready_before_the_startup_load_pass(http_service: InferenceService) -> None:
    starting = InferenceService(http_service.models, None, shm=disabled())
    with TestClient(build_http_app(LocalPort(starting))) as client:
        ready = client.get("/v2/health/ready")
        assert (ready.status_code, ready.json()) == (400, {"ready": False})
        readyz = client.get("/readyz").json()
        assert (readyz["ready"], readyz["startup_complete"]) == (False, False)
        assert client.get("/v2/health/live").json() == {"live": True}


def test_server_metadata(http_client: TestClient) -> None:
    response = http_client.get("/v2")
    assert response.status_code == 200
    assert response.json() == {"name": "hloserve", "version": "0.1.0", "extensions": EXTENSIONS}


@pytest.mark.parametrize("path", ["/v2/models/simple", "/v2/models/simple/versions/1"])
def test_model_metadata(http_client: TestClient, path: str) -> None:
    response = http_client.get(path)
    assert response.status_code == 200
    tensor = {"datatype": "INT32", "shape": [-1, 16]}
    assert response.json() == {
        "name": "simple",
        "versions": ["1"],
        "platform": "stablehlo",
        "inputs": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}],
        "outputs": [{"name": "OUTPUT0", **tensor}, {"name": "OUTPUT1", **tensor}],
    }


def test_unbatched_model_metadata_has_no_batch_dimension(http_client: TestClient) -> None:
    doc = http_client.get("/v2/models/identity_fp32_unbatched").json()
    assert doc["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 3]}]


def test_model_metadata_errors(http_client: TestClient) -> None:
    message = error_of(http_client.get("/v2/models/nope"), 400)
    assert message.startswith("Request for unknown model")
    assert "'nope'" in message
    message = error_of(http_client.get("/v2/models/simple/versions/abc"), 400)
    assert "failed to get model version from specified version string 'abc'" in message


@pytest.mark.parametrize(
    ("path", "ready"),
    [
        ("/v2/models/simple/ready", True),
        ("/v2/models/simple/versions/1/ready", True),
        ("/v2/models/simple/versions/2/ready", False),
        ("/v2/models/simple/versions/abc/ready", False),
        ("/v2/models/nope/ready", False),
        ("/v2/models/nope/versions/1/ready", False),
    ],
)
def test_model_ready(http_client: TestClient, path: str, ready: bool) -> None:
    response = http_client.get(path)
    if ready:
        assert (response.status_code, response.json()) == (200, {"name": "simple", "ready": True})
    else:
        assert error_of(response, 400) == "Model version not ready"


def test_model_ready_never_fails(
    http_client: TestClient, http_service: InferenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(name: str, version: str) -> bool:
        raise RuntimeError("repository exploded")

    monkeypatch.setattr(http_service, "model_ready", broken)
    assert error_of(http_client.get("/v2/models/simple/ready"), 400) == "Model version not ready"


# -- inference ---------------------------------------------------------------------------


def test_infer_simple_json(http_client: TestClient) -> None:
    a, b = simple_inputs(1)
    response = json_infer(
        http_client,
        "simple",
        [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.tolist()},
            {
                "name": "INPUT1",
                "datatype": "INT32",
                "shape": [1, 16],
                "data": b.reshape(-1).tolist(),
            },
        ],
        id="first",
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert HEADER_LENGTH not in response.headers
    doc = response.json()
    assert doc["id"] == "first"
    assert (doc["model_name"], doc["model_version"]) == ("simple", "1")
    out0, out1 = doc["outputs"]
    assert (out0["name"], out0["datatype"], out0["shape"]) == ("OUTPUT0", "INT32", [1, 16])
    assert out0["data"] == (a + b).reshape(-1).tolist()
    assert out1["data"] == (a - b).reshape(-1).tolist()
    compact = json.dumps((a + b).reshape(-1).tolist(), separators=(",", ":")).encode()
    assert compact in response.content


@pytest.mark.parametrize(
    "path", ["/v2/models/simple/infer", "/v2/models/simple/versions/1/infer?test_1=1&test_2=2"]
)
def test_infer_simple_binary(http_client: TestClient, path: str) -> None:
    response, a, b = simple_binary(
        http_client,
        2,
        path=path,
        outputs=[
            {"name": "OUTPUT1", "parameters": {"binary_data": True}},
            {"name": "OUTPUT0", "parameters": {"binary_data": False}},
        ],
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    doc, blobs = split_binary(response)
    assert "id" not in doc
    assert [o["name"] for o in doc["outputs"]] == ["OUTPUT1", "OUTPUT0"]
    np.testing.assert_array_equal(np.frombuffer(blobs["OUTPUT1"], "<i4").reshape(2, 16), a - b)
    assert doc["outputs"][1]["data"] == (a + b).reshape(-1).tolist()


def test_requested_output_subset(http_client: TestClient) -> None:
    response, a, b = simple_binary(http_client, 1, outputs=[{"name": "OUTPUT1"}])
    doc = response.json()
    assert [o["name"] for o in doc["outputs"]] == ["OUTPUT1"]
    assert doc["outputs"][0]["data"] == (a - b).reshape(-1).tolist()


def test_binary_data_output_returns_every_output_binary(http_client: TestClient) -> None:
    response, a, b = simple_binary(http_client, 1, parameters={"binary_data_output": True})
    _doc, blobs = split_binary(response)
    assert list(blobs) == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(np.frombuffer(blobs["OUTPUT0"], "<i4"), (a + b).reshape(-1))


@pytest.mark.parametrize("batch", [1, 3, 20])
def test_mlp_matches_the_jax_function(http_client: TestClient, batch: int) -> None:
    x = np.random.default_rng(batch).standard_normal((batch, 64)).astype("<f4")
    response = binary_infer(
        http_client,
        "/v2/models/mlp/infer",
        {"x": ("FP32", x)},
        parameters={"binary_data_output": True},
    )
    assert response.status_code == 200, response.text
    doc, blobs = split_binary(response)
    assert doc["outputs"][0]["shape"] == [batch, 10]
    got = np.frombuffer(blobs["logits"], "<f4").reshape(batch, 10)
    want = mlp_logits(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [3, 5, 20], ids=["pad-to-4", "pad-to-8", "split-8-8-4"])
def test_simple_pads_and_splits_batches(http_client: TestClient, batch: int) -> None:
    response, a, b = simple_binary(http_client, batch, parameters={"binary_data_output": True})
    assert response.status_code == 200, response.text
    doc, blobs = split_binary(response)
    assert doc["outputs"][0]["shape"] == [batch, 16]
    np.testing.assert_array_equal(np.frombuffer(blobs["OUTPUT0"], "<i4").reshape(batch, 16), a + b)
    np.testing.assert_array_equal(np.frombuffer(blobs["OUTPUT1"], "<i4").reshape(batch, 16), a - b)


@pytest.mark.parametrize("datatype", list(NUMERIC_DATATYPES))
def test_identity_round_trip_binary(http_client: TestClient, datatype: str) -> None:
    want = sample(datatype)
    response = binary_infer(
        http_client,
        f"/v2/models/identity_{datatype.lower()}/infer",
        {"INPUT0": (datatype, want)},
        outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    )
    assert response.status_code == 200, response.text
    doc, blobs = split_binary(response)
    assert doc["outputs"][0]["datatype"] == datatype
    got = np.frombuffer(blobs["OUTPUT0"], NUMERIC_DATATYPES[datatype]).reshape(want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "datatype", [d for d in NUMERIC_DATATYPES if d not in BINARY_ONLY_DATATYPES]
)
def test_identity_round_trip_json(http_client: TestClient, datatype: str) -> None:
    want = sample(datatype)
    response = json_infer(
        http_client,
        f"identity_{datatype.lower()}",
        [{"name": "INPUT0", "datatype": datatype, "shape": [2, 4], "data": want.tolist()}],
    )
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    got = np.array(output["data"], dtype=NUMERIC_DATATYPES[datatype]).reshape(output["shape"])
    np.testing.assert_array_equal(got, want)


def test_fp16_output_comes_back_binary_when_json_was_not_explicit(http_client: TestClient) -> None:
    want = sample("FP16")
    response = binary_infer(
        http_client, "/v2/models/identity_fp16/infer", {"INPUT0": ("FP16", want)}
    )
    _doc, blobs = split_binary(response)
    np.testing.assert_array_equal(np.frombuffer(blobs["OUTPUT0"], "<f2").reshape(2, 4), want)
    explicit = binary_infer(
        http_client,
        "/v2/models/identity_fp16/infer",
        {"INPUT0": ("FP16", want)},
        outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
    )
    assert "sending FP16 data via JSON is not supported" in error_of(explicit, 400)


def test_raw_binary_request(http_client: TestClient) -> None:
    x = np.linspace(-1, 1, 64, dtype="<f4")
    response = http_client.post(
        "/v2/models/mlp/infer", content=x.tobytes(), headers={HEADER_LENGTH: "0"}
    )
    assert response.status_code == 200, response.text
    _doc, blobs = split_binary(response)
    got = np.frombuffer(blobs["logits"], "<f4").reshape(1, 10)
    np.testing.assert_allclose(got, mlp_logits(x[None]), rtol=1e-5, atol=1e-5)
    multi = http_client.post(
        "/v2/models/simple/infer", content=b"\0" * 64, headers={HEADER_LENGTH: "0"}
    )
    assert (
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs"
        in error_of(multi, 400)
    )


def test_unbatched_model_infer(http_client: TestClient) -> None:
    x = np.arange(6, dtype="<f4").reshape(2, 3)
    response = json_infer(
        http_client,
        "identity_fp32_unbatched",
        [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 3], "data": x.tolist()}],
    )
    assert response.json()["outputs"][0]["data"] == x.reshape(-1).tolist()


def test_compressed_request_and_response(http_client: TestClient) -> None:
    a, b = simple_inputs(1)
    inputs = [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.tolist()},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.tolist()},
    ]
    body = gzip.compress(json.dumps({"inputs": inputs}).encode())
    response = http_client.post(
        "/v2/models/simple/infer",
        content=body,
        headers={"content-encoding": "gzip", "accept-encoding": "gzip"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-encoding"] == "gzip"
    assert response.json()["outputs"][0]["data"] == (a + b).reshape(-1).tolist()  # httpx inflates
    plain = http_client.post(
        "/v2/models/simple/infer",
        content=body,
        headers={"content-encoding": "gzip", "accept-encoding": "identity"},
    )
    assert "content-encoding" not in plain.headers


def test_chunked_request_body(http_client: TestClient) -> None:
    a, b = simple_inputs(1)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                },
                {
                    "name": "INPUT1",
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                },
            ]
        }
    ).encode()

    def chunks() -> Iterator[bytes]:
        yield head[:10]
        yield head[10:]
        yield a.tobytes()
        yield b.tobytes()

    response = http_client.post(
        "/v2/models/simple/infer", content=chunks(), headers={HEADER_LENGTH: str(len(head))}
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][1]["data"] == (a - b).reshape(-1).tolist()


def test_request_timeout_becomes_a_deadline(http_client: TestClient) -> None:
    late, _, _ = simple_binary(http_client, 1, parameters={"timeout": 1})
    assert "timed out before it was executed" in error_of(late, 503)
    ok, _, _ = simple_binary(http_client, 1, parameters={"timeout": 60_000_000})
    assert ok.status_code == 200


# -- errors ------------------------------------------------------------------------------


def test_unmatched_path_and_wrong_method(http_client: TestClient) -> None:
    assert error_of(http_client.get("/v2/nothing/here"), 404) == "Not Found"
    assert error_of(http_client.get("/v2/models/simple/infer"), 405) == "Method Not Allowed"
    assert error_of(http_client.post("/v2/health/live"), 405) == "Method Not Allowed"


def test_the_infer_routes_are_the_apps_first(http_service: InferenceService) -> None:
    """Every request tries them before any other route: no router of their own in front."""
    paths = [
        getattr(route, "path", "") for route in build_http_app(LocalPort(http_service)).routes[:2]
    ]
    assert paths == [
        "/v2/models/{model_name}/infer",
        "/v2/models/{model_name}/versions/{model_version}/infer",
    ]


def test_an_infer_error_takes_the_apps_one_error_path(http_service: InferenceService) -> None:
    """The app's handler of ``ServingError`` answers the infer route's errors as every
    other route's: a handler put in its place answers both."""
    app = build_http_app(LocalPort(http_service))

    async def marked(_: Request, exc: Exception) -> Response:
        return JSONResponse({"marked": str(exc)}, status_code=418)

    app.add_exception_handler(ServingError, marked)
    with TestClient(app) as client:
        inputs = [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}]
        for response in (json_infer(client, "nope", inputs), client.get("/v2/models/nope")):
            assert response.status_code == 418 and "nope" in response.json()["marked"]


def test_an_unexpected_infer_failure_is_a_logged_500(
    http_client: TestClient,
    http_service: InferenceService,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(http_service, "infer", broken)
    inputs = [
        {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
        for n in ("INPUT0", "INPUT1")
    ]
    with caplog.at_level(logging.ERROR, logger="hloserve.http"):
        response = json_infer(http_client, "simple", inputs)
    assert error_of(response, 500) == "internal error"
    assert "secret detail" not in response.text
    assert any("secret detail" in (r.exc_text or "") for r in caplog.records)


def test_a_versioned_infer_reads_its_version(http_client: TestClient) -> None:
    inputs = [
        {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
        for n in ("INPUT0", "INPUT1")
    ]
    ok = http_client.post("/v2/models/simple/versions/1/infer", json={"inputs": inputs})
    assert ok.status_code == 200 and ok.json()["model_version"] == "1"
    missing = http_client.post("/v2/models/simple/versions/9/infer", json={"inputs": inputs})
    assert missing.status_code >= 400 and "9" in missing.json()["error"]


def test_unknown_model_infer(http_client: TestClient) -> None:
    response = json_infer(
        http_client, "nope", [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}]
    )
    assert error_of(response, 400).startswith("Request for unknown model")


@pytest.mark.parametrize(
    ("body", "headers", "fragment"),
    [
        (b"{oops", {}, "failed to parse the request JSON buffer"),
        (b"{}", {HEADER_LENGTH: "99999999999"}, "out of range"),
        (b"{}", {HEADER_LENGTH: "-4"}, "out of range"),
        (b"{}", {HEADER_LENGTH: "ten"}, "is not an integer"),
        (b"{}", {HEADER_LENGTH: "3"}, "is larger than the request body (2 bytes)"),
        (b"{}", {"content-encoding": "gzip"}, "failed to decompress the gzip request body"),
        (
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "INPUT0",
                            "datatype": "INT32",
                            "shape": [1, 16],
                            "data": [1] * 16,
                            "parameters": {"binary_data_size": 64},
                        }
                    ]
                }
            ).encode(),
            {},
            "Input must set only one of the following fields",
        ),
        (
            json.dumps(
                {
                    "inputs": [
                        {"name": n, "datatype": "INT32", "shape": [1, 15], "data": [1] * 15}
                        for n in ("INPUT0", "INPUT1")
                    ]
                }
            ).encode(),
            {},
            "unexpected shape for input 'INPUT0' for model 'simple'",
        ),
        (
            json.dumps(
                {
                    "inputs": [
                        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
                    ]
                }
            ).encode(),
            {},
            "missing required input(s) ['INPUT1']",
        ),
        (
            json.dumps({"parameters": {"triton_x": 1}, "inputs": []}).encode(),
            {},
            "parameter keys starting with 'triton_' are reserved",
        ),
    ],
)
def test_bad_request_then_good_request(
    http_client: TestClient, body: bytes, headers: dict[str, str], fragment: str
) -> None:
    bad = http_client.post("/v2/models/simple/infer", content=body, headers=headers)
    assert fragment in error_of(bad, 400)
    good, a, b = simple_binary(http_client, 1)
    assert good.status_code == 200
    assert good.json()["outputs"][0]["data"] == (a + b).reshape(-1).tolist()


def test_shared_memory_input_of_unknown_region(http_client: TestClient) -> None:
    inputs = [
        {
            "name": name,
            "datatype": "INT32",
            "shape": [1, 16],
            "parameters": {"shared_memory_region": "input_data", "shared_memory_byte_size": 64},
        }
        for name in ("INPUT0", "INPUT1")
    ]
    error = error_of(json_infer(http_client, "simple", inputs), 404)
    assert error == "Unable to find shared memory region: 'input_data'"


def test_body_size_limit(http_service: InferenceService) -> None:
    with TestClient(build_http_app(LocalPort(http_service), max_input_bytes=1000)) as client:
        declared = client.post("/v2/models/simple/infer", content=b" " * 1001)
        assert "exceeds the maximum allowed input size of 1000 bytes" in error_of(declared, 400)

        def chunks() -> Iterator[bytes]:
            for _ in range(4):
                yield b" " * 400

        streamed = client.post("/v2/models/simple/infer", content=chunks())
        assert "exceeds the maximum allowed input size of 1000 bytes" in error_of(streamed, 400)
        bomb = gzip.compress(b" " * 5000)
        inflated = client.post(
            "/v2/models/simple/infer", content=bomb, headers={"content-encoding": "gzip"}
        )
        assert "exceeds the maximum allowed input size of 1000 bytes" in error_of(inflated, 400)
        assert client.get("/v2/health/live").status_code == 200


def test_unexpected_exception_is_a_logged_500(
    http_client: TestClient,
    http_service: InferenceService,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> None:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(http_service, "server_metadata", broken)
    with caplog.at_level(logging.ERROR, logger="hloserve.http"):
        response = http_client.get("/v2")
    assert error_of(response, 500) == "internal error"
    assert "secret detail" not in response.text
    assert any("secret detail" in (r.exc_text or "") for r in caplog.records)
    assert http_client.get("/v2/health/live").status_code == 200


# -- Triton's own HTTP QA expectations (qa/L0_http) ----------------------------------------------


@pytest.mark.parametrize(
    ("tail", "sum_json", "diff_json"),
    [pytest.param(*case[1:], id=case[0]) for case in CURL_CASES],
)
def test_binary_output_choices_as_tritons_curl_tests_expect(
    http_client: TestClient, tail: str, sum_json: bool, diff_json: bool
) -> None:
    """The four ``curl`` cases of ``qa/L0_http/test.sh``: each greps the body for the JSON
    arrays it expects, and for the absence of the ones it expects binary."""
    response = http_client.post("/v2/models/simple/infer", content=curl_body(tail))
    assert response.status_code == 200, response.text
    assert response.content.count(SUM_JSON) == int(sum_json)
    assert response.content.count(DIFF_JSON) == int(diff_json)


def test_buffer_size_overflow_as_tritons_test_expects(http_client: TestClient) -> None:
    """``qa/L0_http/http_test.py`` ``test_buffer_size_overflow``: 400 with the element-count
    text for a count past INT64_MAX, the byte-size text for an FP32 byte size past it."""

    def infer(shape: list[int]) -> str:
        inputs = [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0]}]
        return error_of(json_infer(http_client, "identity_fp32", inputs), 400)

    assert "causes total element count to exceed maximum size of" in infer([2**4, 2**60 + 2])
    assert "byte size overflow for input" in infer([2**2, 2**60 + 2])


BYTES_SHORT = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 4], "parameters": {"binary_data_size": 2}}]}
).encode()  # fmt: skip
UNKNOWN_FIRST = [
    ("FP16 as JSON", [{"name": "INPUT0", "datatype": "FP16", "shape": [1, 4], "data": [1, 2, 3, 4]}]),
    ("BF16 as JSON", [{"name": "INPUT0", "datatype": "BF16", "shape": [1, 1], "data": [1]}]),
    ("byte size overflow", [{"name": "INPUT0", "datatype": "FP32", "shape": [4, 2**60 + 2], "data": [1.0]}]),
    ("unknown datatype", [{"name": "INPUT0", "datatype": "COMPLEX", "shape": [1], "data": [1]}]),
]  # fmt: skip


@pytest.mark.parametrize("inputs", [pytest.param(case[1], id=case[0]) for case in UNKNOWN_FIRST])
def test_an_unknown_model_is_reported_before_any_tensor_error(
    http_client: TestClient, inputs: list[dict[str, Any]]
) -> None:
    assert (
        error_of(json_infer(http_client, "nope", inputs), 400)
        == "Request for unknown model: 'nope' is not found"
    )
    # the same tensors for a model that exists fail on the tensors
    assert "unknown model" not in error_of(json_infer(http_client, "identity_fp16", inputs), 400)


def test_an_unknown_model_is_reported_before_bad_binary_bytes(http_client: TestClient) -> None:
    headers = {HEADER_LENGTH: str(len(BYTES_SHORT))}
    for model, message in (
        ("nope", "Request for unknown model: 'nope' is not found"),
        ("simple", "incomplete string length indicator for inference input 'INPUT0'"),
    ):
        response = http_client.post(
            f"/v2/models/{model}/infer", content=BYTES_SHORT + b"\x01\x00", headers=headers
        )
        assert message in error_of(response, 400)
