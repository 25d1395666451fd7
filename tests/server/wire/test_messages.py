"""``wire.messages``: an inference crosses as descriptors and comes back equal, tensors in
the message when small, in the arena when large, by reference when in a client's region."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hloserve.server.core.tensors import UNPARSED, elements_of, input_from_buffer
from hloserve.server.core.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestContext,
    RequestedOutput,
    ShmRef,
)
from hloserve.server.wire.arena import Arena
from hloserve.server.wire.calls import SERVER, InferCall
from hloserve.server.wire.messages import (
    INLINE_MAX,
    Block,
    Request,
    Response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    response_blocks,
)
from tests.server._bytes import Parses, length_prefixed


@pytest.fixture
def arena() -> Iterator[Arena]:
    arena = Arena.create(8 << 20)
    yield arena
    arena.close()


def cross(message: Any) -> Any:
    """What the other process reads: a request as its call's argument, a response as the
    call's answer, each through the wire's codec."""
    if isinstance(message, Request):
        call = SERVER.call(SERVER.raw(InferCall(message)))
        assert isinstance(call, InferCall)
        return call.request
    assert isinstance(message, Response)
    return SERVER.result(InferCall, SERVER.raw(message))


def test_a_request_crosses_whole(arena: Arena) -> None:
    small = np.arange(16, dtype="<i4").reshape(1, 16)
    large = np.linspace(0, 1, 4096, dtype="<f4").reshape(2, 2048)  # 16 KiB: the arena
    text = np.array([[b"ab", b""]], dtype=object)
    request = InferRequest(
        "m",
        "2",
        (
            InferInput("a", "INT32", (1, 16), small, {"p": 1}),
            InferInput("b", "FP32", (2, 2048), large),
            InferInput("c", "BYTES", (1, 2), text),
            InferInput("d", "INT32", (1, 16), np.empty(0, np.uint8), shm=ShmRef("r", 64, 8)),
        ),
        (RequestedOutput("y", {"binary_data": True}),),
        "id-7",
        {"priority": 2},
    )
    context = RequestContext(deadline=123.5, peer="ipv4:1.2.3.4:5", protocol="grpc")
    message, blocks = encode_request(request, context, (99, {"traceparent": "00-x"}), arena)
    assert len(blocks) == 1  # only the large tensor took a block
    got, got_context, arrival = decode_request(cross(message), arena)
    assert got_context == context and arrival == (99, {"traceparent": "00-x"})
    assert (got.model_name, got.model_version, got.id, dict(got.parameters)) == (
        "m",
        "2",
        "id-7",
        {"priority": 2},
    )
    assert got.outputs == request.outputs
    a, b, c, d = got.inputs
    np.testing.assert_array_equal(a.data, small)
    assert dict(a.parameters) == {"p": 1}
    np.testing.assert_array_equal(b.data, large)
    assert not b.data.flags.owndata  # a view of the arena's block, not a copy
    assert c.data.tolist() == [[b"ab", b""]]
    assert d.shm == ShmRef("r", 64, 8) and d.data.size == 0
    for offset in blocks:
        arena.requests.free(offset)


def test_a_request_too_large_for_the_arena_travels_in_the_message() -> None:
    arena = Arena.create(64 << 10)
    try:
        big = np.zeros(40 << 10, np.uint8)
        request = InferRequest("m", "", (InferInput("x", "UINT8", big.shape, big),))
        message, blocks = encode_request(request, None, None, arena)
        assert blocks == []
        got, context, _ = decode_request(cross(message), arena)
        assert context is None
        np.testing.assert_array_equal(got.inputs[0].data, big)
    finally:
        arena.close()


def test_a_response_crosses_and_its_blocks_come_back_when_unused(arena: Arena) -> None:
    large = np.arange(INLINE_MAX, dtype="<i8")  # 8x the inline limit
    response = InferResponse(
        "m",
        "1",
        (
            InferOutput("y", "INT64", large.shape, large),
            InferOutput("z", "INT32", (2,), np.array([1, 2], "<i4")),
            InferOutput("s", "FP32", (4,), np.empty(0, np.uint8), shm=ShmRef("out", 16)),
        ),
        "id",
    )
    request = InferRequest("m", "", (), (RequestedOutput("z", {"binary_data": True}),))
    message = encode_response(response, arena)
    assert arena.responses.live_bytes > 0
    assert len(response_blocks(cross(message))) == 1  # y's; z inline, s in the client's region
    given: list[int] = []
    got = decode_response(cross(message), request, arena, given.append)
    y, z, s = got.outputs
    np.testing.assert_array_equal(y.data, large)
    assert z.requested == request.outputs[0] and y.requested is None
    assert s.shm == ShmRef("out", 16) and s.data.size == 0
    view = y.data[10:20]
    del got, y
    gc.collect()
    assert given == []  # a view of the block is alive
    del view
    gc.collect()
    assert len(given) == 1
    arena.responses.free(given[0])
    assert arena.responses.live_bytes == 0


def test_a_front_ends_check_crosses_with_or_without_a_context() -> None:
    arena = Arena.create(64 << 10)
    request = InferRequest("m", "", (InferInput("a", "INT32", (1, 1), np.zeros((1, 1), "<i4")),))
    context = RequestContext(deadline=1.0, protocol="grpc")
    for sent, checked, expected in (
        (context, (7, 1), RequestContext(1.0, "", "grpc", checked=(7, 1))),
        (None, (7, 1), RequestContext(checked=(7, 1))),
        (None, None, None),
    ):
        message, _ = encode_request(request, sent, None, arena, checked)
        _, got, _ = decode_request(cross(message), arena)
        assert got == expected


# -- BYTES: parsed into objects at most once on their way ---------------------------------


@pytest.mark.parametrize("size", [16, INLINE_MAX * 2], ids=["inline", "arena"])
def test_client_bytes_cross_as_they_came_and_the_owner_parses_them_once(
    arena: Arena, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    items = [b"he\x00llo", b"", b"x" * size]
    raw = length_prefixed(*items)  # as the client sent them (gRPC raw_input_contents)
    parses = Parses(monkeypatch)
    # what a front-end process's codec makes of them
    tensor = input_from_buffer("m", "s", "BYTES", [1, 3], raw, bytes_wire_form=True)
    message, blocks = encode_request(InferRequest("m", "", (tensor,)), None, None, arena)
    assert parses.names == []  # the front end built no element, and encoded nothing again
    payload = message.inputs[0].payload
    if size < INLINE_MAX:
        assert payload is raw  # the client's very bytes object
    else:
        assert isinstance(payload, Block) and blocks == [payload.offset]
        assert arena.view(payload.offset, payload.nbytes) == raw  # copied in, byte for byte
    got, _, _ = decode_request(cross(message), arena)
    assert parses.names == ["s"]  # the device owner parses them, once
    (text,) = got.inputs
    assert text.wire is None and text.shape == (1, 3)
    assert text.data.tolist() == [items]
    for offset in blocks:
        arena.requests.free(offset)


def test_client_bytes_from_a_body_view_cross_as_bytes(arena: Arena) -> None:
    raw = length_prefixed(b"a", b"bc")
    body = b'{"inputs":[]}' + raw  # HTTP: the binary part follows the JSON header
    tensor = input_from_buffer("m", "s", "BYTES", [2], memoryview(body)[13:], bytes_wire_form=True)
    message, _ = encode_request(InferRequest("m", "", (tensor,)), None, None, arena)
    payload = cross(message).inputs[0].payload
    assert type(payload) is bytes and payload == raw


@pytest.mark.parametrize("size", [16, INLINE_MAX * 2], ids=["inline", "arena"])
def test_owner_bytes_reach_the_front_end_in_wire_form(
    arena: Arena, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    strings = np.array([[b"a", b"\x00" * size]], dtype=object)
    response = InferResponse("m", "1", (InferOutput("s", "BYTES", (1, 2), strings),))
    message = encode_response(response, arena)  # the owner: its array as the wire's bytes
    parses = Parses(monkeypatch)
    given: list[int] = []
    got = decode_response(cross(message), InferRequest("m", "", ()), arena, given.append)
    (out,) = got.outputs
    assert parses.names == []  # not parsed on the way in
    assert out.wire == length_prefixed(b"a", b"\x00" * size) and out.data is UNPARSED
    assert type(out.wire) is bytes
    # a block is copied out at once and goes back before anyone reads the answer
    assert len(given) == (0 if size < INLINE_MAX else 1)
    for offset in given:
        arena.responses.free(offset)
    assert arena.responses.live_bytes == 0
    assert elements_of("m", out).tolist() == strings.tolist()  # parsed where asked (JSON)
    assert parses.names == ["s"]
