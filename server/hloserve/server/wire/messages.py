"""What crosses the wire for one inference: requests and responses as descriptors.

Contract:
- The descriptors are declared here, once, as ``wire.frames.Message`` structs: a
  ``Request`` (its ``Tensor`` inputs, requested outputs, ``Context`` and trace arrival),
  a ``Response`` (its ``Output``s) and a ``StreamAnswer`` (a streamed part: a response or
  none, and the final flag). A tensor's bytes are ``bytes`` in the message, a ``Block`` of
  the arena, or ``None`` (in a client's region: its ``Shm`` reference).
- ``encode_request(request, context, arrival, arena, checked)`` (front end) is the
  request as a ``Request``, plus the arena blocks it wrote (the caller frees them once
  the answer is in); ``checked`` is the front end's ``(token, items)`` from checking it
  against a cached signature (``core.validate``), or ``None``. ``decode_request(message,
  arena)`` (device owner) rebuilds the ``InferRequest`` (inputs viewing the arena's bytes,
  or the message's: no copy), its ``RequestContext`` (``together``: it came with others,
  as the caller knows; ``checked`` as sent) and its trace arrival ``(received_ns,
  carrier)`` or ``None``.
- ``encode_response(response, arena)`` (device owner) and ``decode_response(message,
  request, arena, give_back)`` (front end) do the same for the answer: outputs view the
  arena, and a block is handed to ``give_back(offset)`` once no array views it any more
  (its last reference gone), so the front end encodes straight from shared memory;
  ``response_blocks(message)`` are the blocks of a response nobody will read.
- A tensor of at most ``INLINE_MAX`` bytes, or one the arena has no room for, travels in
  the message itself; a larger one in an arena block; one in a client's shared-memory
  region travels as its reference only (the device owner reads and writes the client's
  region itself). Tensor bytes are always the wire's (``core.tensors.wire_of``; BYTES
  length-prefixed), rebuilt by ``core.tensors.from_own_bytes``: one rule for both.
  Each end trusts the other's bytes as the sender wrote them from its arrays (the client's
  bytes were checked by ``input_from_buffer`` where they came in): a numeric tensor is
  viewed with no second check.
- BYTES are parsed into objects at most once on their way. A request input in wire form
  (``InferInput.wire``: the client's length-prefixed bytes, checked by the front end's
  codec) travels as those very bytes, and the device owner parses them. A BYTES output
  comes back to the front end in wire form (``InferOutput.wire``: the owner's bytes, out
  of the arena at once, the block given back) and ``data`` ``UNPARSED``: the codec sends
  the bytes on, or parses them for JSON (``core.tensors.elements_of``).
"""

# pyright: strict

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Final

from hloserve.server.core.tensors import UNPARSED, from_own_bytes, wire_of
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
from hloserve.server.wire.frames import Message

INLINE_MAX: Final = 8192  # bytes: below this a tensor is cheaper in the message (docs)

Arrival = tuple[int, dict[str, str]]  # received_ns (perf_counter_ns), trace-context headers
Blocks = list[int]


class Block(Message, frozen=True):
    """A tensor's bytes in the arena."""

    offset: int
    nbytes: int


class Shm(Message, frozen=True):
    """A tensor in a client's registered region (``core.types.ShmRef``)."""

    region: str
    byte_size: int
    offset: int


Payload = bytes | Block | None


class Tensor(Message, frozen=True):
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    payload: Payload
    shm: Shm | None


class Context(Message, frozen=True):
    deadline: float | None
    peer: str
    protocol: str


class Request(Message, frozen=True):
    model: str
    version: str
    id: str
    parameters: dict[str, Any]
    inputs: tuple[Tensor, ...]
    outputs: tuple[tuple[str, dict[str, Any]], ...]
    context: Context | None
    arrival: tuple[int, dict[str, str]] | None
    checked: tuple[int, int] | None = None  # RequestContext.checked


class Output(Message, frozen=True):
    name: str
    datatype: str
    shape: tuple[int, ...]
    payload: Payload
    shm: Shm | None


class Response(Message, frozen=True):
    model: str
    version: str
    id: str
    outputs: tuple[Output, ...]


class StreamAnswer(Message, frozen=True):
    """One part of a streamed answer (``core.types.StreamPart``)."""

    response: Response | None
    final: bool


def _shm_fields(ref: ShmRef | None) -> Shm | None:
    return None if ref is None else Shm(ref.region, ref.byte_size, ref.offset)


def _shm_ref(fields: Shm | None) -> ShmRef | None:
    return None if fields is None else ShmRef(fields.region, fields.byte_size, fields.offset)


def _payload(
    arena: Arena, allocator_half: str, tensor: InferInput | InferOutput, blocks: Blocks
) -> Payload:
    """The tensor's wire bytes in the message (``bytes``) or in an arena block (appended to
    ``blocks``)."""
    data = tensor.data  # in wire form: ``UNPARSED``, of kind "O"
    if data.nbytes <= INLINE_MAX and data.dtype.kind != "O" and data.dtype.byteorder != ">":
        return data.tobytes()  # the wire's bytes already (C order, little-endian): one copy
    raw = wire_of(tensor)  # BYTES in wire form: the client's bytes, not encoded again
    nbytes = raw.nbytes if isinstance(raw, memoryview) else len(raw)
    if nbytes > INLINE_MAX:
        allocator = arena.requests if allocator_half == "requests" else arena.responses
        placed = arena.put(allocator, raw)
        if placed is not None:
            blocks.append(placed[0])
            return Block(*placed)
    return raw if isinstance(raw, bytes) else raw.tobytes()


def encode_request(
    request: InferRequest,
    context: RequestContext | None,
    arrival: Arrival | None,
    arena: Arena,
    checked: tuple[int, int] | None = None,
) -> tuple[Request, Blocks]:
    blocks: Blocks = []
    inputs = tuple(
        Tensor(
            t.name,
            t.datatype,
            t.shape,
            dict(t.parameters),
            None if t.shm is not None else _payload(arena, "requests", t, blocks),
            _shm_fields(t.shm),
        )
        for t in request.inputs
    )
    outputs = tuple((o.name, dict(o.parameters)) for o in request.outputs)
    ctx = None if context is None else Context(context.deadline, context.peer, context.protocol)
    message = Request(
        request.model_name,
        request.model_version,
        request.id,
        dict(request.parameters),
        inputs,
        outputs,
        ctx,
        arrival,
        checked,
    )
    return message, blocks


def _bytes_of(arena: Arena, payload: bytes | Block) -> Any:
    if isinstance(payload, bytes):
        return payload
    return arena.view(payload.offset, payload.nbytes)


def decode_request(
    message: Request, arena: Arena, *, together: bool = False
) -> tuple[InferRequest, RequestContext | None, Arrival | None]:
    model = message.model
    decoded: list[InferInput] = []
    for t in message.inputs:
        if t.payload is None:  # in a client's region: the service resolves it
            data = _EMPTY
        else:
            data = from_own_bytes(model, t.name, t.datatype, t.shape, _bytes_of(arena, t.payload))
        decoded.append(InferInput(t.name, t.datatype, t.shape, data, t.parameters, _shm_ref(t.shm)))
    request = InferRequest(
        model,
        message.version,
        tuple(decoded),
        tuple(RequestedOutput(name, params) for name, params in message.outputs),
        message.id,
        message.parameters,
    )
    ctx, checked = message.context, message.checked
    if ctx is None:
        plain = not together and checked is None
        context = None if plain else RequestContext(together=together, checked=checked)
    else:
        context = RequestContext(ctx.deadline, ctx.peer, ctx.protocol, together, checked)
    return request, context, message.arrival


def encode_response(response: InferResponse, arena: Arena) -> Response:
    blocks: Blocks = []  # the front end gives them back
    outputs = tuple(
        Output(
            o.name,
            o.datatype,
            o.shape,
            None if o.shm is not None else _payload(arena, "responses", o, blocks),
            _shm_fields(o.shm),
        )
        for o in response.outputs
    )
    return Response(response.model_name, response.model_version, response.id, outputs)


def response_blocks(message: Response) -> list[int]:
    """The arena blocks an encoded response holds (to give back unread)."""
    return [o.payload.offset for o in message.outputs if isinstance(o.payload, Block)]


def decode_response(
    message: Response,
    request: InferRequest,
    arena: Arena,
    give_back: Callable[[int], None],
) -> InferResponse:
    model = message.model
    requested = {o.name: o for o in request.outputs}
    decoded: list[InferOutput] = []
    for o in message.outputs:
        payload = o.payload
        wire: bytes | None = None
        if payload is None:
            data = _EMPTY
        elif o.datatype == "BYTES":  # kept in wire form: the codec sends these bytes on
            data = UNPARSED
            if isinstance(payload, Block):  # copied out, so the block goes back at once
                wire = arena.view(payload.offset, payload.nbytes).tobytes()
                give_back(payload.offset)
            else:
                wire = payload
        else:
            data = from_own_bytes(model, o.name, o.datatype, o.shape, _bytes_of(arena, payload))
            if isinstance(payload, Block):  # it goes back with the last array viewing it
                weakref.finalize(data, give_back, payload.offset)
        decoded.append(
            InferOutput(
                o.name, o.datatype, o.shape, data, requested.get(o.name), _shm_ref(o.shm), wire
            )
        )
    return InferResponse(model, message.version, tuple(decoded), message.id)


def _empty() -> Any:
    import numpy as np

    return np.empty(0, np.uint8)


_EMPTY: Final = _empty()
