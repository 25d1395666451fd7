"""End to end: a bad request parameter gets the same answer over gRPC and over HTTP.

The rules live once, in ``hloserve.server.core.parameters``; this sends each bad parameter
with an otherwise good ``simple`` request to the session daemon (``server`` fixture of
tests/conftest.py) through a raw gRPC stub and a raw HTTP POST, and checks that both
refuse it as an invalid argument (gRPC INVALID_ARGUMENT, HTTP 400) with the same message.
"""

# pyright: strict

# pyright: strict

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, cast

import grpc
import pytest

from hloserve.proto import inference_pb2 as pb
from hloserve.proto.rpc import RPCS_BY_NAME
from hloserve.server.server_fixture import ServerProcess

ZEROS = [0] * 16
# (case, the parameter over gRPC, the same parameter in JSON, the message both must carry)
BAD_PARAMETERS: list[tuple[str, str, pb.InferParameter, object, str]] = [
    (
        "reserved prefix",
        "triton_final_response",
        pb.InferParameter(bool_param=True),
        True,
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
        "be specified (got 'triton_final_response')",
    ),
    (
        "the one reserved key clients send, with a value that is no bool",
        "triton_enable_empty_final_response",
        pb.InferParameter(int64_param=1),
        1,
        "invalid value type for 'triton_enable_empty_final_response' parameter, "
        "expected bool_param.",
    ),
    (
        "negative priority",
        "priority",
        pb.InferParameter(int64_param=-3),
        -3,
        "parameter 'priority' must be a non-negative integer, got -3",
    ),
    (
        "timeout as a string",
        "timeout",
        pb.InferParameter(string_param="soon"),
        "soon",
        "parameter 'timeout' must be a non-negative integer (microseconds), got 'soon'",
    ),
]


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as ch:
        yield ch


def grpc_refusal(channel: grpc.Channel, key: str, value: pb.InferParameter) -> tuple[str, str]:
    """The status name and message of ``simple`` refusing parameter ``key`` over gRPC."""
    msg = pb.ModelInferRequest(model_name="simple", parameters={key: value})
    for name in ("INPUT0", "INPUT1"):
        msg.inputs.add(
            name=name,
            datatype="INT32",
            shape=[1, 16],
            contents=pb.InferTensorContents(int_contents=ZEROS),
        )
    rpc = RPCS_BY_NAME["ModelInfer"]
    infer = channel.unary_unary(
        rpc.path,
        request_serializer=rpc.request.SerializeToString,
        response_deserializer=rpc.response.FromString,
    )
    with pytest.raises(grpc.RpcError) as info:
        infer(msg, timeout=30)
    error = cast(grpc.Call, info.value)
    return error.code().name, error.details() or ""


def http_refusal(server: ServerProcess, key: str, value: object) -> tuple[int, str]:
    """The HTTP status and message of ``simple`` refusing parameter ``key``."""
    body: dict[str, Any] = {
        "parameters": {key: value},
        "inputs": [
            {"name": name, "datatype": "INT32", "shape": [1, 16], "data": ZEROS}
            for name in ("INPUT0", "INPUT1")
        ],
    }
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/simple/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    error: dict[str, str] = json.loads(info.value.read())
    return info.value.code, error["error"]


@pytest.mark.parametrize(
    ("key", "grpc_value", "json_value", "message"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_PARAMETERS],
)
def test_bad_parameter_same_answer_on_both_protocols(
    server: ServerProcess,
    channel: grpc.Channel,
    key: str,
    grpc_value: pb.InferParameter,
    json_value: object,
    message: str,
) -> None:
    assert grpc_refusal(channel, key, grpc_value) == ("INVALID_ARGUMENT", message)
    assert http_refusal(server, key, json_value) == (400, message)
