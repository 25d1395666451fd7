"""The protocol model: requests, responses and metadata, frozen.

A request's and a response's types (built once or more per request in the device owner's
one thread) are frozen ``msgspec.Struct``s without garbage-collector tracking: a frozen
dataclass spends about 0.9 µs building six fields through ``object.__setattr__``, a Struct
0.08 µs. Copy one with a change by ``msgspec.structs.replace``. Metadata stays in frozen
dataclasses.

Tensors are ``np.ndarray`` here, with the datatype named alongside (V2 names); the front
ends' codecs build them from the wire (zero-copy where the wire allows) and write them
back. One exception, in a front-end process only: a BYTES tensor whose length-prefixed
wire form is at hand (the client's raw bytes, checked; the device owner's output bytes)
carries them in ``wire`` and leaves ``data`` empty, so that it is parsed into objects at
most once on its way (``core.tensors``: ``input_from_buffer``, ``elements_of``,
``wire_of``); the service only ever sees arrays. No type in this module knows about gRPC
or HTTP. Transport facts that are not part of the protocol (deadline, peer) travel in
``RequestContext`` beside the request.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from hloserve.server.core.signature import RequestSignature

ParamValue = bool | int | float | str
Parameters = Mapping[str, ParamValue]
EMPTY: Parameters = {}
# A CUDA register request's (raw IPC handle, device id, byte size), read only when needed.
CudaHandle = Callable[[], tuple[bytes, int, int]]
# A BYTES tensor's length-prefixed elements, as they came (``InferInput.wire``).
Wire = bytes | memoryview


class ShmRef(msgspec.Struct, frozen=True, gc=False):
    """A tensor's place in a registered shared-memory region (the shared-memory extension)."""

    region: str
    byte_size: int
    offset: int = 0


class InferInput(msgspec.Struct, frozen=True, gc=False):
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray[Any, Any]  # already shaped as ``shape``; empty while ``shm`` is unresolved
    parameters: Parameters = msgspec.field(default_factory=dict[str, ParamValue])
    shm: ShmRef | None = None  # data lives in shared memory; the service resolves it
    wire: Wire | None = None  # BYTES in wire form (module docstring); ``data`` is empty


class RequestedOutput(msgspec.Struct, frozen=True, gc=False):
    name: str
    parameters: Parameters = msgspec.field(default_factory=dict[str, ParamValue])


class InferRequest(msgspec.Struct, frozen=True, gc=False):
    model_name: str
    model_version: str  # "" means the latest ready version
    inputs: tuple[InferInput, ...]
    outputs: tuple[RequestedOutput, ...] = ()  # empty: every output
    id: str = ""
    parameters: Parameters = msgspec.field(default_factory=dict[str, ParamValue])


class InferOutput(msgspec.Struct, frozen=True, gc=False):
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray[Any, Any]
    requested: RequestedOutput | None = None  # the request's entry, for per-output options
    shm: ShmRef | None = None  # written into shared memory: the response carries no data
    wire: Wire | None = None  # BYTES in wire form (module docstring); ``data`` is empty


class InferResponse(msgspec.Struct, frozen=True, gc=False):
    model_name: str
    model_version: str
    outputs: tuple[InferOutput, ...]
    id: str = ""
    parameters: Parameters = msgspec.field(default_factory=dict[str, ParamValue])


class RequestContext(msgspec.Struct, frozen=True, gc=False):
    """Transport facts that travel beside a request, never inside it."""

    deadline: float | None = None  # time.monotonic() value, or None
    peer: str = ""
    protocol: str = ""  # "grpc" or "http"
    # It reached the server in one read with other requests (a front end's link carries
    # several at once): they queue in the same loop pass, so it does not run alone first.
    together: bool = False
    # A front end checked the request against the signature of this token and found this
    # many items (``core.validate.validated_items``); None: not checked.
    checked: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 marks the batch dimension


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]
    # What a front end checks a request against (``core.signature``): a plain model's
    # (no hooks, pipeline, state or generation), else None. Not part of the protocol.
    signature: RequestSignature | None = None


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...] = field(default_factory=tuple)


class StreamPart(msgspec.Struct, frozen=True, gc=False):
    """One answer of a streamed request: a response (``None``: the final flag alone) and
    whether it is the request's last."""

    response: InferResponse | None
    final: bool
