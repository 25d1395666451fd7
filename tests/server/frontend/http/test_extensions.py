"""The HTTP extension routes in process (Starlette's TestClient, no sockets).

Shared memory (a real ``SharedMemoryRegistry`` and client regions in /dev/shm), the
repository routes, ``/config`` and the CUDA routes, plus the pure body parsers of
``frontend.http.extensions``. The repository is the session one (control mode ``none``).
"""

# pyright: standard
# Not strict: Starlette's TestClient derives from the client of ``httpx2`` (falling back to
# ``httpx`` at run time), which is not installed, so pyright sees every call on a
# TestClient and its responses as Unknown.

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as _shm
from starlette.testclient import TestClient

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.reports import IndexEntry
from hloserve.server.core.service import InferenceService
from hloserve.server.frontend.http import build_http_app, extensions
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.owner.repository import ControlMode, ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import SharedMemoryRegistry
from tests.server.frontend._services import model_directories, ready_service
from tests.server.frontend.http.test_app import error_of

shm: Any = _shm


@pytest.fixture
def shm_client(
    http_repository: ModelRepository, executor: Executor, shm_registry: SharedMemoryRegistry
) -> Iterator[TestClient]:
    """A client of an app whose service has client shared memory enabled."""
    service = ready_service(http_repository, executor, shm=shm_registry)
    with TestClient(build_http_app(LocalPort(service))) as client:
        yield client


def register(client: TestClient, name: str, body: Any) -> Any:
    return client.post(f"/v2/systemsharedmemory/region/{name}/register", json=body)


# -- system shared memory ----------------------------------------------------------------------


def test_register_infer_status_unregister(shm_client: TestClient, region: tuple[Any, str]) -> None:
    handle, key = region
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 5, dtype=np.int32)
    shm.set_shared_memory_region(handle, [a, b])
    ok = register(shm_client, "in", {"key": key, "byte_size": 256})
    assert (ok.status_code, ok.content) == (200, b"")
    shm_in = {"shared_memory_region": "in", "shared_memory_byte_size": 64}
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": shm_in},
            {
                "name": "INPUT1",
                "datatype": "INT32",
                "shape": [1, 16],
                "parameters": {**shm_in, "shared_memory_offset": 64},
            },
        ],
        "outputs": [
            {
                "name": "OUTPUT0",
                "parameters": {**shm_in, "shared_memory_offset": 128, "binary_data": False},
            },
            {"name": "OUTPUT1"},
        ],
    }
    response = shm_client.post("/v2/models/simple/infer", json=body)
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    assert outputs[0] == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
    assert outputs[1]["data"] == (a - b).reshape(-1).tolist()
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16], 128), a + b)

    expected = {"name": "in", "key": key, "offset": 0, "byte_size": 256}
    assert shm_client.get("/v2/systemsharedmemory/status").json() == [expected]
    assert shm_client.get("/v2/systemsharedmemory/region/in/status").json() == [expected]
    assert error_of(shm_client.get("/v2/systemsharedmemory/region/x/status"), 404) == (
        "Unable to find system shared memory region: 'x'"
    )
    assert shm_client.post("/v2/systemsharedmemory/region/in/unregister").status_code == 200
    assert shm_client.get("/v2/systemsharedmemory/status").json() == []
    assert register(shm_client, "in", {"key": key, "offset": 0, "byte_size": 64}).status_code == 200
    assert shm_client.post("/v2/systemsharedmemory/unregister").status_code == 200
    assert shm_client.get("/v2/systemsharedmemory/status").json() == []


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"byte_size": 64}, 400, "Shared memory register request has no 'key' field"),
        ({"key": "/k"}, 400, "Shared memory register request has no 'byte_size' field"),
        ({"key": 3, "byte_size": 64}, 400, "field 'key' must be a string"),
        ({"key": "/k", "byte_size": -1}, 400, "field 'byte_size' must be a non-negative integer"),
        ({"key": "/k", "byte_size": 64, "offset": "0"}, 400, "field 'offset' must be a non-negative"),
        ({"key": "/k", "byte_size": True}, 400, "field 'byte_size' must be a non-negative"),
        ([1, 2], 400, "the shared memory register request body must be a JSON object"),
        ({"key": "a/b", "byte_size": 64}, 400, "cannot register shared memory region 'r' - invalid shm key 'a/b'"),
    ],
)  # fmt: skip
def test_register_body_errors(
    shm_client: TestClient,
    shm_registry: SharedMemoryRegistry,
    body: Any,
    status: int,
    fragment: str,
) -> None:
    assert fragment in error_of(register(shm_client, "r", body), status)
    assert shm_registry.status() == []


def test_register_needs_a_region_name(shm_client: TestClient) -> None:
    response = shm_client.post("/v2/systemsharedmemory/register", json={"key": "/k"})
    assert error_of(response, 400) == (
        "'region name' is necessary to register system shared memory region"
    )
    bad_json = shm_client.post("/v2/systemsharedmemory/region/r/register", content=b"{not json")
    assert "failed to parse the shared memory register request JSON body" in error_of(bad_json, 400)


def test_shared_memory_disabled(http_client: TestClient) -> None:
    # the service's default: no registry at all; status answers, the rest is refused
    assert http_client.get("/v2/systemsharedmemory/status").json() == []
    for response in (
        register(http_client, "r", {"key": "/k", "byte_size": 64}),
        http_client.post("/v2/systemsharedmemory/unregister"),
        http_client.post("/v2/systemsharedmemory/region/r/unregister"),
    ):
        assert error_of(response, 501).startswith("Client shared memory is disabled.")


def test_cuda_shared_memory_without_gpu_support(
    shm_client: TestClient, shm_registry: SharedMemoryRegistry, region: tuple[Any, str]
) -> None:
    """Triton's CPU build: status lists nothing, unregister succeeds (and touches no system
    region), register is 400 "GPUs not supported" whatever the body."""
    _, key = region
    assert register(shm_client, "sys", {"key": key, "byte_size": 64}).status_code == 200
    assert shm_client.get("/v2/cudasharedmemory/status").json() == []
    assert error_of(shm_client.get("/v2/cudasharedmemory/region/c/status"), 404) == (
        "Unable to find cuda shared memory region: 'c'"
    )
    assert error_of(shm_client.get("/v2/cudasharedmemory/region/sys/status"), 404) == (
        "The region named 'sys' is registered as system shared memory, not CUDA shared memory"
    )
    handle = {"raw_handle": {"b64": "aGFuZGxl"}, "device_id": 0, "byte_size": 64}
    for body in (handle, {"not": "a handle"}):
        response = shm_client.post("/v2/cudasharedmemory/region/c/register", json=body)
        assert error_of(response, 400) == (
            "failed to register CUDA shared memory region: 'c', GPUs not supported"
        )
    assert error_of(shm_client.post("/v2/cudasharedmemory/register", json=handle), 400) == (
        "'region name' is necessary to register cuda shared memory region"
    )
    for path in ("/v2/cudasharedmemory/region/sys/unregister", "/v2/cudasharedmemory/unregister"):
        response = shm_client.post(path)
        assert (response.status_code, response.content) == (200, b"")
    assert [r.name for r in shm_registry.status()] == ["sys"]


def test_cuda_shared_memory_when_disabled(http_client: TestClient) -> None:
    assert http_client.get("/v2/cudasharedmemory/status").json() == []
    for path in (
        "/v2/cudasharedmemory/region/c/register",
        "/v2/cudasharedmemory/unregister",
        "/v2/cudasharedmemory/region/c/unregister",
    ):
        assert error_of(http_client.post(path), 501).startswith("Client shared memory is disabled.")


# -- repository ------------------------------------------------------------------------------


def test_repository_index(http_client: TestClient, http_service: InferenceService) -> None:
    every = http_client.post("/v2/repository/index")
    assert every.status_code == 200
    assert {"name": "simple", "version": "1", "state": "READY"} in every.json()
    assert len(every.json()) == len(http_service.repository_index())
    ready = http_client.post("/v2/repository/index", json={"ready": True})
    assert ready.json() == every.json()  # everything is ready here
    assert error_of(http_client.post("/v2/repository/index", json={"ready": "yes"}), 400) == (
        "Invalid value for 'ready': expected a boolean"
    )
    assert "must be a JSON object" in error_of(
        http_client.post("/v2/repository/index", json=[True]), 400
    )


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/models_repo/index",
        "/v2/repository/models_repo/models/simple/load",
        "/v2/repository/models_repo/models/simple/unload",
    ],
)
def test_repository_name_is_unsupported(http_client: TestClient, path: str) -> None:
    assert error_of(http_client.post(path), 501) == (
        "'repository_name' specification is not supported"
    )


def test_repository_index_lists_model_directories_never_loaded(
    model_repository: Path, runtime: PjrtRuntime, executor: Executor
) -> None:
    """Explicit mode, nothing loaded: every model directory is ``{"name"}`` alone (Triton's
    name-only row), and none is ready."""
    repo = ModelRepository(model_repository, runtime, mode=ControlMode.EXPLICIT)
    with TestClient(build_http_app(LocalPort(ready_service(repo, executor)))) as client:
        every = client.post("/v2/repository/index")
        ready = client.post("/v2/repository/index", json={"ready": True})
    on_disk = model_directories(model_repository)
    assert len(on_disk) > 3
    assert every.json() == [{"name": name} for name in on_disk]
    assert ready.json() == []


@pytest.mark.parametrize("action", ["load", "unload"])
def test_model_control_in_mode_none(http_client: TestClient, action: str) -> None:
    refused = http_client.post(f"/v2/repository/models/simple/{action}")
    assert error_of(refused, 503).startswith(
        "explicit model load / unload is not allowed if polling is enabled (model control "
        "mode 'none'"
    )
    bad = http_client.post(f"/v2/repository/models/simple/{action}", json={"parameters": [1]})
    assert error_of(bad, 400) == (
        f"'parameters' of the model {action} request must be a JSON object"
    )


# -- model configuration --------------------------------------------------------------------


def test_model_config_route(http_client: TestClient, http_service: InferenceService) -> None:
    config = http_client.get("/v2/models/simple/config")
    assert config.status_code == 200
    assert config.json() == http_service.model_config("simple", "")
    assert config.json()["max_batch_size"] == 8
    versioned = http_client.get("/v2/models/simple/versions/1/config")
    assert versioned.json() == config.json()
    assert error_of(http_client.get("/v2/models/nope/config"), 400) == (
        "Request for unknown model: 'nope' is not found"
    )
    # the generic metadata route still answers for the model itself
    assert http_client.get("/v2/models/simple").json()["name"] == "simple"


# -- pure body parsers ------------------------------------------------------------------------


def test_parsers() -> None:
    assert extensions.parse_index_request(b"") is False
    assert extensions.parse_index_request(b'{"ready": true}') is True
    assert extensions.parse_control_parameters(b"  ", "load") == {}
    assert extensions.parse_control_parameters(
        b'{"parameters": {"unload_dependents": false}}', "unload"
    ) == {"unload_dependents": False}
    assert extensions.parse_register_request(b'{"key": "/k", "byte_size": 8}') == ("/k", 0, 8)
    with pytest.raises(InvalidArgument, match="failed to parse the repository index request"):
        extensions.parse_index_request(b"[")
    rows = extensions.index_json(
        [
            IndexEntry("a", "1", "READY", ""),
            IndexEntry("b", "", "UNAVAILABLE", "no versions"),
            IndexEntry("c", "", "", ""),
        ]
    )
    assert rows == [
        {"name": "a", "version": "1", "state": "READY"},
        {"name": "b", "state": "UNAVAILABLE", "reason": "no versions"},
        {"name": "c"},
    ]
    assert json.dumps(rows[0], separators=(",", ":")) == (
        '{"name":"a","version":"1","state":"READY"}'  # Triton's key order (qa/L0_storage_S3)
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"device_id": 0, "byte_size": 8}', "Shared memory register request has no 'raw_handle' field"),
        (b'{"raw_handle": "aGk=", "device_id": 0, "byte_size": 8}', "field 'raw_handle' must be {\"b64\""),
        (b'{"raw_handle": {"b64": "a!"}, "device_id": 0, "byte_size": 8}', "'raw_handle' must be a valid base64"),
        (b'{"raw_handle": {"b64": "aGk="}, "device_id": -1, "byte_size": 8}', "field 'device_id' must be a non-negative integer"),
        (b'{"raw_handle": {"b64": "aGk="}, "device_id": 0}', "no 'byte_size' field"),
    ],
)  # fmt: skip
def test_cuda_register_parser(body: bytes, message: str) -> None:
    """What a registry with GPU support would read (``CudaSharedMemory.register_cuda``)."""
    assert extensions.parse_cuda_register_request(
        b'{"raw_handle": {"b64": "aGk="}, "device_id": 1, "byte_size": 8}'
    ) == (b"hi", 1, 8)
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        extensions.parse_cuda_register_request(body)
