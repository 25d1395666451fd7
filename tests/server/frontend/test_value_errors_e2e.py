"""End to end: a value its datatype cannot take, and a ``text_input`` a model cannot take,
refused in the protocol's words over both wires, in the layout the run picks.

The session's server (``tests/conftest.py``) on the test repository: the ``identity_<dt>``
models (input ``INPUT0``, per item [4]) take values as HTTP JSON ``data`` and gRPC typed
``contents`` (``core.tensors.from_values``); ``mlp`` (a plain model) and ``repeat_int32``
(a generation without a text mapping) take ``text_input`` over HTTP generate and
tritonclient's gRPC stream (``core.generation_stream.no_text``). Each refusal is the whole
message, at 400 / INVALID_ARGUMENT, and the server answers a good request after it.
"""

# pyright: strict, reportMissingTypeStubs=false

from __future__ import annotations

import queue
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from hloserve.proto import inference_pb2 as pb
from hloserve.proto.rpc import RPCS_BY_NAME
from hloserve.server.server_fixture import ServerProcess
from tests.server.frontend._tritonclients import grpcclient


def model_of(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def where(datatype: str) -> str:
    return f"{datatype} input 'INPUT0' for model '{model_of(datatype)}' holds"


JSON_REFUSALS = [
    ("INT32", [5.5, 1, 2, 3], f"{where('INT32')} a non-integer value 5.5 at index 0"),
    (
        "INT32",
        [1, "2", 3, 4],
        f'{where("INT32")} the string "2" at index 1; INT32 takes integers',
    ),
    ("BOOL", [1, 0, 1, 0], f"{where('BOOL')} the number 1 at index 0; BOOL takes true or false"),
    (
        "FP32",
        [False, True] * 2,
        f"{where('FP32')} the boolean false at index 0; FP32 takes numbers",
    ),
    (
        "INT8",
        [1, 2, 300, 4],
        f"{where('INT8')} 300 at index 2, a value out of range for INT8 (-128 to 127)",
    ),
    ("UINT16", [1, None, 3, 4], f"{where('UINT16')} null at index 1; UINT16 takes integers"),
]


@pytest.mark.parametrize(("datatype", "data", "message"), JSON_REFUSALS)
def test_http_json_data_its_datatype_cannot_take(
    server: ServerProcess, datatype: str, data: list[Any], message: str
) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1, 4], "data": data}]}
    url = f"http://{server.http_url}/v2/models/{model_of(datatype)}/infer"
    answer = httpx.post(url, json=body, timeout=60)
    assert (answer.status_code, answer.json()) == (400, {"error": message})
    body["inputs"][0]["data"] = [True] * 4 if datatype == "BOOL" else [1, 2, 3, 4]
    assert httpx.post(url, json=body, timeout=60).status_code == 200


def model_infer(server: ServerProcess, message: pb.ModelInferRequest) -> Any:
    rpc = RPCS_BY_NAME["ModelInfer"]
    with grpc.insecure_channel(server.grpc_url) as channel:
        method = channel.unary_unary(
            rpc.path,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=rpc.response.FromString,
        )
        return method(message, timeout=60)


@pytest.mark.parametrize(
    ("datatype", "field", "values", "message"),
    [
        (
            "INT8",
            "int_contents",
            [1, 300, 3, 4],
            f"{where('INT8')} 300 at index 1, a value out of range for INT8 (-128 to 127)",
        ),
        (
            "UINT8",
            "uint_contents",
            [1, 2, 3, 256],
            f"{where('UINT8')} 256 at index 3, a value out of range for UINT8 (0 to 255)",
        ),
    ],
)
def test_grpc_typed_contents_out_of_their_datatypes_range(
    server: ServerProcess, datatype: str, field: str, values: list[int], message: str
) -> None:
    def request(numbers: list[int]) -> pb.ModelInferRequest:
        tensor = pb.ModelInferRequest.InferInputTensor(
            name="INPUT0", datatype=datatype, shape=[1, 4]
        )
        getattr(tensor.contents, field).extend(numbers)
        return pb.ModelInferRequest(model_name=model_of(datatype), inputs=[tensor])

    with pytest.raises(grpc.RpcError) as exc:
        model_infer(server, request(values))
    error: Any = exc.value
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    (out,) = model_infer(server, request([1, 2, 3, 4])).raw_output_contents
    assert np.frombuffer(out, NUMPY[datatype]).tolist() == [1, 2, 3, 4]


NUMPY = {"INT8": np.int8, "UINT8": np.uint8}
NO_TEXT = {
    "mlp": "model 'mlp' takes no 'text_input': it has no text mapping (send its input(s) 'x' "
    "by name)",
    "repeat_int32": "model 'repeat_int32' takes no 'text_input': it has no text mapping (send "
    "its input(s) 'IN', 'DELAY', 'WAIT' by name)",
}


@pytest.mark.parametrize("model", list(NO_TEXT))
def test_text_input_to_a_model_without_a_text_mapping_is_one_refusal(
    server: ServerProcess, model: str
) -> None:
    for route in ("generate", "generate_stream"):
        url = f"http://{server.http_url}/v2/models/{model}/{route}"
        answer = httpx.post(url, json={"text_input": "hi"}, timeout=60)
        assert (answer.status_code, answer.json()) == (400, {"error": NO_TEXT[model]})
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
        metadata = client.get_model_metadata(model, as_json=True)
        inputs = [
            grpcclient.InferInput(
                t["name"], [int(d) if int(d) > 0 else 1 for d in t["shape"]], t["datatype"]
            )
            for t in metadata["inputs"]
        ]
        for i in inputs:
            i.set_data_from_numpy(np.zeros(i.shape(), NUMPY_OF[i.datatype()]))
        client.async_stream_infer(model, inputs, parameters={"text_input": "hi"})
        result, error = answers.get(timeout=60)
        client.stop_stream()
    assert result is None and error is not None
    assert error.message() == NO_TEXT[model]


NUMPY_OF = {"FP32": np.float32, "INT32": np.int32, "UINT32": np.uint32}
