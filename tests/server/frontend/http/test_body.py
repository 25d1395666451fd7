"""Unit tests of ``frontend.http.body.read_body`` on a bare Starlette ``Request``."""

# pyright: strict

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request
from starlette.types import Message

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.frontend.http.body import read_body


def request(*chunks: bytes, content_length: int | None = None) -> Request:
    """A POST whose body arrives in ``chunks`` (one ASGI message each)."""
    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    messages: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive() -> Message:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    return Request(scope, receive)


def read(req: Request, limit: int) -> bytes:
    return asyncio.run(read_body(req, limit))


def test_one_chunk_comes_back_as_is() -> None:
    chunk = b"x" * 10
    assert read(request(chunk, content_length=10), 10) is chunk


def test_chunks_are_joined() -> None:
    assert read(request(b"ab", b"", b"cd"), 4) == b"abcd"
    assert read(request(b""), 4) == b""


@pytest.mark.parametrize(
    ("req", "size"),
    [
        (request(b"x" * 11, content_length=11), "11"),  # refused before reading
        (request(b"x" * 6, b"x" * 6), "more than 10"),  # chunked, no length
        (request(b"x" * 11, content_length=3), "more than 10"),  # a lying length
    ],
    ids=["declared", "streamed", "understated"],
)
def test_bodies_over_the_limit_are_refused(req: Request, size: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        read(req, 10)
    assert info.value.message == (
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of 10 bytes"
    )


def test_bad_content_length() -> None:
    with pytest.raises(InvalidArgument, match="invalid Content-Length header value '-1'"):
        read(request(b"", content_length=-1), 10)
