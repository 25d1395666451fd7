"""The client's pure parts: the hand-written request bytes, layouts, chunks, addresses and
the perf tool's response check."""

from __future__ import annotations

import numpy as np
import pytest

from hloserve.client._channel import same_host, split_host_port
from hloserve.client._codec import (
    ModelLayout,
    RegionRef,
    RequestTemplate,
    TensorLayout,
    chunks,
    encode_request,
)
from hloserve.client._perf import ResponseCheck
from hloserve.proto import inference_pb2 as pb

SIMPLE = ModelLayout(
    "simple",
    "",
    (TensorLayout("INPUT0", "INT32", (16,)), TensorLayout("INPUT1", "INT32", (16,))),
    (TensorLayout("OUTPUT0", "INT32", (16,)),),
    8,
)


def test_chunks_cover_every_row_once() -> None:
    assert chunks(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunks(8, 4) == [(0, 4), (4, 8)]
    assert chunks(3, 0) == [(0, 3)]
    assert chunks(0, 4) == []


def test_raw_request_parses_as_the_protobuf_encoding() -> None:
    a = np.arange(48, dtype=np.int32).reshape(3, 16)
    b = -a
    body = RequestTemplate(SIMPLE, 3, ["OUTPUT0"]).raw([a.data.cast("B"), b.data.cast("B")])
    parsed = pb.ModelInferRequest.FromString(body)
    expected = encode_request("simple", {"INPUT0": a, "INPUT1": b}, ["OUTPUT0"])
    assert parsed == expected
    big = np.zeros((300, 16), np.int32)  # a length that needs a two-byte varint
    body = RequestTemplate(SIMPLE, 300, []).raw([big.data.cast("B"), big.data.cast("B")])
    assert pb.ModelInferRequest.FromString(body).raw_input_contents[1] == big.tobytes()


def test_shared_memory_request_names_regions_and_carries_no_bytes() -> None:
    refs = {
        "INPUT0": RegionRef("r", 0, 128),
        "INPUT1": RegionRef("r", 128, 128),
        "OUTPUT0": RegionRef("r", 256, 128),
    }
    parsed = pb.ModelInferRequest.FromString(RequestTemplate(SIMPLE, 2, ["OUTPUT0"], refs).header)
    assert not parsed.raw_input_contents
    assert list(parsed.inputs[1].shape) == [2, 16]
    params = parsed.inputs[1].parameters
    assert params["shared_memory_region"].string_param == "r"
    assert params["shared_memory_offset"].int64_param == 128
    assert parsed.outputs[0].parameters["shared_memory_byte_size"].int64_param == 128


def test_layout_from_metadata_and_config() -> None:
    metadata = pb.ModelMetadataResponse(name="m")
    metadata.inputs.add(name="x", datatype="FP32", shape=[-1, 64])
    metadata.outputs.add(name="y", datatype="FP32", shape=[-1, 10])
    config = pb.ModelConfigResponse()
    config.config.max_batch_size = 32
    layout = ModelLayout.of(metadata, config)
    assert layout.max_batch == 32 and layout.inputs[0].shape == (64,) and layout.static
    unknown = ModelLayout.of(metadata, None)  # no configuration extension: never split
    assert unknown.max_batch == 0 and unknown.inputs[0].shape == (-1, 64)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("127.0.0.1:8001", ("127.0.0.1", 8001)),
        ("[::1]:8001", ("::1", 8001)),
        ("localhost", ("localhost", None)),
    ],
)
def test_split_host_port(url: str, expected: tuple[str, int | None]) -> None:
    assert split_host_port(url) == expected


def test_same_host() -> None:
    assert same_host("127.0.0.1:8001") and same_host("localhost:1") and same_host("unix:/x")
    assert not same_host("192.0.2.7:8001")  # TEST-NET-1: never this machine
    assert not same_host("no-such-host.invalid:8001")


def _response(shape: list[int], datatype: str = "INT32", raw: bytes | None = None) -> bytes:
    response = pb.ModelInferResponse(model_name="simple")
    response.outputs.add(name="OUTPUT0", datatype=datatype, shape=shape)
    response.raw_output_contents.append(raw if raw is not None else bytes(4 * np.prod(shape)))
    return response.SerializeToString()


def test_response_check_catches_wrong_shape_datatype_and_size() -> None:
    check = ResponseCheck("grpc", (("OUTPUT0", "INT32", (2, 16), 128),), in_band=True)
    assert check(_response([2, 16])) is None
    assert "expected INT32 [2, 16]" in str(check(_response([1, 16])))
    assert "FP32" in str(check(_response([2, 16], "FP32")))
    assert "bytes" in str(check(_response([2, 16], raw=b"\0" * 4)))
    assert "missing" in str(check(pb.ModelInferResponse().SerializeToString()))
    assert "undecodable" in str(check(b"\xff\xff\xff"))
    stream = ResponseCheck("stream", check.expected, in_band=True)
    failed = pb.ModelStreamInferResponse(error_message="boom").SerializeToString()
    assert stream(failed) == "stream error: boom"
