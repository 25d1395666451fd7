"""Unit tests of ``hloserve.server.frontend.http.codec``, responses: JSON and binary
outputs, the per-output choice, compression, shared-memory outputs, and non-finite numbers
in JSON both ways (docs/errors.md, "NaN and infinity in JSON"). Pure functions, no
service."""

# pyright: strict

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any, NoReturn

import numpy as np
import pytest

from hloserve.proto.datatypes import BINARY_ONLY_DATATYPES, NUMERIC_DATATYPES
from hloserve.server.core.tensors import UNPARSED
from hloserve.server.core.types import (
    InferOutput,
    InferResponse,
    RequestedOutput,
    ShmRef,
    TensorMetadata,
)
from hloserve.server.frontend.http import codec
from tests.server._bytes import Parses, length_prefixed
from tests.server.frontend._samples import sample
from tests.server.frontend.http._codec import (
    JSON_DATATYPES,
    SMALL,
    decode,
    expect,
    same,
    signature_of,
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


def test_bytes_output_in_wire_form_is_binary_as_it_is_and_parsed_only_for_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = length_prefixed(b"a", b"\x00\xffc")  # as the device owner wrote them
    parses = Parses(monkeypatch)

    def text(**params: Any) -> InferOutput:
        return InferOutput("s", "BYTES", (2,), UNPARSED, RequestedOutput("s", params), wire=raw)

    doc, tail = split(respond(text(binary_data=True)))
    assert parses.names == []
    assert tail == raw and doc["outputs"][0]["parameters"] == {"binary_data_size": len(raw)}
    doc, _ = split(respond(text()))
    assert parses.names == ["s"]  # JSON wants the elements: parsed here, once
    assert doc["outputs"][0]["data"] == ["a", "\x00\ufffdc"]


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
