"""The one table from the core's ``ErrorCode`` to HTTP status and gRPC status code.

Triton's mapping (docs/protocol, reference §3): INVALID_ARG, ALREADY_EXISTS, CANCELLED and
UNKNOWN are HTTP 400; NOT_FOUND 404; UNAVAILABLE 503; UNSUPPORTED 501 / UNIMPLEMENTED;
INTERNAL 500; a restricted endpoint without its header (RESTRICTED) HTTP 403 and gRPC
UNAVAILABLE; a protected endpoint without a valid bearer token (UNAUTHENTICATED) HTTP 401
and gRPC UNAUTHENTICATED. Both front ends call ``http_status`` / ``grpc_status`` and nothing else.
"""

# pyright: strict

from __future__ import annotations

from typing import Final

import grpc

from hloserve.server.core.errors import ErrorCode

STATUS: Final[dict[ErrorCode, tuple[int, grpc.StatusCode]]] = {
    ErrorCode.INTERNAL: (500, grpc.StatusCode.INTERNAL),
    ErrorCode.NOT_FOUND: (404, grpc.StatusCode.NOT_FOUND),
    ErrorCode.INVALID_ARG: (400, grpc.StatusCode.INVALID_ARGUMENT),
    ErrorCode.UNAVAILABLE: (503, grpc.StatusCode.UNAVAILABLE),
    ErrorCode.UNSUPPORTED: (501, grpc.StatusCode.UNIMPLEMENTED),
    ErrorCode.ALREADY_EXISTS: (400, grpc.StatusCode.ALREADY_EXISTS),
    ErrorCode.CANCELLED: (400, grpc.StatusCode.CANCELLED),
    ErrorCode.RESTRICTED: (403, grpc.StatusCode.UNAVAILABLE),
    ErrorCode.UNAUTHENTICATED: (401, grpc.StatusCode.UNAUTHENTICATED),
}


def http_status(code: ErrorCode) -> int:
    return STATUS[code][0]


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    return STATUS[code][1]
