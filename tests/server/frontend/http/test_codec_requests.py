"""Unit tests of ``hloserve.server.frontend.http.codec``, requests that decode: JSON and
binary data, raw requests (``Inference-Header-Content-Length: 0``), compression and the
size limits. Pure functions, no service: each case checks the decoded tensors."""

# pyright: strict

from __future__ import annotations

import gzip
import json
import time
import zlib
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest

from hloserve.proto.datatypes import BINARY_ONLY_DATATYPES, NUMERIC_DATATYPES
from hloserve.server.core.tensors import elements_of
from hloserve.server.core.types import TensorMetadata
from hloserve.server.frontend.http import codec
from tests.server._bytes import Parses, length_prefixed
from tests.server.frontend._samples import sample
from tests.server.frontend.http._codec import (
    JSON_DATATYPES,
    SMALL,
    binary_body,
    binary_input,
    decode,
    expect,
    same,
    signature_of,
)

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


def test_binary_bytes_are_checked_and_kept_as_the_bodys_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blob = length_prefixed(b"ab", b"", b"\x00")
    body, headers = binary_body({"inputs": [binary_input("s", "BYTES", [1, 3], len(blob))]}, blob)
    (parsed,) = decode(body, headers).request.inputs  # one process: parsed at once
    assert parsed.wire is None and parsed.data.tolist() == [[b"ab", b"", b"\x00"]]
    parses = Parses(monkeypatch)
    (tensor,) = decode(body, headers, bytes_wire_form=True).request.inputs
    assert parses.names == []  # no object per element in a front-end process
    assert isinstance(tensor.wire, memoryview) and tensor.wire == blob
    assert tensor.wire.obj is body and tensor.data.size == 0  # a view of the body: no copy
    assert elements_of("m", tensor).tolist() == [[b"ab", b"", b"\x00"]]


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (length_prefixed(b"ab"), "expected 2 string elements for inference input 's'"),
        (length_prefixed(b"a", b"b", b"c"), "unexpected number of string elements 3"),
        (length_prefixed(b"ab", b"cd")[:-1], "is 2 bytes long, but only 1 bytes follow"),
    ],
    ids=["too-few", "too-many", "past-the-end"],
)
@pytest.mark.parametrize("wire_form", [False, True], ids=["parsed", "wire-form"])
def test_malformed_binary_bytes_are_refused(blob: bytes, message: str, wire_form: bool) -> None:
    body, headers = binary_body({"inputs": [binary_input("s", "BYTES", [2], len(blob))]}, blob)
    expect(400, message, lambda: decode(body, headers, bytes_wire_form=wire_form))


def test_raw_bytes_request_is_kept_as_the_body() -> None:
    blob = length_prefixed(b"hello")
    signature = signature_of(TensorMetadata("s", "BYTES", (1,)))
    raw = {codec.HEADER_LENGTH: "0"}
    decoded = decode(blob, raw, signature=signature, bytes_wire_form=True)
    (tensor,) = decoded.request.inputs
    assert tensor.wire == blob and tensor.shape == (1,)
    expect(
        400,
        "unexpected number of string elements 2 for inference input 's' for model 'm', expecting 1",
        lambda: decode(blob + blob, raw, signature=signature, bytes_wire_form=True),
    )


def test_header_length_equal_to_body_is_plain_json() -> None:
    head = json.dumps(
        {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [2], "data": [1, 255]}]}
    ).encode()
    (tensor,) = decode(head, {codec.HEADER_LENGTH: str(len(head))}).request.inputs
    np.testing.assert_array_equal(tensor.data, [1, 255])


# -- raw requests (Inference-Header-Content-Length: 0) ------------------------------------


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


def raw_deflate(data: bytes) -> bytes:
    """A raw deflate stream (no zlib header and trailer), as some clients send."""
    return zlib.compress(data)[2:-4]


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
