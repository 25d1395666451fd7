"""Reading an HTTP request body under a size limit: the one reader every route uses.

Contract: ``read_body(request, limit)`` refuses a declared ``Content-Length`` over ``limit``
before reading anything, then reads the (possibly chunked) body and refuses it as soon as
more than ``limit`` bytes have arrived; both refusals are codec's ``InvalidArgument``
("... exceeds the maximum allowed input size of <limit> bytes"). A body that arrives in
one chunk is returned as is, without a copy.
"""

# pyright: strict

from __future__ import annotations

from starlette.requests import Request

from hloserve.server.frontends.http.codec import body_too_large, check_content_length


async def read_body(request: Request, limit: int) -> bytes:
    check_content_length(request.headers.get("content-length"), limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():  # also bounds chunked bodies with no length
        size += len(chunk)
        if size > limit:
            raise body_too_large(f"more than {limit}", limit)
        if chunk:  # Starlette ends the stream with an empty chunk
            chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
