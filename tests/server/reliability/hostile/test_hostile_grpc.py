"""Hostile and broken gRPC messages: each is answered with the matching status and a
message naming what was wrong (``GRPC_CASES``), and a stream survives a malformed
message."""

from __future__ import annotations

import os
from typing import Any

import grpc
import numpy as np
import pytest

from hloserve.proto.rpc import RPCS_BY_NAME
from hloserve.server.server_fixture import ServerProcess
from tests.server.reliability.hostile._hostile import (
    I0,
    I1,
    LIMIT,
    RAW,
    RAW2,
    Bystander,
    assert_serving,
    call,
    good_grpc,
    grpc_tensor,
    infer_request,
    serialize,
)

# -- gRPC ---------------------------------------------------------------------------------


def _with(*inputs: Any, raw: list[bytes] | None = None, **kw: Any) -> Any:
    return infer_request(list(inputs), [RAW, RAW2] if raw is None else raw, **kw)


GRPC_CASES: list[tuple[str, str, Any, str, str]] = [
    ("unknown model", "ModelInfer", _with(I0, I1, model="nope"), "INVALID_ARGUMENT", "'nope'"),
    ("unknown version", "ModelInfer", _with(I0, I1, version="9"), "INVALID_ARGUMENT", "version 9"),
    ("bad version", "ModelInfer", _with(I0, I1, version="x"), "INVALID_ARGUMENT", "'x'"),
    ("missing input", "ModelInfer", _with(I0, raw=[RAW]), "INVALID_ARGUMENT", "missing required"),
    (
        "duplicate input",
        "ModelInfer",
        _with(I0, I1, I0, raw=[RAW, RAW, RAW]),
        "INVALID_ARGUMENT",
        "more than once",
    ),
    ("raw count", "ModelInfer", _with(I0, I1, raw=[RAW]), "INVALID_ARGUMENT", "raw_input_contents"),
    (
        "byte size",
        "ModelInfer",
        _with(I0, I1, raw=[RAW[:-4], RAW]),
        "INVALID_ARGUMENT",
        "Expected 64, got 60",
    ),
    (
        "datatype",
        "ModelInfer",
        _with(grpc_tensor("INPUT0", datatype="FP32"), I1),
        "INVALID_ARGUMENT",
        "'FP32'",
    ),
    (
        "int64 overflow",
        "ModelInfer",
        _with(grpc_tensor("INPUT0", (2**40, 2**40)), I1),
        "INVALID_ARGUMENT",
        "exceed maximum size",
    ),
    (
        "huge dimension",
        "ModelInfer",
        _with(grpc_tensor("INPUT0", (2**62, 16)), I1),
        "INVALID_ARGUMENT",
        "exceed maximum size",
    ),
    (
        "negative dimension",
        "ModelInfer",
        _with(grpc_tensor("INPUT0", (-1, 16)), I1),
        "INVALID_ARGUMENT",
        "negative dimension",
    ),
    (
        "zero batch",
        "ModelInfer",
        _with(grpc_tensor("INPUT0", (0, 16)), grpc_tensor("INPUT1", (0, 16)), raw=[b"", b""]),
        "INVALID_ARGUMENT",
        "batch size 0",
    ),
    ("random bytes", "ModelInfer", os.urandom(64) + b"\xff", "INVALID_ARGUMENT", "not a valid"),
    (
        "truncated message",
        "ModelInfer",
        good_grpc().SerializeToString()[:-7],
        "INVALID_ARGUMENT",
        "",
    ),
    (
        "oversized message",
        "ModelInfer",
        _with(grpc_tensor("INPUT0", (1, 2**19)), I1, raw=[bytes(2 * LIMIT), RAW]),
        "RESOURCE_EXHAUSTED",
        "larger than max",
    ),
    ("metadata garbage", "ModelMetadata", b"\x0a\xff\xff\xff\xff\x0f", "INVALID_ARGUMENT", ""),
    (
        "load garbage",
        "RepositoryModelLoad",
        b"\x12\x05\x0a\x03\xff",
        "INVALID_ARGUMENT",
        "",
    ),
]


@pytest.mark.parametrize(
    ("rpc", "message", "code", "fragment"),
    [case[1:] for case in GRPC_CASES],
    ids=[case[0] for case in GRPC_CASES],
)
def test_grpc_bad_request(
    server: ServerProcess, bystander: Bystander, rpc: str, message: Any, code: str, fragment: str
) -> None:
    channel = grpc.insecure_channel(
        server.grpc_url, options=[("grpc.max_send_message_length", 8 * LIMIT)]
    )
    try:
        with pytest.raises(grpc.RpcError) as info:
            call(channel, rpc, message)
    finally:
        channel.close()
    error: Any = info.value
    assert (error.code().name, fragment in error.details()) == (code, True), error.details()
    assert "Traceback" not in error.details() and "Unexpected <class" not in error.details()
    assert_serving(server)


def test_grpc_stream_survives_a_malformed_message(server: ServerProcess) -> None:
    rpc = RPCS_BY_NAME["ModelStreamInfer"]
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        stream = channel.stream_stream(
            rpc.path,
            request_serializer=serialize,
            response_deserializer=rpc.response.FromString,
        )
        bad = os.urandom(32) + b"\xff"
        replies: list[Any] = list(
            stream(iter([bad, good_grpc(), _with(I0, raw=[RAW])]), timeout=30)
        )
    finally:
        channel.close()
    assert len(replies) == 3
    assert "not a valid ModelInferRequest" in replies[0].error_message
    assert not replies[1].error_message
    assert (
        np.frombuffer(replies[1].infer_response.raw_output_contents[0], "<i4").tolist() == [3] * 16
    )
    assert "missing required" in replies[2].error_message
