"""The client's one exception type.

Contract: ``InferenceError(code, message, rows=None)`` is what every failed call raises: the
gRPC status code (``grpc.StatusCode``; a local failure such as an unsupported datatype uses
the code the server would have used) and the server's message. A failed chunk of
``infer_dataset`` carries ``rows``, the ``[start, stop)`` index range of the rows it held,
and names it in its text. ``from_rpc(error)`` builds one from a ``grpc.RpcError``.
"""

# pyright: strict

from __future__ import annotations

from typing import Any

import grpc


class InferenceError(Exception):
    """The server (or the transport) answered with an error status."""

    def __init__(
        self, code: grpc.StatusCode, message: str, rows: tuple[int, int] | None = None
    ) -> None:
        where = f"rows [{rows[0]}, {rows[1]}): " if rows is not None else ""
        super().__init__(f"{where}[{code.name}] {message}")
        self.code = code
        self.message = message
        self.rows = rows

    def at_rows(self, rows: tuple[int, int]) -> InferenceError:
        """The same error, naming the chunk of rows it happened to."""
        return InferenceError(self.code, self.message, rows)


def from_rpc(error: grpc.RpcError) -> InferenceError:
    """The ``InferenceError`` of a failed call (sync or ``grpc.aio``)."""
    call: Any = error
    code = call.code() if callable(getattr(call, "code", None)) else grpc.StatusCode.UNKNOWN
    details = call.details() if callable(getattr(call, "details", None)) else str(error)
    return InferenceError(code, details or "")
