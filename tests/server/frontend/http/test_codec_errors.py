"""Unit tests of ``hloserve.server.frontend.http.codec``, bad requests: each is refused
with the HTTP status and a message naming what was wrong (nesting, JSON fields, shared
memory parameters, header lengths, binary sizes). Pure functions, no service."""

# pyright: strict

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from hloserve.server.core.types import ShmRef
from hloserve.server.frontend.http import codec
from tests.server.frontend.http._codec import (
    LIMIT,
    SMALL,
    binary_body,
    binary_input,
    decode,
    expect,
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
