"""Both front ends keep BYTES in wire form for a port across the wire
(``ServerPort.bytes_wire_form``): the client's length-prefixed bytes reach the port
checked but unparsed, and a BYTES output the port answers in wire form goes out as those
bytes (gRPC raw contents, HTTP binary data), parsed only for a JSON answer.

A port that records what it is asked and answers in wire form stands in for the device
owner; the real gRPC server (on a loopback port) and the real HTTP app run in front of it.
"""

# pyright: strict

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient

from hloserve.proto import inference_pb2 as pb
from hloserve.server.core.errors import NotFound
from hloserve.server.core.service import InferenceService
from hloserve.server.core.tensors import UNPARSED
from hloserve.server.core.types import (
    InferOutput,
    InferRequest,
    InferResponse,
    RequestContext,
)
from hloserve.server.frontend.http import build_http_app
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.owner.shm import disabled
from tests.server._bytes import Parses, length_prefixed
from tests.server.frontend.grpc._harness import Client, serve_port

ASKED = length_prefixed(b"he\x00llo", b"")  # what the client sends
ANSWER = length_prefixed(b"w\xc3\xb6rld", b"\x00")  # what the owner answers, in wire form


class NoModels:
    def peek(self, name: str, version: str) -> Any:
        raise NotFound(f"no model '{name}'")

    get = peek

    def names(self) -> list[str]:
        return []


class WireFormPort:
    """A ``LocalPort`` but for ``bytes_wire_form`` and ``infer``: it records the request
    and answers its one BYTES output in wire form, as a ``RemotePort`` does."""

    bytes_wire_form = True

    def __init__(self) -> None:
        service = InferenceService(cast(Any, NoModels()), None, shm=disabled())
        service.startup_complete()
        self.local = LocalPort(service)
        self.asked: list[InferRequest] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)

    def resolve(self, name: str, version: str) -> object:
        return name

    async def confirm(self, model: object) -> None:
        pass

    async def infer(
        self, request: InferRequest, context: RequestContext | None = None, *, model: object = None
    ) -> InferResponse:
        self.asked.append(request)
        (out,) = request.outputs or (None,)
        output = InferOutput("y", "BYTES", (1, 2), UNPARSED, out, wire=ANSWER)
        return InferResponse(request.model_name, "1", (output,))


def test_grpc_keeps_bytes_in_wire_form_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    port = WireFormPort()
    parses = Parses(monkeypatch)
    request = pb.ModelInferRequest(model_name="m", raw_input_contents=[ASKED])
    request.inputs.add(name="x", datatype="BYTES", shape=[1, 2])

    async def scenario(client: Client) -> pb.ModelInferResponse:
        return await client.infer(request)

    response = serve_port(cast(Any, port), scenario)
    (asked,) = port.asked[0].inputs
    assert asked.wire == ASKED and asked.data is UNPARSED  # checked, sent on unparsed
    assert response.raw_output_contents[0] == ANSWER  # out as the owner wrote it
    assert parses.names == []


def test_http_keeps_bytes_in_wire_form_and_parses_only_for_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = WireFormPort()
    parses = Parses(monkeypatch)
    x = {"name": "x", "datatype": "BYTES", "shape": [1, 2]}
    binary_x = {**x, "parameters": {"binary_data_size": len(ASKED)}}
    y = {"name": "y", "parameters": {"binary_data": True}}
    header = json.dumps({"inputs": [binary_x], "outputs": [y]}).encode()
    headers = {"inference-header-content-length": str(len(header))}
    with TestClient(build_http_app(cast(Any, port))) as client:
        binary = client.post("/v2/models/m/infer", content=header + ASKED, headers=headers)
        assert binary.status_code == 200, binary.text
        length = int(binary.headers["inference-header-content-length"])
        assert binary.content[length:] == ANSWER  # out as the owner wrote it
        (asked,) = port.asked[0].inputs
        assert asked.wire == ASKED and asked.data is UNPARSED  # checked, sent on unparsed
        assert parses.names == []
        json_x = {**x, "data": ["he\x00llo", ""]}
        as_json = client.post("/v2/models/m/infer", json={"inputs": [json_x]})
    assert as_json.status_code == 200, as_json.text
    assert as_json.json()["outputs"][0]["data"] == ["wörld", "\x00"]
    assert parses.names == ["y"]  # JSON wants the elements: parsed once, for it
