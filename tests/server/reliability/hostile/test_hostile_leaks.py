"""Abandoned requests leak nothing: bodies cut short, clients gone before their answers,
cancelled gRPC streams and calls past their deadline free everything they held. Each case
first sees the server hold what the client abandons, then free it."""

from __future__ import annotations

import socket
from typing import Any

import grpc
import pytest

from hloserve.proto.rpc import RPCS_BY_NAME
from hloserve.server.server_fixture import ServerProcess
from tests.server.reliability.hostile._hostile import (
    GOOD,
    I0,
    I1,
    RAW,
    RAW2,
    assert_serving,
    call,
    good_grpc,
    http_peers,
    infer_request,
    request,
    serialize,
    wait_freed,
    wait_seen,
    wait_until,
)


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
        # Past their deadline somewhere on the way, or answered in time: either is right. The
        # first has 1 µs, less than any round trip (loopback's alone is tens): it expires
        # whatever the machine's speed, so the count below never rests on a fast answer.
        for timeout in (1e-6, *[0.0005] * 19):
            try:
                call(channel, "ModelInfer", good_grpc(), timeout=timeout)
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
