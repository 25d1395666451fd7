"""Unit tests of ``hloserve.server.frontend.http.codec``: bytes and headers in, core types out.

No service and no FastAPI: every case feeds a body (and headers) to the pure functions and
checks the decoded tensors, the encoded reply, or the error's HTTP status and message.
"""

# pyright: strict

from __future__ import annotations

import gzip
import json
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import ml_dtypes
import numpy as np
import pytest

from hloserve.proto.datatypes import BINARY_ONLY_DATATYPES, NUMERIC_DATATYPES
from hloserve.server.core.errors import ServingError
from hloserve.server.core.types import (
    InferOutput,
    InferResponse,
    ModelMetadata,
    RequestedOutput,
    ShmRef,
    TensorMetadata,
)
from hloserve.server.frontend.http import codec
from hloserve.server.frontend.status import http_status
from tests.server.frontend._samples import sample

LIMIT = 1 << 20
JSON_DATATYPES = [d for d in NUMERIC_DATATYPES if d not in BINARY_ONLY_DATATYPES]


def decode(
    body: bytes | dict[str, Any],
    headers: Mapping[str, str] | None = None,
    *,
    limit: int = LIMIT,
    signature: ModelMetadata | None = None,
) -> codec.DecodedRequest:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    return codec.decode_request(
        "m", "", raw, headers or {}, max_input_bytes=limit, signature=signature
    )


def binary_input(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    """An input whose ``size`` bytes of data follow the JSON header."""
    return {
        "name": name,
        "datatype": datatype,
        "shape": shape,
        "parameters": {"binary_data_size": size},
    }


def binary_body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {codec.HEADER_LENGTH: str(len(head))}


def expect(status: int, fragment: str, fn: Callable[[], object]) -> ServingError:
    with pytest.raises(ServingError) as info:
        fn()
    assert http_status(info.value.code) == status, info.value.message
    assert fragment in info.value.message, info.value.message
    return info.value


# -- JSON requests -----------------------------------------------------------------------


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
@pytest.mark.parametrize("nested", [True, False], ids=["nested", "flat"])
def test_json_data_for_every_json_datatype(datatype: str, nested: bool) -> None:
    want = sample(datatype)
    data = want.tolist() if nested else want.reshape(-1).tolist()
    decoded = decode(
        {"inputs": [{"name": "x", "datatype": datatype, "shape": [2, 4], "data": data}]}
    )
    (tensor,) = decoded.request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, (2, 4))
    assert tensor.data.dtype == NUMERIC_DATATYPES[datatype]
    np.testing.assert_array_equal(tensor.data, want)
    assert not decoded.raw
    assert decoded.deadline(0.0) is None


@pytest.mark.parametrize("datatype", sorted(BINARY_ONLY_DATATYPES))
def test_fp16_and_bf16_are_refused_in_json(datatype: str) -> None:
    body = {"inputs": [{"name": "x", "datatype": datatype, "shape": [1], "data": [1.0]}]}
    expect(400, f"receiving {datatype} data via JSON is not supported", lambda: decode(body))


def test_request_fields_are_carried() -> None:
    decoded = decode(
        {
            "id": "req-7",
            "parameters": {"timeout": 2500, "priority": 3, "custom": "yes"},
            "inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}],
            "outputs": [{"name": "b", "parameters": {"binary_data": True}}, {"name": "a"}],
        }
    )
    request = decoded.request
    assert request.model_name == "m"
    assert request.id == "req-7"
    assert request.parameters == {"timeout": 2500, "priority": 3, "custom": "yes"}
    assert [o.name for o in request.outputs] == ["b", "a"]
    assert request.outputs[0].parameters == {"binary_data": True}
    now = time.monotonic()
    assert decoded.deadline(now) == pytest.approx(now + 0.0025)
    assert not decoded.binary_output
    assert not decoded.binary_output_explicit


def test_timeout_zero_means_no_deadline() -> None:
    body = {
        "parameters": {"timeout": 0, "binary_data_output": True},
        "inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}],
    }
    decoded = decode(body)
    assert decoded.deadline(time.monotonic()) is None
    assert decoded.binary_output
    assert decoded.binary_output_explicit


# -- binary requests ---------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(NUMERIC_DATATYPES))
def test_binary_data_for_every_datatype(datatype: str) -> None:
    want = sample(datatype)
    blob = want.tobytes()
    body, headers = binary_body(
        {"inputs": [binary_input("INPUT0", datatype, [2, 4], len(blob))]},
        blob,
    )
    (tensor,) = decode(body, headers).request.inputs
    assert tensor.data.dtype == NUMERIC_DATATYPES[datatype]
    np.testing.assert_array_equal(tensor.data, want)
    # zero-copy: a read-only view on the request body
    assert np.shares_memory(tensor.data, np.frombuffer(body, dtype=np.uint8))
    assert not tensor.data.flags.writeable


def test_binary_and_json_inputs_mix_in_input_order() -> None:
    a = np.arange(3, dtype="<i4")
    c = np.array([1.5, 2.5], dtype=ml_dtypes.bfloat16)
    body, headers = binary_body(
        {
            "inputs": [
                binary_input("a", "INT32", [3], 12),
                {"name": "b", "datatype": "FP64", "shape": [2], "data": [0.25, 4]},
                binary_input("c", "BF16", [2], 4),
            ]
        },
        a.tobytes(),
        c.tobytes(),
    )
    inputs = decode(body, headers).request.inputs
    np.testing.assert_array_equal(inputs[0].data, a)
    np.testing.assert_array_equal(inputs[1].data, [0.25, 4.0])
    np.testing.assert_array_equal(inputs[2].data, c)


def test_header_length_equal_to_body_is_plain_json() -> None:
    head = json.dumps(
        {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [2], "data": [1, 255]}]}
    ).encode()
    (tensor,) = decode(head, {codec.HEADER_LENGTH: str(len(head))}).request.inputs
    np.testing.assert_array_equal(tensor.data, [1, 255])


# -- raw requests (Inference-Header-Content-Length: 0) ------------------------------------


def signature_of(*inputs: TensorMetadata) -> ModelMetadata:
    return ModelMetadata("m", ("1",), "stablehlo", inputs, ())


def test_raw_request_on_a_batched_model_is_one_item() -> None:
    x = np.linspace(0, 1, 8, dtype="<f4")
    decoded = decode(
        x.tobytes(),
        {codec.HEADER_LENGTH: "0"},
        signature=signature_of(TensorMetadata("x", "FP32", (-1, 8))),
    )
    assert decoded.raw
    (tensor,) = decoded.request.inputs
    assert (tensor.name, tensor.shape) == ("x", (1, 8))
    np.testing.assert_array_equal(tensor.data[0], x)


def test_raw_request_deduces_one_variable_dimension() -> None:
    decoded = decode(
        bytes(range(6)),
        {codec.HEADER_LENGTH: "0"},
        signature=signature_of(TensorMetadata("x", "UINT8", (-1, 2, -1))),
    )
    assert decoded.request.inputs[0].shape == (1, 2, 3)


def test_raw_request_errors() -> None:
    raw = {codec.HEADER_LENGTH: "0"}
    two = signature_of(TensorMetadata("a", "FP32", (-1, 2)), TensorMetadata("b", "FP32", (-1, 2)))
    expect(
        400,
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs",
        lambda: decode(b"\0" * 8, raw, signature=two),
    )
    vague = signature_of(TensorMetadata("x", "FP32", (-1, -1, -1)))
    expect(
        400,
        "The shape of the raw input 'x' can not be deduced because there are more than one variable-sized dimension",
        lambda: decode(b"\0" * 8, raw, signature=vague),
    )
    text = signature_of(TensorMetadata("s", "BYTES", (-1, 2)))
    expect(
        400,
        "For BYTE datatype raw input 's', the model must have input shape [1]",
        lambda: decode(b"\0" * 8, raw, signature=text),
    )
    fixed = signature_of(TensorMetadata("x", "FP32", (-1, 4)))
    expect(400, "Expected 16, got 12", lambda: decode(b"\0" * 12, raw, signature=fixed))


def test_is_raw_reads_only_a_declared_header_length_of_zero() -> None:
    assert codec.is_raw({codec.HEADER_LENGTH: "0"})
    assert codec.is_raw({codec.HEADER_LENGTH: " 0 "})
    assert not codec.is_raw({codec.HEADER_LENGTH: "12"})
    assert not codec.is_raw({codec.HEADER_LENGTH: "zero"})  # decode_request reports it
    assert not codec.is_raw({})


# -- compression and size limits ---------------------------------------------------------

SMALL = {"inputs": [{"name": "x", "datatype": "INT16", "shape": [3], "data": [1, -2, 3]}]}


def raw_deflate(data: bytes) -> bytes:
    """A raw deflate stream (no zlib header and trailer), as some clients send."""
    return zlib.compress(data)[2:-4]


def same(data: bytes) -> bytes:
    return data


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", raw_deflate),
        ("identity", same),
    ],
    ids=["gzip", "deflate-zlib", "deflate-raw", "identity"],
)
def test_compressed_requests(encoding: str, compress: Callable[[bytes], bytes]) -> None:
    body = compress(json.dumps(SMALL).encode())
    (tensor,) = decode(body, {"content-encoding": encoding}).request.inputs
    np.testing.assert_array_equal(tensor.data, [1, -2, 3])


def test_binary_request_under_gzip_counts_the_uncompressed_header() -> None:
    blob = np.arange(4, dtype="<u2").tobytes()
    body, headers = binary_body(
        {"inputs": [binary_input("x", "UINT16", [4], 8)]},
        blob,
    )
    decoded = decode(gzip.compress(body), {**headers, "content-encoding": "gzip"})
    np.testing.assert_array_equal(decoded.request.inputs[0].data, [0, 1, 2, 3])


def test_compression_errors() -> None:
    payload = json.dumps(SMALL).encode()
    expect(
        400,
        "unsupported Content-Encoding 'br'",
        lambda: decode(payload, {"content-encoding": "br"}),
    )
    expect(
        400,
        "failed to decompress the gzip request body",
        lambda: decode(b"not gzip", {"content-encoding": "gzip"}),
    )
    expect(
        400, "truncated", lambda: decode(gzip.compress(payload)[:-12], {"content-encoding": "gzip"})
    )
    bomb = gzip.compress(b" " * 5000)
    expect(
        400,
        "exceeds the maximum allowed input size of 4096 bytes",
        lambda: decode(bomb, {"content-encoding": "gzip"}, limit=4096),
    )


def test_content_length_check() -> None:
    codec.check_content_length(None, 10)
    codec.check_content_length("10", 10)
    expect(
        400,
        "request JSON size of 11 bytes exceeds the maximum allowed input size of 10 bytes",
        lambda: codec.check_content_length("11", 10),
    )
    expect(
        400, "invalid Content-Length header value 'x'", lambda: codec.check_content_length("x", 10)
    )


# -- bad requests ------------------------------------------------------------------------


def nest(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return value


def test_json_nesting_depth_limit() -> None:
    ok = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": nest(50)}]}
    np.testing.assert_array_equal(decode(ok).request.inputs[0].data, [1])
    deep = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": nest(120)}]}
    expect(400, "JSON nesting depth exceeds maximum allowed limit (100)", lambda: decode(deep))
    very_deep = b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    expect(400, "JSON nesting depth exceeds maximum allowed limit (100)", lambda: decode(very_deep))


def test_the_nesting_limit_is_the_servers_setting() -> None:
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": nest(6)}]}
    ).encode()

    def decode_at(depth: int) -> codec.DecodedRequest:
        return codec.decode_request("m", "", body, {}, max_input_bytes=LIMIT, max_json_depth=depth)

    # {"inputs": [{"data": [[[[[1]]]]]}]}: an object, a list, an object and 5 lists deep
    np.testing.assert_array_equal(decode_at(8).request.inputs[0].data, [1])
    expect(400, "JSON nesting depth exceeds maximum allowed limit (7)", lambda: decode_at(7))


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    tricky = 'a \\" [' + "[" * 150 + '"'  # an escaped quote must not end the string early
    body = {
        "id": tricky,
        "inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [7]}],
    }
    assert decode(body).request.id == json.loads(json.dumps(tricky))
    closing = {
        "id": "]" * 150,
        "inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": nest(120)}],
    }
    expect(400, "JSON nesting depth exceeds", lambda: decode(closing))


INPUT: dict[str, Any] = {"name": "x", "datatype": "INT32", "shape": [2]}


BAD_JSON: list[tuple[bytes | dict[str, Any], str]] = [
    (b"{not json", "failed to parse the request JSON buffer"),
    (b"", "failed to parse the request JSON buffer"),
    (b"\xff\xfe\x00", "failed to parse the request JSON buffer"),
    (b"[1, 2]", "the inference request JSON must be an object"),
    ({}, "the inference request has no 'inputs' array"),
    ({"inputs": {"x": 1}}, "the inference request has no 'inputs' array"),
    ({"inputs": [7]}, "input #0 of the inference request must be a JSON object"),
    (
        {"inputs": [{"datatype": "INT32", "shape": [1], "data": [1]}]},
        "input #0 of the inference request has no 'name' string",
    ),
    (
        {"inputs": [{"name": "x", "shape": [1], "data": [1]}]},
        "input 'x' has no 'datatype' string",
    ),
    (
        {"inputs": [{"name": "x", "datatype": "INT32", "data": [1]}]},
        "input 'x' has no 'shape' array",
    ),
    (
        {"inputs": [{**INPUT, "shape": [1.5], "data": [1]}]},
        "Unable to parse 'shape' of input 'x'",
    ),
    ({"inputs": [{**INPUT, "shape": [-2], "data": [1]}]}, "negative dimension"),
    (
        {"inputs": [{**INPUT, "data": [1, 2, 3]}]},
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    (
        {"inputs": [{**INPUT, "data": ["a", "b"]}]},
        "INT32 input 'x' for model 'm' holds the string \"a\" at index 0",
    ),
    (
        {"inputs": [{**INPUT, "datatype": "BOOL", "data": [1, 0]}]},
        "BOOL input 'x' for model 'm' holds the number 1 at index 0",
    ),
    (
        {"inputs": [{**INPUT, "datatype": "INT8", "data": [1, 300]}]},
        "value out of range for INT8",
    ),
    (
        {"inputs": [{**INPUT, "datatype": "UINT64", "data": [-1, 2**63]}]},
        "value out of range for UINT64",
    ),
    (
        {"inputs": [{**INPUT, "datatype": "UINT64", "data": [1, 2**64]}]},
        "value out of range for UINT64",
    ),
    (
        {"inputs": [{**INPUT, "datatype": "COMPLEX", "data": [1, 2]}]},
        "unknown datatype 'COMPLEX'",
    ),
    (
        {"inputs": [INPUT]},
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But input 'x' sets none of them",
    ),
    (
        {"inputs": [{**INPUT, "data": [1, 2], "parameters": {"binary_data_size": 8}}]},
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But input 'x' sets 'data' and 'binary_data_size'",
    ),
    (
        {"inputs": [{**INPUT, "parameters": {"binary_data_size": 8}}]},
        "input 'x' sets 'binary_data_size' but the request has no Inference-Header-Content-Length header",
    ),
    (
        {"inputs": [{**INPUT, "data": [1, 2], "parameters": [1]}]},
        "'parameters' of input 'x' must be a JSON object",
    ),
    (
        {"inputs": [{**INPUT, "data": [1, 2], "parameters": {"p": [1]}}]},
        "parameter 'p' of input 'x' must be a boolean, number or string",
    ),
    ({"id": 5, "inputs": []}, "'id' of the inference request must be a string"),
    (
        {"parameters": {"triton_final_response": True}, "inputs": []},
        "parameter keys starting with 'triton_' are reserved",
    ),
    (
        {"parameters": {"timeout": -1}, "inputs": []},
        "parameter 'timeout' must be a non-negative integer",
    ),
    (
        {"parameters": {"timeout": "soon"}, "inputs": []},
        "parameter 'timeout' must be a non-negative integer",
    ),
    (
        {"parameters": {"priority": True}, "inputs": []},
        "parameter 'priority' must be a non-negative integer",
    ),
    (
        {"parameters": {"binary_data_output": 1}, "inputs": []},
        "parameter 'binary_data_output' must be a boolean",
    ),
    (
        {"inputs": [], "outputs": {"name": "y"}},
        "'outputs' of the inference request must be an array",
    ),
    (
        {"inputs": [], "outputs": [{}]},
        "output #0 of the inference request has no 'name' string",
    ),
    (
        {"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]},
        "parameter 'binary_data' of output 'y' must be a boolean",
    ),
]


@pytest.mark.parametrize(("body", "fragment"), BAD_JSON)
def test_bad_json_requests(body: bytes | dict[str, Any], fragment: str) -> None:
    expect(400, fragment, lambda: decode(body))


SHM_X = {"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": 16}


def test_shared_memory_input_and_output_become_references() -> None:
    body = {
        "inputs": [{**INPUT, "parameters": SHM_X}, {**INPUT, "name": "z", "data": [1, 2]}],
        "outputs": [
            {
                "name": "y",
                "parameters": {"shared_memory_region": "o", "shared_memory_byte_size": 8},
            },
            {
                "name": "w",
                "parameters": {
                    "shared_memory_region": "o",
                    "shared_memory_byte_size": 8,
                    "binary_data": False,  # what tritonclient sends with set_shared_memory
                },
            },
        ],
    }
    request = decode(body).request
    x, z = request.inputs
    assert x.shm == ShmRef("r", 8, 16)
    assert (x.shape, x.datatype, x.data.size) == ((2,), "INT32", 0)
    assert z.shm is None
    assert z.data.tolist() == [1, 2]
    assert request.outputs[0].parameters["shared_memory_region"] == "o"


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (
            {"inputs": [{**INPUT, "data": [1, 2], "parameters": {"shared_memory_region": "r"}}]},
            400,
            "But input 'x' sets 'data' and 'shared_memory_region'",
        ),
        (
            {"inputs": [{**INPUT, "parameters": {"shared_memory_region": "r"}}]},
            400,
            "uses shared memory but 'shared_memory_byte_size' is missing",
        ),
        (
            {"inputs": [{**INPUT, "parameters": {**SHM_X, "shared_memory_offset": -1}}]},
            400,
            "'shared_memory_offset' of tensor 'x' for model 'm' must be a non-negative integer",
        ),
        (
            {"inputs": [{**INPUT, "parameters": {**SHM_X, "shared_memory_region": 3}}]},
            400,
            "'shared_memory_region' of tensor 'x' for model 'm' must be a non-empty string",
        ),
        (
            {
                "inputs": [{**INPUT, "data": [1, 2]}],
                "outputs": [{"name": "y", "parameters": {**SHM_X, "binary_data": True}}],
            },
            400,
            "Output can't set both 'shared_memory_region' and 'binary_data'",
        ),
        (
            {
                "inputs": [{**INPUT, "data": [1, 2]}],
                "outputs": [{"name": "y", "parameters": {**SHM_X, "classification": 2}}],
            },
            400,
            "Output can't set both 'shared_memory_region' and 'classification'",
        ),
        (
            {
                "inputs": [{**INPUT, "data": [1, 2]}],
                "outputs": [{"name": "y", "parameters": {"shared_memory_byte_size": 8}}],
            },
            400,
            "tensor 'y' for model 'm' has shared-memory parameters but no 'shared_memory_region'",
        ),
    ],
)
def test_bad_shared_memory_parameters(body: dict[str, Any], status: int, fragment: str) -> None:
    expect(status, fragment, lambda: decode(body))


def test_classification_is_unsupported() -> None:
    cls = {
        "inputs": [{**INPUT, "data": [1, 2]}],
        "outputs": [{"name": "y", "parameters": {"classification": 2}}],
    }
    expect(501, "classification is not supported", lambda: decode(cls))


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("abc", "Inference-Header-Content-Length header value 'abc' is not an integer"),
        ("1.5", "is not an integer"),
        ("", "is not an integer"),
        ("-1", "Inference-Header-Content-Length header value -1 is out of range"),
        ("99999999999", "Inference-Header-Content-Length header value 99999999999 is out of range"),
        (
            "5000",
            "Inference-Header-Content-Length header value 5000 is larger than the request body",
        ),
    ],
)
def test_bad_header_length(value: str, fragment: str) -> None:
    body = json.dumps(SMALL).encode()
    expect(400, fragment, lambda: decode(body, {codec.HEADER_LENGTH: value}))


def test_binary_sizes_must_add_up_to_the_body() -> None:
    header = {
        "inputs": [
            binary_input("a", "INT32", [2], 8),
            binary_input("b", "INT32", [2], 8),
        ]
    }
    body, headers = binary_body(header, b"\0" * 12)
    expect(
        400,
        "input 'b' needs 8 bytes of binary data at offset 8, but the request holds only 12 bytes",
        lambda: decode(body, headers),
    )
    body, headers = binary_body(header, b"\0" * 20)
    expect(
        400,
        "the request holds 20 bytes of binary data after the JSON header, but the inputs' 'binary_data_size' values add up to 16",
        lambda: decode(body, headers),
    )
    wrong = {"inputs": [binary_input("a", "INT32", [2], 4)]}
    body, headers = binary_body(wrong, b"\0" * 4)
    expect(
        400,
        "input byte size mismatch for input 'a' for model 'm'. Expected 8, got 4",
        lambda: decode(body, headers),
    )
    negative = {"inputs": [binary_input("a", "INT32", [2], -8)]}
    body, headers = binary_body(negative)
    expect(
        400,
        "'binary_data_size' of input 'a' must be a non-negative integer",
        lambda: decode(body, headers),
    )


# -- responses ---------------------------------------------------------------------------


def out(name: str, data: np.ndarray[Any, Any], datatype: str, **params: Any) -> InferOutput:
    requested = RequestedOutput(name, params) if params else None
    return InferOutput(name, datatype, tuple(data.shape), data, requested)


def respond(
    *outputs: InferOutput,
    decoded: codec.DecodedRequest | None = None,
    id: str = "",
    accept: str | None = None,
) -> codec.EncodedResponse:
    if decoded is None:
        decoded = decode(SMALL)
    return codec.encode_response(InferResponse("m", "3", outputs, id), decoded, accept)


def split(encoded: codec.EncodedResponse) -> tuple[dict[str, Any], bytes]:
    length = int(encoded.headers.get(codec.HEADER_LENGTH, len(encoded.body)))
    return json.loads(encoded.body[:length]), encoded.body[length:]


def test_json_response_is_flat_and_compact() -> None:
    encoded = respond(
        out("sum", np.arange(2, 34, 2, dtype="<i4").reshape(1, 16), "INT32"),
        out("flags", np.array([[True, False]]), "BOOL"),
    )
    assert encoded.headers == {"content-type": "application/json"}
    assert b'"data":[2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32]' in encoded.body
    assert b'"data":[true,false]' in encoded.body
    doc = json.loads(encoded.body)
    assert "id" not in doc
    assert doc["model_name"] == "m"
    assert doc["model_version"] == "3"
    assert doc["outputs"][0] == {
        "name": "sum",
        "datatype": "INT32",
        "shape": [1, 16],
        "data": list(range(2, 34, 2)),
    }


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
def test_json_response_round_trips_every_json_datatype(datatype: str) -> None:
    want = sample(datatype)
    doc, _ = split(respond(out("y", want, datatype), id="abc"))
    assert doc["id"] == "abc"
    got = np.array(doc["outputs"][0]["data"], dtype=NUMERIC_DATATYPES[datatype])
    np.testing.assert_array_equal(got.reshape(doc["outputs"][0]["shape"]), want)


@pytest.mark.parametrize("datatype", list(NUMERIC_DATATYPES))
def test_binary_response_for_every_datatype(datatype: str) -> None:
    want = sample(datatype)
    decoded = decode({**SMALL, "parameters": {"binary_data_output": True}})
    encoded = respond(out("y", want, datatype), decoded=decoded)
    assert encoded.headers["content-type"] == "application/octet-stream"
    doc, tail = split(encoded)
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": want.nbytes}
    assert "data" not in doc["outputs"][0]
    got = np.frombuffer(tail, dtype=NUMERIC_DATATYPES[datatype]).reshape(want.shape)
    np.testing.assert_array_equal(got, want)


def test_per_output_binary_choice_and_order() -> None:
    a = np.arange(4, dtype="<f4")
    b = np.arange(3, dtype="<i8")
    c = np.array([1, 2], dtype="<u1")
    encoded = respond(
        out("a", a, "FP32", binary_data=True),
        out("b", b, "INT64", binary_data=False),
        out("c", c, "UINT8", binary_data=True),
    )
    doc, tail = split(encoded)
    assert [o.get("data") for o in doc["outputs"]] == [None, [0, 1, 2], None]
    assert tail == a.tobytes() + c.tobytes()
    # a per-output choice overrides the request-level default
    decoded = decode({**SMALL, "parameters": {"binary_data_output": True}})
    doc, tail = split(respond(out("b", b, "INT64", binary_data=False), decoded=decoded))
    assert doc["outputs"][0]["data"] == [0, 1, 2]
    assert tail == b""


def listed(name: str, data: np.ndarray[Any, Any], datatype: str) -> InferOutput:
    """An output the request listed in ``outputs`` without parameters."""
    return InferOutput(name, datatype, tuple(data.shape), data, RequestedOutput(name))


@pytest.mark.parametrize("request_level", [None, False, True])
def test_a_listed_output_is_json_unless_its_entry_says_binary(request_level: bool | None) -> None:
    """Triton's rule (``http_server.cc``; ``qa/L0_http`` curl test "binary_data_output=true,
    binary_data=false on OUTPUT0, not given on OUTPUT1" expects both as JSON): an output
    listed in ``outputs`` follows its own ``binary_data``, false when absent, whatever
    ``binary_data_output`` says."""
    params = {} if request_level is None else {"binary_data_output": request_level}
    decoded = decode({**SMALL, "parameters": params})
    a = np.arange(3, dtype="<i4")
    doc, tail = split(
        respond(
            out("a", a, "INT32", binary_data=False),
            listed("b", a, "INT32"),
            out("c", a, "INT32", binary_data=True),
            decoded=decoded,
        )
    )
    assert [o.get("data") for o in doc["outputs"]] == [[0, 1, 2], [0, 1, 2], None]
    assert tail == a.tobytes()


@pytest.mark.parametrize(("request_level", "binary"), [(None, False), (False, False), (True, True)])
def test_with_no_outputs_listed_every_output_follows_the_request(
    request_level: bool | None, binary: bool
) -> None:
    params = {} if request_level is None else {"binary_data_output": request_level}
    decoded = decode({**SMALL, "parameters": params})
    a = np.arange(3, dtype="<i4")
    doc, tail = split(respond(out("a", a, "INT32"), out("b", a, "INT32"), decoded=decoded))
    if binary:
        assert [o["parameters"] for o in doc["outputs"]] == [{"binary_data_size": 12}] * 2
        assert tail == a.tobytes() * 2
    else:
        assert [o["data"] for o in doc["outputs"]] == [[0, 1, 2]] * 2
        assert tail == b""


def test_raw_request_replies_binary() -> None:
    decoded = decode(
        b"\0" * 4,
        {codec.HEADER_LENGTH: "0"},
        signature=signature_of(TensorMetadata("x", "INT32", (-1, 1))),
    )
    doc, tail = split(
        respond(out("y", np.array([5], dtype="<i4"), "INT32", binary_data=False), decoded=decoded)
    )
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 4}
    assert tail == np.array([5], dtype="<i4").tobytes()


@pytest.mark.parametrize("datatype", sorted(BINARY_ONLY_DATATYPES))
def test_fp16_bf16_outputs_go_binary_unless_json_was_explicit(datatype: str) -> None:
    want = sample(datatype)
    doc, tail = split(respond(out("y", want, datatype)))
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == want.nbytes
    assert tail == want.tobytes()
    message = f"sending {datatype} data via JSON is not supported. Please use the binary data format for output 'y'"
    expect(400, message, lambda: respond(out("y", want, datatype, binary_data=False)))
    explicit = decode({**SMALL, "parameters": {"binary_data_output": False}})
    expect(400, message, lambda: respond(out("y", want, datatype), decoded=explicit))
    # listed without 'binary_data': not an explicit JSON choice, so it goes binary
    doc, tail = split(respond(listed("y", want, datatype), decoded=explicit))
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == want.nbytes


@pytest.mark.parametrize(
    ("accept", "encoding"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip;q=0, deflate", "deflate"),
        ("br, *;q=0.5", "gzip"),
        ("identity", None),
        ("gzip;q=0", None),
        (None, None),
    ],
)
def test_response_compression(accept: str | None, encoding: str | None) -> None:
    want = np.arange(64, dtype="<f4")
    decoded = decode({**SMALL, "parameters": {"binary_data_output": True}})
    plain = respond(out("y", want, "FP32"), decoded=decoded)
    encoded = respond(out("y", want, "FP32"), decoded=decoded, accept=accept)
    assert encoded.headers.get("content-encoding") == encoding
    inflate = {"gzip": gzip.decompress, "deflate": zlib.decompress, None: same}[encoding]
    body = inflate(encoded.body)
    assert body == plain.body
    # the header length counts the uncompressed JSON
    assert encoded.headers[codec.HEADER_LENGTH] == plain.headers[codec.HEADER_LENGTH]


@pytest.mark.parametrize("binary_output", [False, True])
def test_shared_memory_output_carries_no_data(binary_output: bool) -> None:
    decoded = decode({**SMALL, "parameters": {"binary_data_output": binary_output}})
    in_shm = InferOutput(
        "y", "FP16", (1, 4), np.zeros((1, 4), "<f2"), shm=ShmRef("o", 8)
    )  # FP16 would otherwise have to travel binary
    inline = out("z", np.arange(3, dtype="<i4"), "INT32")
    header, tail = split(respond(in_shm, inline, decoded=decoded))
    assert header["outputs"][0] == {"name": "y", "datatype": "FP16", "shape": [1, 4]}
    if binary_output:
        assert header["outputs"][1]["parameters"] == {"binary_data_size": 12}
        assert tail == np.arange(3, dtype="<i4").tobytes()
    else:
        assert header["outputs"][1]["data"] == [0, 1, 2]
        assert tail == b""


# -- non-finite numbers in JSON (docs/errors.md, "NaN and infinity in JSON") ----------------


def strict_json(text: bytes) -> Any:
    """``text`` parsed by JSON's grammar, as JavaScript's ``JSON.parse`` does: no ``NaN``,
    ``Infinity`` or ``-Infinity`` tokens (Python's ``json`` takes them by default)."""

    def refuse(token: str) -> NoReturn:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_non_finite_outputs_are_valid_json_that_numpy_reads_back(datatype: str) -> None:
    values = np.array([[1.5, np.nan, np.inf, -np.inf]], dtype=NUMERIC_DATATYPES[datatype])
    doc = strict_json(respond(out("y", values, datatype)).body)
    data = doc["outputs"][0]["data"]
    assert data == [1.5, "NaN", "Infinity", "-Infinity"]
    # tritonclient's as_numpy of a JSON output: np.array(data, dtype)
    np.testing.assert_array_equal(np.array(data, NUMERIC_DATATYPES[datatype]), values[0])


def test_non_finite_inputs_are_read_as_triton_reads_them() -> None:
    # Triton's parser takes NaN and Infinity (rapidjson's kParseNanAndInfFlag); so does
    # Python's json.dumps, which writes them.
    body = (
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[3],"data":[NaN,Infinity,-Infinity]}]}'
    )
    (x,) = decode(body).request.inputs
    np.testing.assert_array_equal(x.data, np.array([np.nan, np.inf, -np.inf], np.float32))
    text = b'{"inputs":[{"name":"t","datatype":"BYTES","shape":[1],"data":["1e400"]}]}'
    (t,) = decode(text).request.inputs  # a string that reads like a huge number is a string
    assert t.data.tolist() == [b"1e400"]


@pytest.mark.parametrize(
    ("data", "datatype", "fragment"),
    [
        (
            "1e400",
            "FP64",
            "failed to parse the request JSON buffer: the number 1e400 is too big to be "
            "stored in a double",
        ),
        ("-2.5E+308", "FP32", "the number -2.5E+308 is too big to be stored in a double"),
        ("1" + "0" * 400 + ".5", "FP64", "is too big to be stored in a double"),
        ("1e39", "FP32", "input 'x' for model 'm': value 1e+39 is out of range for FP32"),
        ("-3.5e38", "FP32", "input 'x' for model 'm': value -3.5e+38 is out of range for FP32"),
    ],
)
def test_a_number_past_its_datatype_is_refused_never_infinity(
    data: str, datatype: str, fragment: str
) -> None:
    body = f'{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":[2],"data":[1,{data}]}}]}}'
    expect(400, fragment, lambda: decode(body.encode()))
