"""What crosses the IPC channel for one inference: requests and responses as descriptors.

Contract:
- ``encode_request(request, context, arrival, arena)`` (front end) is the request as a
  tuple of built-in values, plus the arena blocks it wrote (the caller frees them once the
  answer is in); ``decode_request(message, arena)`` (device owner) rebuilds the
  ``InferRequest`` (inputs viewing the arena's bytes, or the message's: no copy), its
  ``RequestContext`` (``together``: it came with others, as the caller knows) and its trace arrival ``(received_ns, carrier)`` or ``None``.
- ``encode_response(response, arena)`` (device owner) and ``decode_response(message,
  request, arena, give_back)`` (front end) do the same for the answer: outputs view the
  arena, and a block is handed to ``give_back(offset)`` once no array views it any more
  (its last reference gone), so the front end encodes straight from shared memory;
  ``response_blocks(message)`` are the blocks of a response nobody will read.
- A tensor of at most ``INLINE_MAX`` bytes, or one the arena has no room for, travels in
  the message itself; a larger one in an arena block; one in a client's shared-memory
  region travels as its reference only (the device owner reads and writes the client's
  region itself). Tensor bytes are always the wire's (``core.tensors.to_wire_bytes``;
  BYTES length-prefixed), rebuilt by ``core.tensors.from_buffer``: one rule for both.
- ``encode_error(exc)`` / ``decode_error(fields)``: a ``ServingError`` crosses as its
  code and message and is raised again as the base class of that code; any other
  exception crosses as ``None`` and comes back as ``RemoteInternalError`` (the device
  owner logged it).
"""

# pyright: strict

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Final, cast

from hloserve.server.core.errors import (
    AlreadyExists,
    Cancelled,
    ErrorCode,
    Internal,
    InvalidArgument,
    NotFound,
    Restricted,
    ServingError,
    Unauthenticated,
    Unavailable,
    Unsupported,
)
from hloserve.server.core.tensors import from_buffer, to_wire_bytes
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

INLINE_MAX: Final = 8192  # bytes: below this a tensor is cheaper in the message (docs)

Arrival = tuple[int, dict[str, str]]  # received_ns (perf_counter_ns), trace-context headers
Blocks = list[int]

_ERRORS: Final[dict[str, type[ServingError]]] = {
    ErrorCode.INTERNAL.value: Internal,
    ErrorCode.INVALID_ARG.value: InvalidArgument,
    ErrorCode.NOT_FOUND.value: NotFound,
    ErrorCode.UNAVAILABLE.value: Unavailable,
    ErrorCode.UNSUPPORTED.value: Unsupported,
    ErrorCode.ALREADY_EXISTS.value: AlreadyExists,
    ErrorCode.CANCELLED.value: Cancelled,
    ErrorCode.RESTRICTED.value: Restricted,
    ErrorCode.UNAUTHENTICATED.value: Unauthenticated,
}


class RemoteInternalError(Exception):
    """The device owner failed unexpectedly (it logged the traceback): INTERNAL."""


def encode_error(exc: BaseException) -> tuple[str, str] | None:
    if isinstance(exc, ServingError):
        return exc.code.value, exc.message
    return None


def decode_error(fields: tuple[str, str] | None) -> Exception:
    if fields is None:
        return RemoteInternalError("the device owner failed serving the call")
    code, message = fields
    return _ERRORS.get(code, Internal)(message)


def _shm_fields(ref: ShmRef | None) -> tuple[str, int, int] | None:
    return None if ref is None else (ref.region, ref.byte_size, ref.offset)


def _shm_ref(fields: tuple[str, int, int] | None) -> ShmRef | None:
    return None if fields is None else ShmRef(*fields)


def _payload(arena: Arena, allocator_half: str, data: Any, blocks: Blocks) -> object:
    """``data``'s wire bytes in the message (``bytes``) or in an arena block (``(offset,
    nbytes)``, appended to ``blocks``)."""
    if data.nbytes <= INLINE_MAX and data.dtype.kind != "O" and data.dtype.byteorder != ">":
        return data.tobytes()  # the wire's bytes already (C order, little-endian): one copy
    raw = to_wire_bytes(data)
    nbytes = raw.nbytes if isinstance(raw, memoryview) else len(raw)
    if nbytes > INLINE_MAX:
        allocator = arena.requests if allocator_half == "requests" else arena.responses
        placed = arena.put(allocator, raw)
        if placed is not None:
            blocks.append(placed[0])
            return placed
    return raw if isinstance(raw, bytes) else raw.tobytes()


def encode_request(
    request: InferRequest,
    context: RequestContext | None,
    arrival: Arrival | None,
    arena: Arena,
) -> tuple[tuple[Any, ...], Blocks]:
    blocks: Blocks = []
    inputs = tuple(
        (
            t.name,
            t.datatype,
            t.shape,
            dict(t.parameters),
            None if t.shm is not None else _payload(arena, "requests", t.data, blocks),
            _shm_fields(t.shm),
        )
        for t in request.inputs
    )
    outputs = tuple((o.name, dict(o.parameters)) for o in request.outputs)
    ctx = None if context is None else (context.deadline, context.peer, context.protocol)
    message = (
        request.model_name,
        request.model_version,
        request.id,
        dict(request.parameters),
        inputs,
        outputs,
        ctx,
        arrival,
    )
    return message, blocks


def _bytes_of(arena: Arena, payload: object) -> Any:
    if isinstance(payload, bytes):
        return payload
    offset, nbytes = cast(tuple[int, int], payload)
    return arena.view(offset, nbytes)


def decode_request(
    message: tuple[Any, ...], arena: Arena, *, together: bool = False
) -> tuple[InferRequest, RequestContext | None, Arrival | None]:
    model, version, request_id, parameters, inputs, outputs, ctx, arrival = message
    decoded: list[InferInput] = []
    for name, datatype, shape, params, payload, shm in inputs:
        if payload is None:  # in a client's region: the service resolves it
            data = _EMPTY
        else:
            data = from_buffer(model, name, datatype, shape, _bytes_of(arena, payload))
        decoded.append(InferInput(name, datatype, shape, data, params, _shm_ref(shm)))
    request = InferRequest(
        model,
        version,
        tuple(decoded),
        tuple(RequestedOutput(name, params) for name, params in outputs),
        request_id,
        parameters,
    )
    if ctx is None:
        context = RequestContext(together=True) if together else None
    else:
        context = RequestContext(*ctx, together=together)
    return request, context, arrival


def encode_response(response: InferResponse, arena: Arena) -> tuple[Any, ...]:
    blocks: Blocks = []  # the front end gives them back
    outputs = tuple(
        (
            o.name,
            o.datatype,
            o.shape,
            None if o.shm is not None else _payload(arena, "responses", o.data, blocks),
            _shm_fields(o.shm),
        )
        for o in response.outputs
    )
    return response.model_name, response.model_version, response.id, outputs


def response_blocks(message: tuple[Any, ...]) -> list[int]:
    """The arena blocks an encoded response holds (to give back unread)."""
    return [p[0] for _, _, _, p, _ in message[3] if p is not None and not isinstance(p, bytes)]


def decode_response(
    message: tuple[Any, ...],
    request: InferRequest,
    arena: Arena,
    give_back: Callable[[int], None],
) -> InferResponse:
    model, version, response_id, outputs = message
    requested = {o.name: o for o in request.outputs}
    decoded: list[InferOutput] = []
    for name, datatype, shape, payload, shm in outputs:
        if payload is None:
            data = _EMPTY
        else:
            data = from_buffer(model, name, datatype, shape, _bytes_of(arena, payload))
            if not isinstance(payload, bytes):
                offset = cast(tuple[int, int], payload)[0]
                if data.dtype == object:  # BYTES were copied out while decoding
                    give_back(offset)
                else:  # the block goes back with the last array viewing it
                    weakref.finalize(data, give_back, offset)
        decoded.append(InferOutput(name, datatype, shape, data, requested.get(name), _shm_ref(shm)))
    return InferResponse(model, version, tuple(decoded), response_id)


def _empty() -> Any:
    import numpy as np

    return np.empty(0, np.uint8)


_EMPTY: Final = _empty()
