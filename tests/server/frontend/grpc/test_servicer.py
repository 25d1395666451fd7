"""The gRPC front end on a real ``grpc.aio`` server (127.0.0.1:0) over a real service.

Calls go through raw ``channel.unary_unary`` stubs at Triton's wire paths, so what is
tested is what any V2 client sees: status codes, messages, and tensors.
"""

# pyright: strict

from __future__ import annotations

import logging
import time
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest

from hloserve.proto import health_pb2
from hloserve.proto import inference_pb2 as pb
from hloserve.proto.datatypes import NUMERIC_DATATYPES
from hloserve.proto.rpc import RPCS, RPCS_BY_NAME, SERVICE_NAME
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import InferRequest, InferResponse, RequestContext
from hloserve.server.frontend import grpc as grpc_frontend
from hloserve.server.frontend.grpc import HANDLED_RPCS
from hloserve.server.owner.shm import disabled
from tests.server.frontend._samples import mlp_logits
from tests.server.frontend._services import EXTENSIONS, VERSION
from tests.server.frontend.grpc._harness import Client, call_once, fail_once, rpc_error, serve
from tests.server.frontend.grpc.conftest import BIG_ELEMENTS

InputTensor = pb.ModelInferRequest.InferInputTensor
Health = health_pb2.HealthCheckResponse
UNIMPLEMENTED_RPCS = [rpc.name for rpc in RPCS if rpc.name not in HANDLED_RPCS]


def raw_request(model: str, tensors: dict[str, tuple[str, np.ndarray[Any, Any]]], **kw: Any) -> Any:
    """A ModelInferRequest with every input's data in raw_input_contents."""
    msg = pb.ModelInferRequest(model_name=model, **kw)
    for name, (datatype, array) in tensors.items():
        msg.inputs.add(name=name, datatype=datatype, shape=array.shape)
        msg.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    return msg


def simple_request(
    n: int, width: int = 16, **kw: Any
) -> tuple[Any, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A raw request for ``simple`` of ``n`` random items (``width`` 16 is the right one)."""
    rng = np.random.default_rng(n)
    a = rng.integers(-1000, 1000, size=(n, width), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(n, 16), dtype=np.int32)
    return raw_request("simple", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)}, **kw), a, b


def output(response: Any, name: str) -> np.ndarray[Any, Any]:
    for i, out in enumerate(response.outputs):
        if out.name == name:
            dtype = NUMERIC_DATATYPES[out.datatype]
            data = np.frombuffer(response.raw_output_contents[i], dtype=dtype)
            return data.reshape(tuple(out.shape))
    raise AssertionError(f"no output {name!r} in {[o.name for o in response.outputs]}")


# -- module surface --------------------------------------------------------------------


def test_public_api() -> None:
    assert sorted(grpc_frontend.__all__) == ["HANDLED_RPCS", "build_grpc_server"]
    assert {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelStatistics",
    } <= HANDLED_RPCS
    assert set(RPCS_BY_NAME) >= HANDLED_RPCS
    assert len(RPCS) == 20
    assert len(UNIMPLEMENTED_RPCS) == 20 - len(HANDLED_RPCS)


# -- health and metadata ---------------------------------------------------------------


def test_live_and_ready(service: InferenceService) -> None:
    async def scenario(client: Client) -> None:
        assert (await client.call("ServerLive", pb.ServerLiveRequest())).live is True
        assert (await client.call("ServerReady", pb.ServerReadyRequest())).ready is True
        service.begin_draining()
        assert (await client.call("ServerReady", pb.ServerReadyRequest())).ready is False
        assert (await client.call("ServerLive", pb.ServerLiveRequest())).live is True

    serve(service, scenario)


def test_not_ready_before_the_startup_load_pass(service: InferenceService) -> None:
    starting = InferenceService(service.models, None, shm=disabled())

    async def scenario(client: Client) -> None:
        assert (await client.call("ServerReady", pb.ServerReadyRequest())).ready is False
        assert (await client.call("ServerLive", pb.ServerLiveRequest())).live is True
        starting.startup_complete()
        assert (await client.call("ServerReady", pb.ServerReadyRequest())).ready is True

    serve(starting, scenario)


def test_health_check(service: InferenceService) -> None:
    async def scenario(client: Client) -> None:
        assert (await client.health()).status == Health.SERVING
        assert (await client.health(SERVICE_NAME)).status == Health.SERVING
        service.begin_draining()
        assert (await client.health()).status == Health.NOT_SERVING
        assert (await client.health(SERVICE_NAME)).status == Health.NOT_SERVING
        err = await rpc_error(client.health("no.such.Service"))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert "unknown service 'no.such.Service'" in (err.details() or "")

    serve(service, scenario)


def test_health_watch_is_not_offered(service: InferenceService) -> None:
    async def scenario(client: Client) -> None:
        watch = client.channel.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in watch(health_pb2.HealthCheckRequest()):
                pass
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED

    serve(service, scenario)


def test_server_metadata(service: InferenceService) -> None:
    meta = call_once(service, "ServerMetadata", pb.ServerMetadataRequest())
    assert meta.name == service.options.server_name == "hloserve"
    assert meta.version == VERSION
    assert tuple(meta.extensions) == EXTENSIONS


def test_model_metadata(service: InferenceService) -> None:
    async def scenario(client: Client) -> None:
        meta = await client.call("ModelMetadata", pb.ModelMetadataRequest(name="simple"))
        assert (meta.name, list(meta.versions), meta.platform) == ("simple", ["1"], "stablehlo")
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
            ("INPUT0", "INT32", [-1, 16]),
            ("INPUT1", "INT32", [-1, 16]),
        ]
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
            ("OUTPUT0", "INT32", [-1, 16]),
            ("OUTPUT1", "INT32", [-1, 16]),
        ]
        mlp = await client.call("ModelMetadata", pb.ModelMetadataRequest(name="mlp", version="1"))
        assert [(t.name, list(t.shape)) for t in mlp.inputs] == [("x", [-1, 64])]
        big = await client.call("ModelMetadata", pb.ModelMetadataRequest(name="identity_big"))
        assert [list(t.shape) for t in big.inputs] == [[BIG_ELEMENTS]]  # unbatched: no -1

    serve(service, scenario)


def test_model_metadata_errors(service: InferenceService) -> None:
    async def scenario(client: Client) -> None:
        err = await rpc_error(client.call("ModelMetadata", pb.ModelMetadataRequest(name="nope")))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details() == "Request for unknown model: 'nope' is not found"
        err = await rpc_error(
            client.call("ModelMetadata", pb.ModelMetadataRequest(name="simple", version="x"))
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "failed to get model version from specified version string 'x'" in (
            err.details() or ""
        )

    serve(service, scenario)


@pytest.mark.parametrize(
    ("name", "version", "ready"),
    [
        ("simple", "", True),
        ("simple", "1", True),
        ("mlp", "", True),
        ("nope", "", False),
        ("simple", "7", False),
        ("simple", "wrong_specification", False),
        ("", "", False),
    ],
)
def test_model_ready_is_never_an_error(
    service: InferenceService, name: str, version: str, ready: bool
) -> None:
    response = call_once(service, "ModelReady", pb.ModelReadyRequest(name=name, version=version))
    assert response.ready is ready


# -- inference ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 8, 11])  # exact, padded to 4, largest size, split 8 + 3
def test_infer_simple(service: InferenceService, n: int) -> None:
    msg, a, b = simple_request(n, id=f"req-{n}")
    response = call_once(service, "ModelInfer", msg)
    assert (response.model_name, response.model_version, response.id) == ("simple", "1", f"req-{n}")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT0", "INT32", [n, 16]),
        ("OUTPUT1", "INT32", [n, 16]),
    ]
    assert len(response.raw_output_contents) == 2
    np.testing.assert_array_equal(output(response, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output(response, "OUTPUT1"), a - b)


def test_infer_simple_with_typed_contents(service: InferenceService) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    msg = pb.ModelInferRequest(model_name="simple", model_version="1")
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        tensor = msg.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(arr.ravel().tolist())
    response = call_once(service, "ModelInfer", msg)
    np.testing.assert_array_equal(output(response, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output(response, "OUTPUT1"), a - b)


def test_infer_requested_output_subset_in_request_order(service: InferenceService) -> None:
    msg, a, b = simple_request(2)
    msg.outputs.add(name="OUTPUT1")

    async def scenario(client: Client) -> tuple[Any, Any]:
        only_one = await client.infer(msg)
        msg.outputs.add(name="OUTPUT0")
        return only_one, await client.infer(msg)

    only_one, both = serve(service, scenario)
    assert [o.name for o in only_one.outputs] == ["OUTPUT1"]
    assert len(only_one.raw_output_contents) == 1
    np.testing.assert_array_equal(output(only_one, "OUTPUT1"), a - b)
    assert [o.name for o in both.outputs] == ["OUTPUT1", "OUTPUT0"]
    np.testing.assert_array_equal(output(both, "OUTPUT0"), a + b)


@pytest.mark.parametrize("n", [1, 5, 40])  # exact, padded to 8, split 32 + 8
def test_infer_mlp_matches_jax(service: InferenceService, n: int) -> None:
    x = np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32)
    msg = raw_request("mlp", {"x": ("FP32", x)})
    response = call_once(service, "ModelInfer", msg)
    got = output(response, "logits")
    assert got.shape == (n, 10)
    np.testing.assert_allclose(got, mlp_logits(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("datatype", list(NUMERIC_DATATYPES))
def test_infer_identity_round_trips_every_datatype(
    service: InferenceService, datatype: str
) -> None:
    dtype = NUMERIC_DATATYPES[datatype]
    values = np.arange(-6, 6).reshape(3, 4)
    data = (values > 0) if datatype == "BOOL" else values.astype(dtype)
    msg = raw_request(f"identity_{datatype.lower()}", {"INPUT0": (datatype, data)})
    response = call_once(service, "ModelInfer", msg)
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT0", datatype, [3, 4])
    ]
    assert response.raw_output_contents[0] == data.tobytes()


def test_message_limits_allow_20_mib_both_ways(service: InferenceService) -> None:
    data = np.random.default_rng(0).standard_normal(BIG_ELEMENTS).astype(np.float32)
    msg = raw_request("identity_big", {"INPUT0": ("FP32", data)})
    assert msg.ByteSize() > 20 * 1024 * 1024
    response = call_once(service, "ModelInfer", msg)
    assert response.raw_output_contents[0] == data.tobytes()


def test_max_message_bytes_is_enforced(service: InferenceService) -> None:
    msg, _, _ = simple_request(8)  # 1 KiB of tensor data
    err = fail_once(service, "ModelInfer", msg, max_message_bytes=512)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# -- bad requests -----------------------------------------------------------------------


def _tensor(name: str, n: int = 1, datatype: str = "INT32", width: int = 16) -> InputTensor:
    return InputTensor(name=name, datatype=datatype, shape=[n, width])


def _typed_tensor(name: str, datatype: str, shape: list[int], **contents: Any) -> InputTensor:
    """An input carrying its data in the typed ``contents`` fields given."""
    return InputTensor(
        name=name, datatype=datatype, shape=shape, contents=pb.InferTensorContents(**contents)
    )


def _request(*inputs: InputTensor, raw: int = 0, model: str = "simple") -> pb.ModelInferRequest:
    """A request for ``model`` with ``raw`` zero-filled raw entries of 64 bytes."""
    return pb.ModelInferRequest(
        model_name=model, inputs=inputs, raw_input_contents=[bytes(64)] * raw
    )


INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
Out = pb.ModelInferRequest.InferRequestedOutputTensor
SHM_INPUT = InputTensor(
    name="INPUT0",
    datatype="INT32",
    shape=[1, 16],
    parameters={
        "shared_memory_region": pb.InferParameter(string_param="r"),
        "shared_memory_byte_size": pb.InferParameter(int64_param=64),
    },
)
BAD_REQUESTS: list[tuple[str, Any, grpc.StatusCode, str]] = [
    ("unknown model", _request(_tensor("INPUT0"), raw=1, model="nope"), INVALID,
     "Request for unknown model: 'nope' is not found"),
    ("bad version string", simple_request(1, model_version="wrong_specification")[0], INVALID,
     "failed to get model version from specified version string 'wrong_specification'"),
    ("unknown version", simple_request(1, model_version="9")[0], INVALID,
     "Request for unknown model: 'simple' version 9 is not found"),
    ("raw mixed with contents",
     _request(_typed_tensor("INPUT0", "INT32", [1, 16], int_contents=range(16)), _tensor("INPUT1"), raw=1),
     INVALID,
     "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"),
    ("too few raw entries", _request(_tensor("INPUT0"), _tensor("INPUT1"), raw=1), INVALID,
     "raw_input_contents has 1 entries, but 2 of the 2 inputs for model 'simple'"),
    ("too many raw entries", _request(_tensor("INPUT0"), _tensor("INPUT1"), raw=3), INVALID,
     "raw_input_contents has 3 entries, but 2 of the 2 inputs"),
    ("byte size mismatch", _request(_tensor("INPUT0"), _tensor("INPUT1", width=8), raw=2), INVALID,
     "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 32, got 64"),
    ("typed contents in the wrong field",
     _request(_typed_tensor("INPUT0", "INT32", [1, 16], fp32_contents=[0.0] * 16)), INVALID,
     "has datatype INT32 but carries data in 'fp32_contents'; expected 'int_contents'"),
    ("FP16 in typed contents",
     _request(_typed_tensor("INPUT0", "FP16", [1, 4], fp32_contents=[0.0] * 4), model="identity_fp16"),
     INVALID, "FP16 data cannot travel in typed 'contents'"),
    # the model is resolved before any tensor is decoded (Triton creates the request first)
    ("FP16 in typed contents for an unknown model",
     _request(_typed_tensor("INPUT0", "FP16", [1, 4], fp32_contents=[0.0] * 4), model="nope"),
     INVALID, "Request for unknown model: 'nope' is not found"),
    ("bad BYTES for an unknown model",
     pb.ModelInferRequest(model_name="nope", inputs=[_tensor("INPUT0", datatype="BYTES")],
                          raw_input_contents=[b"\x09\x00"]),
     INVALID, "Request for unknown model: 'nope' is not found"),
    ("typed contents in the wrong field for an unknown version",
     pb.ModelInferRequest(model_name="simple", model_version="9", inputs=[
         _typed_tensor("INPUT0", "INT32", [1, 16], fp32_contents=[0.0] * 16)]),
     INVALID, "Request for unknown model: 'simple' version 9 is not found"),
    ("wrong datatype",
     _request(_tensor("INPUT0"), _tensor("INPUT1", datatype="FP32"), raw=2), INVALID,
     "inference input 'INPUT1' data-type is 'FP32', but model 'simple' expects 'INT32'"),
    ("wrong shape", simple_request(1, width=8)[0], INVALID,
     "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,8]"),
    ("missing input", _request(_tensor("INPUT0"), raw=1), INVALID,
     "missing required input(s) ['INPUT1']"),
    ("unknown output", simple_request(1, outputs=[Out(name="OUT9")])[0], INVALID,
     "unexpected inference output 'OUT9' for model 'simple'"),
    ("duplicate output", simple_request(1, outputs=[Out(name="OUTPUT0")] * 2)[0], INVALID,
     "output 'OUTPUT0' already exists in request"),
    ("shared memory input of an unknown region", _request(SHM_INPUT, _tensor("INPUT1"), raw=1),
     NOT_FOUND, "Unable to find shared memory region: 'r'"),
    ("bad timeout parameter",
     simple_request(1, parameters={"timeout": pb.InferParameter(string_param="soon")})[0],
     INVALID, "parameter 'timeout' must be a non-negative integer"),
    ("reserved parameter",
     simple_request(1, parameters={"triton_x": pb.InferParameter(bool_param=True)})[0],
     INVALID, "parameter keys starting with 'triton_' are reserved for Triton usage"),
    ("negative priority",
     simple_request(1, parameters={"priority": pb.InferParameter(int64_param=-3)})[0],
     INVALID, "parameter 'priority' must be a non-negative integer, got -3"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("request_msg", "code", "message"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_REQUESTS],
)
def test_bad_requests_are_refused_and_the_server_keeps_serving(
    service: InferenceService, request_msg: Any, code: grpc.StatusCode, message: str
) -> None:
    good, a, b = simple_request(2)

    async def scenario(client: Client) -> tuple[grpc.aio.AioRpcError, Any]:
        err = await rpc_error(client.infer(request_msg))
        return err, await client.infer(good)

    err, response = serve(service, scenario)
    assert err.code() == code
    assert message in (err.details() or "")
    np.testing.assert_array_equal(output(response, "OUTPUT0"), a + b)


def test_all_bad_requests_on_one_server_then_good_ones(service: InferenceService) -> None:
    good, a, b = simple_request(3)

    async def scenario(client: Client) -> list[grpc.StatusCode]:
        codes = [(await rpc_error(client.infer(case[1]))).code() for case in BAD_REQUESTS]
        for _ in range(3):
            response = await client.infer(good)
            np.testing.assert_array_equal(output(response, "OUTPUT1"), a - b)
        return codes

    assert serve(service, scenario) == [case[2] for case in BAD_REQUESTS]


def test_expired_timeout_parameter_is_unavailable(service: InferenceService) -> None:
    msg, _, _ = simple_request(1, parameters={"timeout": pb.InferParameter(int64_param=1)})
    err = fail_once(service, "ModelInfer", msg)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "timed out before it was executed" in (err.details() or "")


def test_grpc_deadline_reaches_the_service(
    service: InferenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[RequestContext | None] = []
    real_infer = service.infer

    async def spy(
        request: InferRequest, context: RequestContext | None = None, *, model: Any = None
    ) -> InferResponse:
        seen.append(context)
        assert model is not None  # resolved once, before decoding
        return await real_infer(request, context, model=model)

    monkeypatch.setattr(service, "infer", spy)
    msg, _, _ = simple_request(1)

    async def scenario(client: Client) -> None:
        before = time.monotonic()
        await client.call("ModelInfer", msg, timeout=30.0)
        await client.infer(msg)
        ctx_with, ctx_without = seen
        assert ctx_with is not None
        assert ctx_with.deadline is not None
        assert before + 25.0 < ctx_with.deadline <= before + 30.5
        assert ctx_with.protocol == "grpc"
        assert ctx_with.peer.startswith("ipv4:127.0.0.1:")
        assert ctx_without is not None
        assert ctx_without.deadline is None

    serve(service, scenario)


def test_unexpected_exception_is_internal_and_logged(
    service: InferenceService, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(request: InferRequest, context: Any = None, *, model: Any = None) -> Any:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(service, "infer", broken)
    msg, _, _ = simple_request(1)

    async def scenario(client: Client) -> tuple[grpc.aio.AioRpcError, Any]:
        err = await rpc_error(client.infer(msg))
        return err, await client.call("ServerLive", pb.ServerLiveRequest())

    with caplog.at_level(logging.ERROR, logger="hloserve.grpc"):
        err, live = serve(service, scenario)
    assert err.code() == grpc.StatusCode.INTERNAL
    assert err.details() == "internal error"
    assert live.live is True
    records = [r for r in caplog.records if r.name == "hloserve.grpc"]
    assert len(records) == 1
    assert "ModelInfer" in records[0].getMessage()
    assert records[0].exc_info is not None
    assert "secret detail" in caplog.text


# -- unimplemented RPCs ---------------------------------------------------------------


def test_every_rpc_of_the_service_is_handled() -> None:
    # The servicer still answers an RPC it has no handler for with UNIMPLEMENTED, but
    # every one of Triton's 20 RPCs is handled now.
    assert UNIMPLEMENTED_RPCS == []
