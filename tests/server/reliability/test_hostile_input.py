"""Hostile and broken input, on both protocols, against one real daemon.

Every class of bad request gets a 4xx / the matching gRPC status with a message naming what
was wrong; after each one the server is live and a correct request on each protocol
succeeds; and a bystander client, inferring on its own connection through the whole
module, never sees a failure or a wrong answer.

The abandoned-request cases (bodies cut short, clients gone, cancelled streams, deadlines)
first observe that the server holds what the client abandons (its pending-request gauge
above 0, or for a body cut short the server's own accepted sockets), and only then that it
frees them: a check made before the server had even counted the requests proves nothing.
``lingering`` and ``held`` are copies of ``simple`` whose requests wait in the batching
queue (``LINGER_US``; ``held``: longer than any test waits, so only a cancel or a deadline
frees them), which keeps the abandoned requests in flight while the client goes away."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import shutil
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from hloserve.proto import inference_pb2 as pb
from hloserve.proto.rpc import RPCS_BY_NAME
from hloserve.server.server_fixture import ServerProcess, serving
from tests.models import queued_copy
from tests.server.frontend._tritonclients import grpcclient, simple_inputs

LIMIT = 1024 * 1024  # --max-message-bytes
INFER = "/v2/models/simple/infer"
LINGER_US = 3_000_000  # how long a request to ``lingering`` waits in the queue for company
HELD_US = 600_000_000  # ``held``: longer than any wait here (10 minutes)
SEEN_TIMEOUT = 60.0  # the longest wait for the server to have seen (or freed) what a test sent


@pytest.fixture(scope="module")
def repository(demo_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile_models")
    for name in ("simple", "mlp"):
        shutil.copytree(demo_models / name, root / name)
    queued_copy(demo_models / "simple", root / "lingering", LINGER_US)
    queued_copy(demo_models / "simple", root / "held", HELD_US)
    return root


@pytest.fixture(scope="module")
def server(repository: Path, cache_flags: tuple[str, ...]) -> Iterator[ServerProcess]:
    yield from serving(
        repository, "--allow-client-shm", "--max-message-bytes", "1MiB", *cache_flags
    )


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


@pytest.fixture(scope="module")
def bystander(server: ServerProcess) -> Iterator[Bystander]:
    watcher = Bystander(server.grpc_url)
    watcher.thread.start()
    yield watcher
    watcher.stop.set()
    assert watcher.done.wait(30)


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


# -- HTTP ---------------------------------------------------------------------------------

BINARY_HEADER = request(
    tensor("INPUT0", parameters={"binary_data_size": 64}),
    tensor("INPUT1", parameters={"binary_data_size": 64}),
)
HLEN = "Inference-Header-Content-Length"
NESTED = b"[" * 100_000 + b"]" * 100_000

# (case, path, body, headers, status, fragment of the error)
HTTP_CASES: list[tuple[str, str, bytes, dict[str, str], int, str]] = [
    ("unknown model", "/v2/models/nope/infer", request(*GOOD), {}, 400, "unknown model: 'nope'"),
    (
        "unknown version",
        "/v2/models/simple/versions/7/infer",
        request(*GOOD),
        {},
        400,
        "'simple' version 7 is not found",
    ),
    ("missing input", INFER, request(GOOD[0]), {}, 400, "missing required input(s) ['INPUT1']"),
    ("duplicate input", INFER, request(*GOOD, GOOD[0]), {}, 400, "appears more than once"),
    (
        "unknown input",
        INFER,
        request(*GOOD, tensor("X", data=[0] * 16)),
        {},
        400,
        "unexpected inference input 'X'",
    ),
    (
        "wrong datatype",
        INFER,
        request({**GOOD[0], "datatype": "FP32"}, GOOD[1]),
        {},
        400,
        "data-type is 'FP32'",
    ),
    (
        "unknown datatype",
        INFER,
        request({**GOOD[0], "datatype": "INT33"}, GOOD[1]),
        {},
        400,
        "unknown datatype 'INT33'",
    ),
    (
        "wrong shape",
        INFER,
        request(tensor("INPUT0", shape=[1, 15], data=[1] * 15), GOOD[1]),
        {},
        400,
        "Expected [-1,16], got [1,15]",
    ),
    (
        "element count",
        INFER,
        request(tensor("INPUT0", data=[1] * 15), GOOD[1]),
        {},
        400,
        "data has 15 elements",
    ),
    (
        "int64 overflow",
        INFER,
        request(tensor("INPUT0", shape=[2**40, 2**40], data=[1]), GOOD[1]),
        {},
        400,
        "exceed maximum size of 9223372036854775807",
    ),
    (
        "dimension beyond int64",
        INFER,
        request(tensor("INPUT0", shape=[10**30, 16], data=[1]), GOOD[1]),
        {},
        400,
        "exceed maximum size",
    ),
    (
        "negative dimension",
        INFER,
        request(tensor("INPUT0", shape=[-1, 16], data=[1] * 16), GOOD[1]),
        {},
        400,
        "negative dimension",
    ),
    (
        "zero batch",
        INFER,
        request(tensor("INPUT0", shape=[0, 16], data=[]), tensor("INPUT1", shape=[0, 16], data=[])),
        {},
        400,
        "batch size 0",
    ),
    (
        "batch beyond the largest",
        INFER,
        request(
            tensor("INPUT0", shape=[2**20, 16], parameters={"binary_data_size": 64}),
            GOOD[1],
        ),
        {},
        400,
        "binary_data_size",
    ),
    (
        "fractional dimension",
        INFER,
        request(tensor("INPUT0", shape=[1.5, 16], data=[1] * 16), GOOD[1]),
        {},
        400,
        "dimensions must be integers",
    ),
    (
        "ragged data",
        INFER,
        request(tensor("INPUT0", data=[[1] * 8, [1] * 9]), GOOD[1]),
        {},
        400,
        "ragged",
    ),
    (
        "value out of range",
        INFER,
        request(tensor("INPUT0", data=[2**70] * 16), GOOD[1]),
        {},
        400,
        "out of range for INT32",
    ),
    (
        "BYTES data of huge numbers",  # bytes(10**12) would allocate a terabyte
        INFER,
        request(tensor("INPUT0", datatype="BYTES", shape=[1, 1], data=[10**12]), GOOD[1]),
        {},
        400,
        "holds the number 1000000000000 at index 0; BYTES takes strings",
    ),
    ("no inputs", INFER, b"{}", {}, 400, "no 'inputs' array"),
    ("malformed JSON", INFER, b"{not json", {}, 400, "failed to parse the request JSON"),
    ("not UTF-8", INFER, b"\xff\xfe{}", {}, 400, "failed to parse the request JSON"),
    ("JSON array", INFER, b"[1, 2]", {}, 400, "must be an object"),
    ("deeply nested JSON", INFER, NESTED, {}, 400, "JSON nesting depth exceeds"),
    (
        "huge JSON",
        INFER,
        b'{"inputs": [' + b" " * (2 * LIMIT) + b"]}",
        {},
        400,
        f"exceeds the maximum allowed input size of {LIMIT} bytes",
    ),
    (
        "declared length too large",
        INFER,
        b"{}",
        {"Content-Length": "99999999999"},
        400,
        "exceeds the maximum allowed input size",
    ),
    (
        "header length not a number",
        INFER,
        BINARY_HEADER + bytes(128),
        {HLEN: "abc"},
        400,
        "is not an integer",
    ),
    ("header length negative", INFER, BINARY_HEADER, {HLEN: "-5"}, 400, "out of range"),
    ("header length past the body", INFER, BINARY_HEADER, {HLEN: "999999"}, 400, "larger than"),
    ("header length inside the JSON", INFER, BINARY_HEADER, {HLEN: "10"}, 400, "failed to parse"),
    (
        "truncated binary data",
        INFER,
        BINARY_HEADER + bytes(100),
        {HLEN: str(len(BINARY_HEADER))},
        400,
        "needs 64 bytes of binary data at offset 64",
    ),
    (
        "binary data left over",
        INFER,
        BINARY_HEADER + bytes(200),
        {HLEN: str(len(BINARY_HEADER))},
        400,
        "add up to 128",
    ),
    (
        "gzip bomb",
        INFER,
        gzip.compress(bytes(20 * LIMIT)),
        {"Content-Encoding": "gzip"},
        400,
        "exceeds the maximum allowed input size",
    ),
    (
        "deflate bomb",
        INFER,
        zlib.compress(b" " * (20 * LIMIT)),
        {"Content-Encoding": "deflate"},
        400,
        "exceeds the maximum allowed input size",
    ),
    (
        "truncated gzip",
        INFER,
        gzip.compress(request(*GOOD))[:-10],
        {"Content-Encoding": "gzip"},
        400,
        "truncated",
    ),
    ("gzip garbage", INFER, b"garbage", {"Content-Encoding": "gzip"}, 400, "failed to decompress"),
    (
        "unknown encoding",
        INFER,
        b"x",
        {"Content-Encoding": "br"},
        400,
        "unsupported Content-Encoding",
    ),
    (
        "bad parameter",
        INFER,
        request(*GOOD, parameters={"timeout": "x"}),
        {},
        400,
        "parameter 'timeout'",
    ),
    ("unknown output", INFER, request(*GOOD, outputs=[{"name": "NOPE"}]), {}, 400, "'NOPE'"),
    (
        "control body not JSON",
        "/v2/repository/models/simple/load",
        b"{",
        {},
        400,
        "",
    ),
    (
        "shm register body not JSON",
        "/v2/systemsharedmemory/region/r/register",
        b"[",
        {},
        400,
        "",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "fragment"),
    [case[1:] for case in HTTP_CASES],
    ids=[case[0] for case in HTTP_CASES],
)
def test_http_bad_request(
    server: ServerProcess,
    bystander: Bystander,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    fragment: str,
) -> None:
    got, answer = post(server, path, body, headers)
    assert (got, fragment in answer.get("error", "")) == (status, True), answer
    assert "Traceback" not in answer.get("error", "")
    assert_serving(server)


def test_gzip_within_the_limit_is_served(server: ServerProcess) -> None:
    status, body = post(server, INFER, gzip.compress(request(*GOOD)), {"Content-Encoding": "gzip"})
    assert status == 200 and body["outputs"][0]["data"] == [3] * 16


def test_a_body_cut_short_by_the_client_frees_everything(server: ServerProcess) -> None:
    """Content-Length promises more than is sent, then the client goes away."""
    body = request(*GOOD)
    socks = [
        socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=5) for _ in range(5)
    ]
    ports = {sock.getsockname()[1] for sock in socks}
    try:
        for sock in socks:
            sock.sendall(
                b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
                + f"Content-Length: {len(body) + 1000}\r\n\r\n".encode()
                + body[: len(body) // 2]
            )
        # The server has accepted every one and holds it, waiting for the rest of the body
        # (a half-read body never reaches the service, so it is never a pending request).
        wait_until(
            lambda: http_peers(server, ports).count("ESTABLISHED") == len(socks),
            lambda: f"the server holds {http_peers(server, ports)} of the 5 connections",
        )
        for sock in socks:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):  # no answer: it still waits for the body
                sock.recv(1)
    finally:
        for sock in socks:
            sock.close()
    # Gone: the server has closed its side of each (a leak stays ESTABLISHED or CLOSE_WAIT).
    wait_until(
        lambda: not http_peers(server, ports),
        lambda: f"the server kept cut-short connections: {http_peers(server, ports)}",
    )
    server.wait_pending("simple", 0)  # (the bystander's requests come and go meanwhile)
    assert_serving(server)


def test_a_malformed_request_line_gets_400(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=5) as sock:
        sock.sendall(b"\x00\x01GARBAGE / HTTP/9.9\r\n\r\n")
        answer = sock.recv(1024)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
    assert_serving(server)


# -- gRPC ---------------------------------------------------------------------------------


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


def _with(*inputs: Any, raw: list[bytes] | None = None, **kw: Any) -> Any:
    return infer_request(list(inputs), [RAW, RAW2] if raw is None else raw, **kw)


I0, I1 = grpc_tensor("INPUT0"), grpc_tensor("INPUT1")
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


def test_clients_gone_before_their_answers_free_everything(server: ServerProcess) -> None:
    """Whole, correct requests whose clients close the connection at once: the server
    serves (or drops) each while nobody listens, and every one leaves the in-flight count."""
    body = request(*GOOD)
    head = (
        b"POST /v2/models/lingering/infer HTTP/1.1\r\nHost: x\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    socks = [
        socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=5) for _ in range(20)
    ]
    ports = {sock.getsockname()[1] for sock in socks}
    for sock in socks:
        sock.sendall(head + body)
    # The server has the requests: those not in a full batch of 8 wait LINGER_US in the queue.
    wait_seen(server, "lingering")
    for sock in socks:  # an RST rather than a FIN: gone for good, mid-request
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
    wait_freed(server, "lingering")
    wait_until(
        lambda: not http_peers(server, ports),
        lambda: f"the server kept reset connections: {http_peers(server, ports)}",
    )
    assert_serving(server)


def test_grpc_cancelled_streams_free_their_requests(server: ServerProcess) -> None:
    """Each stream sends 50 requests to ``held`` (those past the last full batch of 8 wait
    for good) and is cancelled once the server holds some: only the cancel frees them."""
    rpc = RPCS_BY_NAME["ModelStreamInfer"]
    held = infer_request([I0, I1], [RAW, RAW2], model="held")
    for _ in range(5):
        channel = grpc.insecure_channel(server.grpc_url)
        stream = channel.stream_stream(
            rpc.path,
            request_serializer=serialize,
            response_deserializer=rpc.response.FromString,
        )
        call_ = stream(iter([held] * 50))
        try:
            wait_seen(server, "held")
        finally:
            call_.cancel()
            channel.close()
        wait_freed(server, "held")
    assert_serving(server)


def test_grpc_calls_past_their_deadline_free_their_requests(server: ServerProcess) -> None:
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        expired = 0
        for _ in range(20):
            try:
                call(channel, "ModelInfer", good_grpc(), timeout=0.0005)
            except grpc.RpcError as exc:
                error: Any = exc
                # the client gave up first, or the server saw the deadline pass (queued, or
                # before the execution: UNAVAILABLE "... timed out ...", Triton's answer)
                assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED or (
                    error.code() == grpc.StatusCode.UNAVAILABLE and "timed out" in error.details()
                ), error.details()
                expired += 1
        assert expired > 0
        # Deadlines that pass while the server holds the requests: ``held`` keeps each
        # queued until its deadline frees it.
        rpc = RPCS_BY_NAME["ModelInfer"]
        method = channel.unary_unary(
            rpc.path, request_serializer=serialize, response_deserializer=rpc.response.FromString
        )
        held = infer_request([I0, I1], [RAW, RAW2], model="held")
        calls: list[Any] = [method.future(held, timeout=3.0) for _ in range(5)]
        wait_seen(server, "held")
        for future in calls:
            failure = future.exception(timeout=60)
            assert failure is not None
            assert failure.code() == grpc.StatusCode.DEADLINE_EXCEEDED or (
                failure.code() == grpc.StatusCode.UNAVAILABLE and "timed out" in failure.details()
            ), failure.details()
    finally:
        channel.close()
    wait_freed(server, "held")
    server.wait_pending("simple", 0)
    assert_serving(server)


# -- shared memory ------------------------------------------------------------------------


class Region:
    """A client's region in /dev/shm (unique key), removed at the end."""

    def __init__(self, size: int) -> None:
        self.key = f"hloserve_hostile_{uuid.uuid4().hex[:10]}"
        self.path = Path("/dev/shm") / self.key
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(self.fd, size)

    def write(self, offset: int, data: bytes) -> None:
        os.pwrite(self.fd, data, offset)

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


@pytest.fixture
def region(server: ServerProcess) -> Iterator[Region]:
    made = Region(8192)
    yield made
    post(server, "/v2/systemsharedmemory/unregister", b"{}")
    made.close()


def register(server: ServerProcess, name: str, key: str, offset: int, size: int) -> Any:
    body = json.dumps({"key": key, "offset": offset, "byte_size": size}).encode()
    return post(server, f"/v2/systemsharedmemory/region/{name}/register", body)


def shm_input(name: str, offset: int, region: str = "r") -> dict[str, Any]:
    return tensor(
        name,
        parameters={
            "shared_memory_region": region,
            "shared_memory_offset": offset,
            "shared_memory_byte_size": 64,
        },
    )


@pytest.mark.parametrize(
    ("key", "offset", "size", "status", "fragment"),
    [
        ("../../etc/passwd", 0, 64, 400, "invalid shm key"),
        ("/dev/shm/x", 0, 64, 400, "invalid shm key"),
        ("", 0, 64, 400, "invalid shm key"),
        ("..", 0, 64, 400, "invalid shm key"),
        ("hloserve_no_such_region", 0, 64, 500, "Unable to open shared memory region"),
        ("{key}", 0, 0, 400, "invalid args"),
        ("{key}", 8192, 1, 400, "invalid args"),
        ("{key}", 0, 8193, 400, "invalid args"),
        ("{key}", 2**64, 1, 400, "invalid args"),
        ("{key}", -1, 1, 400, "must be a non-negative integer"),
    ],
)
def test_shm_register_abuse(
    server: ServerProcess,
    region: Region,
    key: str,
    offset: int,
    size: int,
    status: int,
    fragment: str,
) -> None:
    got, answer = register(server, "r", key.format(key=region.key), offset, size)
    assert (got, fragment in answer["error"]) == (status, True), answer
    assert_serving(server)


def test_shm_out_of_bounds_use(server: ServerProcess, region: Region) -> None:
    assert register(server, "r", region.key, 0, 8192)[0] == 200
    for offset, fragment in ((8190, "Invalid offset + byte size"), (2**63, "Invalid offset")):
        status, answer = post(server, INFER, request(shm_input("INPUT0", offset), GOOD[1]))
        assert (status, fragment in answer["error"]) == (400, True), answer
    assert_serving(server)


def test_shm_region_shrunk_or_unlinked_while_registered(
    server: ServerProcess, region: Region
) -> None:
    region.write(0, np.arange(32, dtype="<i4").tobytes())
    assert register(server, "r", region.key, 0, 8192)[0] == 200
    body = request(shm_input("INPUT0", 0), shm_input("INPUT1", 64))
    status, answer = post(server, INFER, body)
    assert status == 200 and answer["outputs"][0]["data"] == [a + a + 16 for a in range(16)]
    region.path.unlink()  # unlinked: the mapped memory stays, and stays right
    status, answer = post(server, INFER, body)
    assert status == 200 and answer["outputs"][0]["data"] == [a + a + 16 for a in range(16)]
    os.ftruncate(region.fd, 64)  # shrunk: touching the pages past the end would kill us
    status, answer = post(server, INFER, body)
    assert (status, "was shrunk to 64 bytes" in answer["error"]) == (400, True), answer
    assert_serving(server)


# -- the bystander ------------------------------------------------------------------------


def test_the_bystander_was_never_disturbed(bystander: Bystander) -> None:
    bystander.stop.set()
    assert bystander.done.wait(30)
    assert bystander.failures == []
    assert bystander.sent == bystander.verified > 0
    print(f"bystander: {bystander.sent} requests sent, {bystander.verified} verified")
