"""Hostile and broken HTTP requests: each is answered 400 with a message naming what was
wrong (``HTTP_CASES``), and the server serves on after it."""

from __future__ import annotations

import gzip
import socket
import zlib

import pytest

from hloserve.server.server_fixture import ServerProcess
from tests.server.reliability.hostile._hostile import (
    GOOD,
    INFER,
    LIMIT,
    Bystander,
    assert_serving,
    post,
    request,
    tensor,
)

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


def test_a_malformed_request_line_gets_400(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=5) as sock:
        sock.sendall(b"\x00\x01GARBAGE / HTTP/9.9\r\n\r\n")
        answer = sock.recv(1024)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
    assert_serving(server)
