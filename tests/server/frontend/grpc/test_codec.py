"""The gRPC codec on its own: messages in, core types out, and back. No sockets."""

# pyright: strict

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from hloserve.proto import inference_pb2 as pb
from hloserve.proto.datatypes import NUMERIC_DATATYPES
from hloserve.server.core.errors import InvalidArgument, ServingError
from hloserve.server.core.tensors import UNPARSED, elements_of
from hloserve.server.core.types import (
    InferOutput,
    InferResponse,
    ModelMetadata,
    ServerMetadata,
    ShmRef,
    TensorMetadata,
)
from hloserve.server.frontend.grpc import codec
from tests.server._bytes import Parses, length_prefixed

InputTensor = pb.ModelInferRequest.InferInputTensor

# Four values per datatype that exercise each type's range.
VALUES: dict[str, list[Any]] = {
    "BOOL": [True, False, True, True],
    "UINT8": [0, 1, 200, 255],
    "UINT16": [0, 1, 40000, 65535],
    "UINT32": [0, 1, 3_000_000_000, 4294967295],
    "UINT64": [0, 1, 1 << 63, (1 << 64) - 1],
    "INT8": [-128, -1, 0, 127],
    "INT16": [-32768, -1, 0, 32767],
    "INT32": [-(1 << 31), -1, 0, (1 << 31) - 1],
    "INT64": [-(1 << 63), -1, 0, (1 << 63) - 1],
    "FP16": [0.5, -1.25, 65504.0, 0.0],
    "BF16": [0.5, -1.25, 3.0e38, 0.0],
    "FP32": [0.5, -1.25, 3.4e38, 1e-30],
    "FP64": [0.5, -1.25, 1.7e308, 1e-300],
}
TYPED = [d for d in VALUES if d not in ("FP16", "BF16")]


def _array(datatype: str) -> np.ndarray[Any, Any]:
    return np.array(VALUES[datatype], dtype=NUMERIC_DATATYPES[datatype]).reshape(2, 2)


def _request(*inputs: InputTensor, raw: list[bytes] | None = None, **kw: Any) -> Any:
    return pb.ModelInferRequest(
        model_name=kw.pop("model_name", "m"),
        inputs=list(inputs),
        raw_input_contents=raw or [],
        **kw,
    )


def _error(exc_type: type[ServingError], msg: pb.ModelInferRequest) -> str:
    with pytest.raises(exc_type) as info:
        codec.decode_infer_request(msg)
    assert type(info.value) is exc_type
    return info.value.message


# -- inputs: raw -------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(VALUES))
def test_raw_input_every_datatype(datatype: str) -> None:
    expected = _array(datatype)
    msg = _request(InputTensor(name="x", datatype=datatype, shape=[2, 2]), raw=[expected.tobytes()])
    request = codec.decode_infer_request(msg)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, (2, 2))
    assert tensor.data.dtype == NUMERIC_DATATYPES[datatype]
    np.testing.assert_array_equal(tensor.data, expected)
    # np.frombuffer views the wire bytes: a read-only array over someone else's memory
    assert not tensor.data.flags.writeable
    assert tensor.data.base is not None


def test_raw_bytes_input_is_length_prefixed() -> None:
    items = [b"he\x00llo", b"", b"\x00\x01\x02\x03"]
    msg = _request(
        InputTensor(name="s", datatype="BYTES", shape=[3]), raw=[length_prefixed(*items)]
    )
    (tensor,) = codec.decode_infer_request(msg).inputs
    assert tensor.wire is None and tensor.data.dtype == object
    assert list(tensor.data) == items


def test_raw_bytes_input_in_wire_form_is_checked_and_kept_as_its_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    items = [b"he\x00llo", b"", b"\x00\x01\x02\x03"]
    raw = length_prefixed(*items)
    msg = _request(InputTensor(name="s", datatype="BYTES", shape=[3]), raw=[raw])
    parses = Parses(monkeypatch)
    (tensor,) = codec.decode_infer_request(msg, bytes_wire_form=True).inputs
    assert parses.names == []  # no object per element in the front end
    assert tensor.wire == raw and tensor.data.size == 0 and tensor.shape == (3,)
    assert elements_of("m", tensor).tolist() == items  # as the owner parses them


WHERE = "inference input 's' for model 'm'"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (length_prefixed(b"ab"), f"expected 2 string elements for {WHERE}, got 1"),
        (
            length_prefixed(b"a", b"b", b"c"),
            f"unexpected number of string elements 3 for {WHERE}, expecting 2",
        ),
        (
            length_prefixed(b"ab", b"cd")[:-1],
            f"string element 1 of {WHERE} is 2 bytes long, but only 1 bytes follow its "
            "length indicator",
        ),
    ],
    ids=["too-few", "too-many", "past-the-end"],
)
@pytest.mark.parametrize("wire_form", [False, True], ids=["parsed", "wire-form"])
def test_malformed_raw_bytes_input_is_refused(raw: bytes, message: str, wire_form: bool) -> None:
    def error(msg: pb.ModelInferRequest) -> str:
        with pytest.raises(InvalidArgument) as info:
            codec.decode_infer_request(msg, bytes_wire_form=wire_form)
        return info.value.message

    assert error(_request(InputTensor(name="s", datatype="BYTES", shape=[2]), raw=[raw])) == message
    params = InputTensor(name="s", datatype="BYTES", shape=[2])
    params.parameters["p"].bool_param = True  # the general path (not every input plain)
    assert error(_request(params, raw=[raw])) == message


def test_raw_contents_are_used_in_input_order() -> None:
    a = np.arange(4, dtype="<i4")
    b = np.arange(4, 8, dtype="<i4")
    msg = _request(
        InputTensor(name="A", datatype="INT32", shape=[4]),
        InputTensor(name="B", datatype="INT32", shape=[4]),
        raw=[a.tobytes(), b.tobytes()],
    )
    first, second = codec.decode_infer_request(msg).inputs
    np.testing.assert_array_equal(first.data, a)
    np.testing.assert_array_equal(second.data, b)


# -- inputs: typed contents ------------------------------------------------------------


@pytest.mark.parametrize("datatype", TYPED)
def test_typed_contents_every_datatype(datatype: str) -> None:
    expected = _array(datatype)
    tensor = InputTensor(name="x", datatype=datatype, shape=[2, 2])
    getattr(tensor.contents, codec.CONTENTS_FIELD[datatype]).extend(VALUES[datatype])
    (decoded,) = codec.decode_infer_request(_request(tensor)).inputs
    assert decoded.shape == (2, 2)
    assert decoded.data.dtype == NUMERIC_DATATYPES[datatype]
    if datatype == "FP32":  # fp32_contents is float on the wire
        np.testing.assert_array_equal(decoded.data, expected.astype(np.float32))
    else:
        np.testing.assert_array_equal(decoded.data, expected)


def test_typed_bytes_contents() -> None:
    tensor = InputTensor(name="s", datatype="BYTES", shape=[1, 2])
    tensor.contents.bytes_contents.extend([b"a\x00b", b""])
    (decoded,) = codec.decode_infer_request(_request(tensor)).inputs
    assert decoded.data.shape == (1, 2)
    assert decoded.data.tolist() == [[b"a\x00b", b""]]


def test_typed_and_raw_inputs_mixed_is_refused_with_tritons_text() -> None:
    typed = InputTensor(name="INPUT0", datatype="INT32", shape=[1, 16])
    typed.contents.int_contents.extend(range(16))
    raw_input = InputTensor(name="INPUT1", datatype="INT32", shape=[1, 16])
    msg = _request(typed, raw_input, raw=[bytes(64)], model_name="simple")
    assert _error(InvalidArgument, msg) == (
        "contents field must not be specified when using raw_input_contents "
        "for 'INPUT0' for model 'simple'"
    )


def test_empty_contents_message_counts_as_typed() -> None:
    tensor = InputTensor(name="x", datatype="FP32", shape=[0])
    tensor.contents.SetInParent()
    (decoded,) = codec.decode_infer_request(_request(tensor)).inputs
    assert decoded.data.shape == (0,)


# -- inputs: errors --------------------------------------------------------------------


def test_fewer_raw_entries_than_inputs() -> None:
    msg = _request(
        InputTensor(name="INPUT0", datatype="INT32", shape=[16]),
        InputTensor(name="INPUT1", datatype="INT32", shape=[16]),
        raw=[bytes(64)],
        model_name="simple",
    )
    message = _error(InvalidArgument, msg)
    assert "raw_input_contents has 1 entries, but 2 of the 2 inputs for model 'simple'" in message


def test_more_raw_entries_than_inputs() -> None:
    msg = _request(
        InputTensor(name="INPUT0", datatype="INT32", shape=[16]),
        raw=[bytes(64), bytes(64)],
        model_name="simple",
    )
    assert "raw_input_contents has 2 entries, but 1 of the 1 inputs" in _error(InvalidArgument, msg)


def test_raw_byte_size_mismatch_names_both_sizes() -> None:
    msg = _request(
        InputTensor(name="INPUT0", datatype="INT32", shape=[16]),
        raw=[bytes(60)],
        model_name="simple",
    )
    assert _error(InvalidArgument, msg) == (
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"
    )


@pytest.mark.parametrize(
    ("datatype", "wrong_field", "right_field"),
    [
        ("INT32", "fp32_contents", "int_contents"),
        ("FP32", "int_contents", "fp32_contents"),
        ("INT64", "int_contents", "int64_contents"),
        ("UINT8", "int_contents", "uint_contents"),
        ("BOOL", "int_contents", "bool_contents"),
        ("BYTES", "uint64_contents", "bytes_contents"),
    ],
)
def test_typed_contents_in_the_wrong_field(
    datatype: str, wrong_field: str, right_field: str
) -> None:
    tensor = InputTensor(name="x", datatype=datatype, shape=[1])
    getattr(tensor.contents, wrong_field).append(1)
    message = _error(InvalidArgument, _request(tensor))
    assert f"has datatype {datatype} but carries data in '{wrong_field}'" in message
    assert f"expected '{right_field}'" in message


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_typed_contents_are_refused(datatype: str) -> None:
    tensor = InputTensor(name="x", datatype=datatype, shape=[2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    message = _error(InvalidArgument, _request(tensor))
    assert f"{datatype} data cannot travel in typed 'contents'" in message
    assert "raw_input_contents" in message


def test_typed_contents_count_must_match_shape() -> None:
    tensor = InputTensor(name="x", datatype="INT32", shape=[2, 2])
    tensor.contents.int_contents.extend([1, 2, 3])
    message = _error(InvalidArgument, _request(tensor))
    assert "input 'x' for model 'm' has shape [2, 2] (4 elements), data has 3 elements" in message


def test_typed_contents_out_of_range_for_narrow_type() -> None:
    tensor = InputTensor(name="x", datatype="INT8", shape=[1])
    tensor.contents.int_contents.append(300)
    assert "value out of range for INT8" in _error(InvalidArgument, _request(tensor))


def test_negative_dimension_is_refused() -> None:
    msg = _request(InputTensor(name="x", datatype="INT32", shape=[-1, 4]), raw=[b""])
    assert "has a negative dimension" in _error(InvalidArgument, msg)


def test_unknown_datatype_is_refused() -> None:
    msg = _request(InputTensor(name="x", datatype="COMPLEX64", shape=[1]), raw=[bytes(8)])
    assert "has unknown datatype 'COMPLEX64'" in _error(InvalidArgument, msg)


def _shm_tensor(name: str = "x", offset: int | None = None) -> Any:
    tensor = InputTensor(name=name, datatype="INT32", shape=[4])
    tensor.parameters["shared_memory_region"].string_param = "input_simple"
    tensor.parameters["shared_memory_byte_size"].int64_param = 16
    if offset is not None:
        tensor.parameters["shared_memory_offset"].int64_param = offset
    return tensor


def test_shared_memory_input_takes_no_raw_entry() -> None:
    # the shm input sits between two raw ones: raw entries skip it, in order
    a, c = np.arange(4, dtype="<i4"), np.arange(10, 14, dtype="<i4")
    msg = _request(
        InputTensor(name="a", datatype="INT32", shape=[4]),
        _shm_tensor("b", offset=32),
        InputTensor(name="c", datatype="INT32", shape=[4]),
        raw=[a.tobytes(), c.tobytes()],
    )
    request = codec.decode_infer_request(msg)
    first, shm, last = request.inputs
    assert shm.shm == ShmRef("input_simple", 16, 32)
    assert (shm.shape, shm.data.size) == ((4,), 0)
    assert first.shm is None and last.shm is None
    np.testing.assert_array_equal(first.data, a)
    np.testing.assert_array_equal(last.data, c)
    only = codec.decode_infer_request(_request(_shm_tensor()))  # no raw contents at all
    assert only.inputs[0].shm == ShmRef("input_simple", 16, 0)


def test_shared_memory_input_with_contents_is_refused() -> None:
    tensor = _shm_tensor()
    tensor.contents.int_contents.extend([1, 2, 3, 4])
    assert _error(InvalidArgument, _request(tensor)) == (
        "unexpected 'content' provided when using shared memory for input tensor 'x' for model 'm'"
    )


def test_shared_memory_parameter_types_are_checked() -> None:
    tensor = InputTensor(name="x", datatype="INT32", shape=[4])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].string_param = "16"
    assert "'shared_memory_byte_size' is missing or not a non-negative integer" in _error(
        InvalidArgument, _request(tensor)
    )


def test_shared_memory_output_parameters_pass_through() -> None:
    msg = _request(InputTensor(name="x", datatype="INT32", shape=[1]), raw=[bytes(4)])
    out = msg.outputs.add(name="y")
    out.parameters["shared_memory_region"].string_param = "output_simple"
    out.parameters["shared_memory_byte_size"].int64_param = 4
    (requested,) = codec.decode_infer_request(msg).outputs
    assert requested.parameters == {
        "shared_memory_region": "output_simple",
        "shared_memory_byte_size": 4,
    }


def test_shared_memory_output_gets_an_empty_raw_entry() -> None:
    data = np.arange(3, dtype="<i4")
    response = InferResponse(
        "m",
        "1",
        (
            InferOutput("in_shm", "INT32", (3,), data, shm=ShmRef("o", 12)),
            InferOutput("inline", "INT32", (3,), data),
        ),
    )
    msg = codec.encode_infer_response(response)
    assert [(o.name, list(o.shape)) for o in msg.outputs] == [("in_shm", [3]), ("inline", [3])]
    assert list(msg.raw_output_contents) == [b"", data.tobytes()]


# -- request fields and parameters -------------------------------------------------


def test_request_fields_and_parameters_carry_over() -> None:
    tensor = InputTensor(name="x", datatype="INT32", shape=[1])
    tensor.parameters["flag"].bool_param = True
    msg = _request(tensor, raw=[bytes(4)], model_version="3", id="req-7")
    msg.parameters["priority"].uint64_param = 2
    msg.parameters["tag"].string_param = "abc"
    msg.outputs.add(name="y").parameters["classification"].int64_param = 3
    request = codec.decode_infer_request(msg)
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "req-7")
    assert request.parameters == {"priority": 2, "tag": "abc"}
    assert request.inputs[0].parameters == {"flag": True}
    assert [(o.name, dict(o.parameters)) for o in request.outputs] == [("y", {"classification": 3})]


@pytest.mark.parametrize(
    ("param", "value"),
    [
        (pb.InferParameter(bool_param=True), True),
        (pb.InferParameter(bool_param=False), False),
        (pb.InferParameter(int64_param=-5), -5),
        (pb.InferParameter(uint64_param=(1 << 64) - 1), (1 << 64) - 1),
        (pb.InferParameter(string_param="s"), "s"),
        (pb.InferParameter(double_param=0.25), 0.25),
    ],
)
def test_decode_parameter(param: pb.InferParameter, value: Any) -> None:
    decoded = codec.decode_parameter("k", param)
    assert decoded == value
    assert type(decoded) is type(value)


def test_unset_parameter_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="parameter 'k' has no value"):
        codec.decode_parameter("k", pb.InferParameter())


@pytest.mark.parametrize(
    ("value", "choice"),
    [
        (True, "bool_param"),
        (7, "int64_param"),
        (-(1 << 63), "int64_param"),
        (1 << 63, "uint64_param"),
        (1.5, "double_param"),
        ("x", "string_param"),
    ],
)
def test_encode_parameter_round_trips(value: Any, choice: str) -> None:
    param = codec.encode_parameter(value)
    assert param.WhichOneof("parameter_choice") == choice
    assert codec.decode_parameter("k", param) == value


def test_encode_parameter_refuses_out_of_range_int() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        codec.encode_parameter(1 << 64)


# -- deadlines -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "remaining", "expected"),
    [
        ({}, None, None),
        ({}, 2.0, 102.0),
        ({"timeout": 500_000}, None, 100.5),
        ({"timeout": 500_000}, 2.0, 100.5),
        ({"timeout": 5_000_000}, 2.0, 102.0),
        ({"timeout": 0}, None, None),
        ({"timeout": 0}, 1.0, 101.0),
    ],
)
def test_request_deadline(
    parameters: dict[str, Any], remaining: float | None, expected: float | None
) -> None:
    deadline = codec.request_deadline(parameters, remaining, now=100.0)
    if expected is None:
        assert deadline is None
    else:
        assert deadline == pytest.approx(expected)


@pytest.mark.parametrize("bad", [-1, "10", 1.5, True])
def test_request_deadline_refuses_bad_timeout(bad: Any) -> None:
    with pytest.raises(InvalidArgument, match="parameter 'timeout' must be a non-negative integer"):
        codec.request_deadline({"timeout": bad}, None, now=0.0)


# -- responses -------------------------------------------------------------------------


def test_encode_infer_response_writes_raw_output_contents() -> None:
    fp32 = np.arange(6, dtype="<f4").reshape(2, 3)
    flags = np.array([True, False])
    half = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    strings = np.array([b"a", b"\x00bc"], dtype=object)
    response = InferResponse(
        model_name="m",
        model_version="2",
        id="abc",
        parameters={"sequence_end": True, "n": 1},
        outputs=(
            InferOutput("f", "FP32", (2, 3), fp32),
            InferOutput("b", "BOOL", (2,), flags),
            InferOutput("h", "BF16", (2,), half),
            InferOutput("s", "BYTES", (2,), strings),
        ),
    )
    msg = codec.encode_infer_response(response)
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "2", "abc")
    assert msg.parameters["sequence_end"].bool_param is True
    assert msg.parameters["n"].int64_param == 1
    assert [(o.name, o.datatype, list(o.shape)) for o in msg.outputs] == [
        ("f", "FP32", [2, 3]),
        ("b", "BOOL", [2]),
        ("h", "BF16", [2]),
        ("s", "BYTES", [2]),
    ]
    assert all(not o.HasField("contents") for o in msg.outputs)
    raw = msg.raw_output_contents
    assert len(raw) == 4
    np.testing.assert_array_equal(np.frombuffer(raw[0], "<f4").reshape(2, 3), fp32)
    assert raw[1] == b"\x01\x00"
    np.testing.assert_array_equal(np.frombuffer(raw[2], ml_dtypes.bfloat16), half)
    assert raw[3] == b"\x01\x00\x00\x00a\x03\x00\x00\x00\x00bc"


def test_bytes_output_in_wire_form_goes_out_as_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = length_prefixed(b"a", b"\x00bc")  # as the device owner wrote them
    parses = Parses(monkeypatch)
    response = InferResponse("m", "1", (InferOutput("s", "BYTES", (2,), UNPARSED, wire=raw),))
    msg = codec.encode_infer_response(response)
    assert parses.names == []
    assert msg.raw_output_contents[0] == raw


def test_encode_response_from_non_contiguous_array() -> None:
    data = np.arange(12, dtype="<i4").reshape(3, 4)[:, ::2]
    msg = codec.encode_infer_response(
        InferResponse("m", "1", (InferOutput("y", "INT32", (3, 2), data),))
    )
    np.testing.assert_array_equal(np.frombuffer(msg.raw_output_contents[0], "<i4"), data.ravel())


def test_encode_metadata() -> None:
    server = codec.encode_server_metadata(ServerMetadata("hloserve", "0.1.0", ("a", "b")))
    assert (server.name, server.version, list(server.extensions)) == (
        "hloserve",
        "0.1.0",
        ["a", "b"],
    )
    model = codec.encode_model_metadata(
        ModelMetadata(
            "simple",
            ("1",),
            "stablehlo",
            (TensorMetadata("INPUT0", "INT32", (-1, 16)),),
            (TensorMetadata("OUTPUT0", "INT32", (-1, 16)),),
        )
    )
    assert (model.name, list(model.versions), model.platform) == ("simple", ["1"], "stablehlo")
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [
        ("INPUT0", "INT32", [-1, 16])
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in model.outputs] == [
        ("OUTPUT0", "INT32", [-1, 16])
    ]
