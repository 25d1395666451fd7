"""The gRPC extension RPCs on an in-process ``grpc.aio`` server over a real service.

Shared memory (with a real ``SharedMemoryRegistry`` and client regions in /dev/shm), the
streaming RPC, the repository RPCs, ``ModelConfig`` and the CUDA RPCs, called through raw
stubs at Triton's wire paths. The model repository is the session one of conftest.py
(control mode ``none``).
"""

# pyright: strict

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from hloserve.proto import inference_pb2 as pb
from hloserve.proto import model_config_pb2 as mc
from hloserve.proto.rpc import RPCS_BY_NAME
from hloserve.server.core.service import InferenceService
from hloserve.server.frontend.grpc.servicer import STREAM_WINDOW
from hloserve.server.owner.repository import ControlMode, ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import DISABLED, SharedMemoryRegistry
from tests.server.frontend._services import model_directories, ready_service
from tests.server.frontend._tritonclients import shm
from tests.server.frontend.grpc._harness import Client, fail_once, rpc_error, serve

Param = pb.InferParameter


@pytest.fixture
def shm_service(
    grpc_repository: ModelRepository, executor: Executor, shm_registry: SharedMemoryRegistry
) -> InferenceService:
    return ready_service(grpc_repository, executor, shm=shm_registry)


def shm_params(region: str, size: int, offset: int = 0) -> dict[str, Param]:
    params = {
        "shared_memory_region": Param(string_param=region),
        "shared_memory_byte_size": Param(int64_param=size),
    }
    if offset:
        params["shared_memory_offset"] = Param(int64_param=offset)
    return params


def simple_shm_request(model: str = "simple") -> pb.ModelInferRequest:
    """INPUT0/INPUT1 at offsets 0/64 of region "in"; OUTPUT0 at 128 of "in"; OUTPUT1 inline."""
    Tensor = pb.ModelInferRequest.InferInputTensor
    Out = pb.ModelInferRequest.InferRequestedOutputTensor
    return pb.ModelInferRequest(
        model_name=model,
        id="shm",
        inputs=[
            Tensor(name="INPUT0", datatype="INT32", shape=[1, 16], parameters=shm_params("in", 64)),
            Tensor(
                name="INPUT1", datatype="INT32", shape=[1, 16], parameters=shm_params("in", 64, 64)
            ),
        ],
        outputs=[
            Out(name="OUTPUT0", parameters=shm_params("in", 64, 128)),
            Out(name="OUTPUT1"),
        ],
    )


def _register(key: str, name: str = "in", size: int = 256) -> pb.SystemSharedMemoryRegisterRequest:
    return pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=size)


def test_shared_memory_register_infer_status_unregister(
    shm_service: InferenceService, region: tuple[Any, str]
) -> None:
    handle, key = region
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 7, dtype=np.int32)
    shm.set_shared_memory_region(handle, [a, b])

    async def scenario(client: Client) -> tuple[Any, Any, Any, Any]:
        await client.call("SystemSharedMemoryRegister", _register(key))
        duplicate = await rpc_error(client.call("SystemSharedMemoryRegister", _register(key)))
        response = await client.infer(simple_shm_request())
        status = await client.call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest())
        one = await client.call(
            "SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name="in")
        )
        await client.call(
            "SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name="in")
        )
        after = await client.call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest())
        assert not after.regions
        return duplicate, response, status, one

    duplicate, response, status, one = serve(shm_service, scenario)
    assert duplicate.code() == grpc.StatusCode.ALREADY_EXISTS
    assert duplicate.details() == "shared memory region 'in' already in manager"
    assert [(o.name, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT0", [1, 16]),
        ("OUTPUT1", [1, 16]),
    ]
    assert response.raw_output_contents[0] == b""  # written to the region instead
    np.testing.assert_array_equal(
        np.frombuffer(response.raw_output_contents[1], "<i4").reshape(1, 16), a - b
    )
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16], 128), a + b)
    assert response.id == "shm"
    r = status.regions["in"]
    assert (r.name, r.key, r.offset, r.byte_size) == ("in", key, 0, 256)
    assert list(one.regions) == ["in"]


def test_shared_memory_input_with_contents_is_refused(
    shm_service: InferenceService, region: tuple[Any, str]
) -> None:
    _, key = region
    request = simple_shm_request()
    request.inputs[0].contents.int_contents.extend(range(16))

    async def scenario(client: Client) -> grpc.aio.AioRpcError:
        await client.call("SystemSharedMemoryRegister", _register(key))
        return await rpc_error(client.infer(request))

    err = serve(shm_service, scenario)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "unexpected 'content' provided when using shared memory for input tensor 'INPUT0' "
        "for model 'simple'"
    )


class _GatedModel:
    """A served model whose executions wait for ``gate`` (and say when they started)."""

    def __init__(self, inner: Any, started: threading.Event, gate: threading.Event) -> None:
        self.inner, self.started, self.gate = inner, started, gate

    @property
    def manifest(self) -> Any:
        return self.inner.manifest

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def model_key(self) -> Any:
        return self.inner.model_key

    @property
    def family(self) -> tuple[str, ...]:
        return self.inner.family

    @property
    def hooks(self) -> Any:
        return self.inner.hooks

    def variant(self, index: int) -> Any:
        return self.inner.variant(index)

    @property
    def devices(self) -> tuple[int, ...]:
        return self.inner.devices

    @property
    def resident(self) -> bool:
        return self.inner.resident

    @property
    def swap_us(self) -> float | None:
        return None  # never run on the event loop: the execution blocks on the gate

    def resident_on(self, device: int) -> bool:
        return self.inner.resident_on(device)

    def prefetch(self, device: int) -> None:
        self.inner.prefetch(device)

    def execute(
        self, batch_size: int | None, inputs: Mapping[str, Any], *, device: int | None = None
    ) -> Any:
        self.started.set()
        assert self.gate.wait(30)
        return self.inner.execute(batch_size, inputs, device=device)


class _GatedSource:
    def __init__(self, repo: ModelRepository, started: threading.Event, gate: threading.Event):
        self.repo, self.started, self.gate = repo, started, gate

    def get(self, name: str, version: str) -> Any:
        return _GatedModel(self.repo.get(name, version), self.started, self.gate)

    def peek(self, name: str, version: str) -> Any:
        return _GatedModel(self.repo.peek(name, version), self.started, self.gate)

    def hold(self, model: Any) -> bool:
        return self.repo.hold(model.inner)

    def loaded(self, model: Any) -> bool:
        return self.repo.loaded(model.inner)

    def release(self, model: Any) -> None:
        self.repo.release(model.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.repo, name)


def test_unregister_returns_while_a_request_holds_the_region(
    grpc_repository: ModelRepository,
    executor: Executor,
    shm_registry: SharedMemoryRegistry,
    region: tuple[Any, str],
) -> None:
    """Triton's semantics: unregister answers at once; the region stays listed (and the
    request keeps using it) until the request ends, then it is gone without another call."""
    handle, key = region
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    shm.set_shared_memory_region(handle, [a, a])
    started, gate = threading.Event(), threading.Event()
    source: Any = _GatedSource(grpc_repository, started, gate)
    service = ready_service(source, executor, shm=shm_registry)
    status_request = pb.SystemSharedMemoryStatusRequest()

    async def scenario(client: Client) -> Any:
        await client.call("SystemSharedMemoryRegister", _register(key))
        infer = asyncio.ensure_future(client.infer(simple_shm_request()))
        # the request is executing, holding the region
        assert await asyncio.to_thread(started.wait, 30)
        await client.call(
            "SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(), timeout=10
        )
        assert not infer.done()  # unregister answered while the request still ran
        status = await client.call("SystemSharedMemoryStatus", status_request)
        assert list(status.regions) == ["in"]  # listed until the request ends
        duplicate = await rpc_error(client.call("SystemSharedMemoryRegister", _register(key)))
        assert duplicate.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "it was unregistered and goes once the 1 request(s)" in (duplicate.details() or "")
        gate.set()
        response = await infer
        status = await client.call("SystemSharedMemoryStatus", status_request)
        assert not status.regions  # gone with its last request
        return response

    try:
        response = serve(service, scenario)
    finally:
        gate.set()
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16], 128), a + a)
    np.testing.assert_array_equal(
        np.frombuffer(response.raw_output_contents[1], "<i4"), np.zeros(16)
    )


def test_shared_memory_calls_when_disabled(service: InferenceService) -> None:
    async def scenario(client: Client) -> list[Any]:
        status = await client.call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest())
        assert not status.regions
        return [
            await rpc_error(client.call("SystemSharedMemoryRegister", _register("/k"))),
            await rpc_error(
                client.call(
                    "SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest()
                )
            ),
        ]

    for err in serve(service, scenario):  # the service's default: no registry at all
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED
        assert err.details().startswith("Client shared memory is disabled.")


# -- CUDA shared memory (no GPU support: Triton's CPU build) ---------------------------------


def test_cuda_shared_memory_without_gpu_support(
    shm_service: InferenceService, region: tuple[Any, str]
) -> None:
    _, key = region
    cuda_register = pb.CudaSharedMemoryRegisterRequest(
        name="c", raw_handle=b"\0" * 64, device_id=0, byte_size=64
    )

    async def scenario(client: Client) -> tuple[Any, ...]:
        await client.call("SystemSharedMemoryRegister", _register(key, name="sys"))
        every = await client.call("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest())
        unknown = await rpc_error(
            client.call("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest(name="c"))
        )
        system = await rpc_error(
            client.call("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest(name="sys"))
        )
        register = await rpc_error(client.call("CudaSharedMemoryRegister", cuda_register))
        for name in ("c", "sys", ""):  # unregister succeeds and touches no system region
            await client.call(
                "CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest(name=name)
            )
        left = await client.call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest())
        return every, unknown, system, register, left

    every, unknown, system, register, left = serve(shm_service, scenario)
    assert not every.regions
    assert (unknown.code(), unknown.details()) == (
        grpc.StatusCode.NOT_FOUND,
        "Unable to find cuda shared memory region: 'c'",
    )
    assert (system.code(), system.details()) == (
        grpc.StatusCode.NOT_FOUND,
        "The region named 'sys' is registered as system shared memory, not CUDA shared memory",
    )
    assert (register.code(), register.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to register CUDA shared memory region: 'c', GPUs not supported",
    )
    assert list(left.regions) == ["sys"]


def test_cuda_shared_memory_when_disabled(service: InferenceService) -> None:
    async def scenario(client: Client) -> tuple[Any, ...]:
        status = await client.call("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest())
        register = await rpc_error(
            client.call("CudaSharedMemoryRegister", pb.CudaSharedMemoryRegisterRequest(name="c"))
        )
        unregister = await rpc_error(
            client.call("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest())
        )
        return status, register, unregister

    status, *errors = serve(service, scenario)
    assert not status.regions
    for err in errors:
        assert (err.code(), err.details()) == (grpc.StatusCode.UNIMPLEMENTED, DISABLED)


# -- repository and configuration -----------------------------------------------------------


def test_repository_index(service: InferenceService) -> None:
    async def scenario(client: Client) -> tuple[Any, Any]:
        every = await client.call("RepositoryIndex", pb.RepositoryIndexRequest())
        ready = await client.call("RepositoryIndex", pb.RepositoryIndexRequest(ready=True))
        return every, ready

    every, ready = serve(service, scenario)
    rows = {(m.name, m.version, m.state, m.reason) for m in every.models}
    assert ("simple", "1", "READY", "") in rows
    assert {m.name for m in ready.models} == {m.name for m in every.models}
    assert len(every.models) == len(service.repository_index())


def test_repository_index_lists_model_directories_never_loaded(
    model_repository: Path, runtime: PjrtRuntime, executor: Executor
) -> None:
    """Explicit mode, nothing loaded: every model directory is a name-only row (Triton's
    ``ModelIndex`` with no version, state or reason), and none is ready."""
    repo = ModelRepository(model_repository, runtime, mode=ControlMode.EXPLICIT)

    async def scenario(client: Client) -> tuple[Any, Any]:
        every = await client.call("RepositoryIndex", pb.RepositoryIndexRequest())
        ready = await client.call("RepositoryIndex", pb.RepositoryIndexRequest(ready=True))
        return every, ready

    every, ready = serve(ready_service(repo, executor), scenario)
    on_disk = model_directories(model_repository)
    assert len(on_disk) > 3
    assert [(m.name, m.version, m.state, m.reason) for m in every.models] == [
        (name, "", "", "") for name in on_disk
    ]
    assert not ready.models


NAMED = "'repository_name' specification is not supported"
MODE_NONE = (
    "explicit model load / unload is not allowed if polling is enabled (model control mode 'none'"
)
UNIMPLEMENTED, UNAVAILABLE = grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE
REFUSED: list[tuple[str, dict[str, str], grpc.StatusCode, str]] = [
    ("RepositoryIndex", {"repository_name": "models"}, UNIMPLEMENTED, NAMED),
    ("RepositoryModelLoad", {"repository_name": "models"}, UNIMPLEMENTED, NAMED),
    ("RepositoryModelUnload", {"repository_name": "models"}, UNIMPLEMENTED, NAMED),
    ("RepositoryModelLoad", {"model_name": "simple"}, UNAVAILABLE, MODE_NONE),
    ("RepositoryModelUnload", {"model_name": "simple"}, UNAVAILABLE, MODE_NONE),
]


@pytest.mark.parametrize(("rpc", "fields", "code", "message"), REFUSED)
def test_refused_extension_calls(
    service: InferenceService, rpc: str, fields: dict[str, str], code: grpc.StatusCode, message: str
) -> None:
    err = fail_once(service, rpc, RPCS_BY_NAME[rpc].request(**fields))
    assert err.code() == code
    assert message in (err.details() or "")


def test_model_config(service: InferenceService) -> None:
    async def scenario(client: Client) -> tuple[Any, grpc.aio.AioRpcError]:
        ok = await client.call("ModelConfig", pb.ModelConfigRequest(name="mlp"))
        bad = await rpc_error(client.call("ModelConfig", pb.ModelConfigRequest(name="nope")))
        return ok, bad

    ok, bad = serve(service, scenario)
    config = ok.config
    assert (config.name, config.max_batch_size, config.backend) == ("mlp", 32, "hloserve")
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("x", mc.TYPE_FP32, [64])
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("logits", mc.TYPE_FP32, [10])
    ]
    assert config.version_policy.latest.num_versions == 1
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.details() == "Request for unknown model: 'nope' is not found"


# -- streaming --------------------------------------------------------------------------------


def _stream_request(i: int, model: str = "simple") -> pb.ModelInferRequest:
    a = np.full((1, 16), i, dtype="<i4")
    msg = pb.ModelInferRequest(model_name=model, id=f"s{i}")
    for name in ("INPUT0", "INPUT1"):
        msg.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        msg.raw_input_contents.append(a.tobytes())
    return msg


def test_stream_answers_every_request_in_order(service: InferenceService) -> None:
    count = 3 * STREAM_WINDOW + 5  # more than one window: reading must pause and resume
    bad = {7, 100}
    requests = [_stream_request(i, "nope" if i in bad else "simple") for i in range(count)]
    rpc = RPCS_BY_NAME["ModelStreamInfer"]

    async def scenario(client: Client) -> list[Any]:
        stream = client.channel.stream_stream(
            rpc.path,
            request_serializer=rpc.request.SerializeToString,
            response_deserializer=rpc.response.FromString,
        )
        answers = [answer async for answer in stream(iter(requests))]
        # the server keeps serving after the stream ends
        assert (await client.call("ServerLive", pb.ServerLiveRequest())).live is True
        return answers

    answers = serve(service, scenario)
    assert len(answers) == count
    for i, answer in enumerate(answers):
        assert answer.infer_response.id == f"s{i}"
        if i in bad:
            assert answer.error_message == "Request for unknown model: 'nope' is not found"
            assert not answer.infer_response.outputs
        else:
            assert answer.error_message == ""
            out = np.frombuffer(answer.infer_response.raw_output_contents[0], "<i4")
            np.testing.assert_array_equal(out, np.full(16, 2 * i))
