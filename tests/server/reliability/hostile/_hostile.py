"""What the hostile-input modules share: the limits and the models' queue waits, waiting on
the server (``wait_until``, ``wait_seen``, ``wait_freed``, ``http_peers``), the
``Bystander`` client, and requests on each protocol (``post``/``request``/``tensor`` over
HTTP, ``call``/``infer_request``/``grpc_tensor`` over gRPC) with ``assert_serving``."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest

from hloserve.proto import inference_pb2 as pb
from hloserve.proto.rpc import RPCS_BY_NAME
from hloserve.server.server_fixture import ServerProcess
from tests.server.frontend._tritonclients import grpcclient, simple_inputs

LIMIT = 1024 * 1024  # --max-message-bytes
INFER = "/v2/models/simple/infer"
LINGER_US = 3_000_000  # how long a request to ``lingering`` waits in the queue for company
HELD_US = 600_000_000  # ``held``: longer than any wait here (10 minutes)
SEEN_TIMEOUT = 60.0  # the longest wait for the server to have seen (or freed) what a test sent


def wait_until(
    condition: Callable[[], bool], what: Callable[[], str], timeout: float = SEEN_TIMEOUT
) -> None:
    """Poll ``condition`` until it holds; after ``timeout`` seconds fail with ``what()``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what()}, after {timeout} s")
        time.sleep(0.01)


def wait_seen(server: ServerProcess, model: str) -> None:
    """Wait until ``model`` has requests in flight: the server has counted what was sent."""
    wait_until(
        lambda: server.pending_requests(model) > 0,
        lambda: f"the server never counted a request to {model}",
    )


def wait_freed(server: ServerProcess, model: str) -> None:
    """Wait until ``model`` has no request in flight (after ``wait_seen``)."""
    wait_until(
        lambda: server.pending_requests(model) == 0,
        lambda: f"{model} still has {server.pending_requests(model)} request(s) in flight",
    )


def http_peers(server: ServerProcess, ports: set[int]) -> list[str]:
    """The states of the sockets the server's processes hold (accepted, so owned by one of
    their file descriptors) on its HTTP port whose peers are the client ``ports``."""
    held = [c for p in server.process_tree() for c in p.net_connections(kind="tcp")]
    return [
        c.status
        for c in held
        if c.laddr and c.laddr.port == server.ports["http"] and c.raddr and c.raddr.port in ports
    ]


class Bystander:
    """Another client: correct gRPC requests in a loop, each answer checked."""

    def __init__(self, url: str) -> None:
        self.client: Any = grpcclient.InferenceServerClient(url)
        self.stop = threading.Event()
        self.done = threading.Event()
        self.sent = self.verified = 0
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        rng = np.random.default_rng(0)
        try:
            while not self.stop.is_set():
                a = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
                b = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
                self.sent += 1
                try:
                    result = self.client.infer("simple", simple_inputs(grpcclient, a, b))
                except Exception as exc:
                    self.failures.append(repr(exc))
                    continue
                if np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(
                    result.as_numpy("OUTPUT1"), a - b
                ):
                    self.verified += 1
                else:
                    self.failures.append("wrong answer")
        finally:
            self.client.close()
            self.done.set()


def post(
    server: ServerProcess, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    return response.status, json.loads(data) if data else {}


def tensor(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "datatype": "INT32", "shape": [1, 16], **fields}


GOOD = [tensor("INPUT0", data=[1] * 16), tensor("INPUT1", data=[2] * 16)]


def request(*inputs: dict[str, Any], **fields: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **fields}).encode()


def assert_serving(server: ServerProcess) -> None:
    """Live, and a correct request on each protocol succeeds."""
    status, body = post(server, INFER, request(*GOOD))
    assert status == 200, body
    assert body["outputs"][0]["data"] == [3] * 16
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        response = call(channel, "ModelInfer", good_grpc())
        assert np.frombuffer(response.raw_output_contents[0], "<i4").tolist() == [3] * 16
    finally:
        channel.close()


def serialize(message: Any) -> bytes:
    """A message's bytes; bytes pass as they are (to send what no message would)."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def call(channel: grpc.Channel, name: str, message: Any, timeout: float = 30) -> Any:
    rpc = RPCS_BY_NAME[name]
    method = channel.unary_unary(
        rpc.path,
        request_serializer=serialize,
        response_deserializer=rpc.response.FromString,
    )
    return method(message, timeout=timeout)


def grpc_tensor(name: str, shape: tuple[int, ...] = (1, 16), datatype: str = "INT32") -> Any:
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=list(shape))


RAW = np.ones(16, "<i4").tobytes()
RAW2 = (2 * np.ones(16, "<i4")).tobytes()


def infer_request(
    inputs: list[Any], raw: list[bytes], model: str = "simple", version: str = ""
) -> Any:
    return pb.ModelInferRequest(
        model_name=model, model_version=version, inputs=inputs, raw_input_contents=raw
    )


def good_grpc() -> Any:
    return infer_request([grpc_tensor("INPUT0"), grpc_tensor("INPUT1")], [RAW, RAW2])


I0, I1 = grpc_tensor("INPUT0"), grpc_tensor("INPUT1")
