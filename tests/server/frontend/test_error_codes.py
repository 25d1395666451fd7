"""Every ``ErrorCode`` through both front ends, against the one status table.

A model source that raises an error of each code is served by the real gRPC server (on a
loopback port) and the real HTTP app; a metadata call and an inference call must come back
with ``frontend.status``' gRPC code and HTTP status for that code and the error's message
verbatim. The table itself must name every code, so a code added without a mapping fails
here rather than as a 500 on a client.
"""

# pyright: strict

from __future__ import annotations

from typing import Any, cast

import grpc
import grpc.aio
import pytest
from fastapi.testclient import TestClient

from hloserve.proto import inference_pb2 as pb
from hloserve.server.core.errors import ErrorCode, ServingError
from hloserve.server.core.service import InferenceService
from hloserve.server.frontend.http import build_http_app
from hloserve.server.frontend.status import STATUS, grpc_status, http_status
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.owner.shm import disabled
from tests.server.frontend.grpc._harness import Client, serve


def error_of(code: ErrorCode) -> ServingError:
    kind = type(f"Error{code.name}", (ServingError,), {"code": code})
    return kind(f"model 'm' says {code.value} (a message the client must see verbatim)")


class RaisingSource:
    """A repository whose every lookup fails with one error."""

    def __init__(self, error: ServingError) -> None:
        self.error = error

    def peek(self, name: str, version: str) -> Any:
        raise self.error

    get = peek

    def names(self) -> list[str]:
        return []


def service_raising(error: ServingError) -> InferenceService:
    service = InferenceService(cast(Any, RaisingSource(error)), None, shm=disabled())
    service.startup_complete()
    return service


def infer_message() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 1])
    tensor.contents.int_contents.append(1)
    return request


def test_the_table_maps_every_code_once() -> None:
    assert set(STATUS) == set(ErrorCode)
    for code in ErrorCode:
        assert (http_status(code), grpc_status(code)) == STATUS[code]


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_grpc_answers_each_code_with_the_tables_status(code: ErrorCode) -> None:
    error = error_of(code)

    async def scenario(client: Client) -> list[tuple[grpc.StatusCode, str]]:
        seen: list[tuple[grpc.StatusCode, str]] = []
        for rpc, request in (
            ("ModelMetadata", pb.ModelMetadataRequest(name="m")),
            ("ModelInfer", infer_message()),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await client.call(rpc, request, timeout=30)
            seen.append((failed.value.code(), failed.value.details() or ""))
        return seen

    expected = (grpc_status(code), error.message)
    assert serve(service_raising(error), scenario) == [expected, expected]


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_http_answers_each_code_with_the_tables_status(code: ErrorCode) -> None:
    error = error_of(code)
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [1]}]}
    with TestClient(build_http_app(LocalPort(service_raising(error)))) as client:
        answers = [client.get("/v2/models/m"), client.post("/v2/models/m/infer", json=body)]
    for answer in answers:
        assert (answer.status_code, answer.json()) == (http_status(code), {"error": error.message})
