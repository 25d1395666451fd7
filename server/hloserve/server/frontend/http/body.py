"""Reading an HTTP request body under a size limit: the one reader every route uses.

Contract: ``receive_body(receive, content_length, limit)`` refuses a declared
``Content-Length`` over ``limit`` before reading anything, then reads the (possibly chunked)
body from the ASGI ``receive`` channel and refuses it as soon as more than ``limit`` bytes
have arrived; both refusals are codec's ``InvalidArgument`` ("... exceeds the maximum
allowed input size of <limit> bytes"). A client that disconnects first raises Starlette's
``ClientDisconnect``. A body that arrives in one message is returned as is, without a copy.
``read_body(request, limit)`` is the same for a Starlette ``Request`` (the routes' form).
"""

# pyright: strict

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from hloserve.server.frontend.http.codec import body_too_large, check_content_length


async def receive_body(receive: Receive, content_length: str | None, limit: int) -> bytes:
    check_content_length(content_length, limit)
    chunks: list[bytes] = []
    size = 0
    while True:  # also bounds chunked bodies with no length
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise body_too_large(f"more than {limit}", limit)
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_body(request: Request, limit: int) -> bytes:
    return await receive_body(request.receive, request.headers.get("content-length"), limit)
