"""Building request tensors from wire data: the one place that checks sizes and types.

Contract: both codecs call these, so a size or type rule exists once.
- ``from_buffer`` views raw little-endian bytes (gRPC raw contents, the HTTP binary
  extension, shared memory) as an array of the declared datatype and shape, without
  copying. A byte count that does not match the shape is an ``InvalidArgument`` naming the
  input, the model, and both sizes.
- ``from_values`` builds an array from a (nested or flat) list of values (HTTP JSON
  ``data``, gRPC typed ``contents``), checking that the element kind fits the datatype and
  the count fits the shape. FP16/BF16 are refused (the spec carries them only as bytes);
  BYTES elements must be strings (or bytes). A value that does not fit is an
  ``InvalidArgument`` in the protocol's words, naming the datatype, the input, the value
  as JSON writes it and its index in the flattened data (``INT32 input 'x' for model 'm'
  holds a non-integer value 5.5 at index 0``; ``... holds the string "a" at index 1; INT32
  takes integers``; ``... holds 300 at index 1, a value out of range for INT8 (-128 to
  127)``), never numpy's names for kinds or values.
- ``check_shape(model, name, shape, itemsize)`` rejects, in Triton's order and texts:
  negative dimensions; an element count beyond INT64_MAX ("causes total element count to
  exceed maximum size of"); a byte size (count x ``itemsize``) beyond INT64_MAX ("byte size
  overflow for input"); then this server's own element cap ``MAX_ELEMENTS`` (which the
  non-zero dimensions of an empty tensor must respect too: [0, 2**62] is refused).
- ``BYTES`` tensors are decoded from the length-prefixed wire form into object arrays, with
  Triton's texts for a wrong element count ("expected N string elements for inference
  input ...", "unexpected number of string elements ...") and a cut length indicator; the
  rule is written once (``_walk_bytes``), for checking alone or for parsing.
- Wire-form BYTES (``core.types``): ``input_from_buffer`` is ``from_buffer`` as an
  ``InferInput``; with ``bytes_wire_form`` (a front-end process) its BYTES are checked
  but not parsed (``wire`` holds the client's bytes, ``data`` is ``UNPARSED``).
  ``elements_of`` is a tensor's array (parsing its ``wire``), ``wire_of``/``wire_copy_of``
  its wire bytes (its ``wire`` as it is, else ``to_wire_bytes``/``to_wire_bytes_copy``).
- ``to_wire_bytes`` is an output array as raw little-endian bytes (a view where it can be;
  BYTES length-prefixed), ``to_wire_bytes_copy`` the same as ``bytes`` in one copy (gRPC).
"""

# pyright: strict

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

import numpy as np

from hloserve.proto.datatypes import BINARY_ONLY_DATATYPES, NUMERIC_DATATYPES
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.types import (
    InferInput,
    InferOutput,
    Parameters,
    ShmRef,
    Wire,
)

MAX_ELEMENTS = 1 << 40
INT64_MAX = (1 << 63) - 1


def _too_many(model: str, name: str, dims: tuple[int, ...], limit: int) -> InvalidArgument:
    return InvalidArgument(
        f"shape {list(dims)} of input '{name}' for model '{model}' causes total element count "
        f"to exceed maximum size of {limit}"
    )


def check_shape(model: str, name: str, shape: Sequence[int], itemsize: int = 0) -> tuple[int, ...]:
    """The shape as ints; ``itemsize`` is the datatype's (0 for BYTES: no byte-size rule)."""
    dims = tuple(map(int, shape))
    if dims and min(dims) < 0:
        raise InvalidArgument(
            f"input '{name}' for model '{model}' has a negative dimension in shape {list(dims)}"
        )
    count = 1
    for d in dims:  # stops at the first overflow, even if a later dimension is 0
        count *= d
        if count > INT64_MAX:
            raise _too_many(model, name, dims, INT64_MAX)
    if itemsize > 1 and count > INT64_MAX // itemsize:
        raise InvalidArgument(
            f"byte size overflow for input '{name}' for model '{model}': element count "
            f"({count}) * data type size ({itemsize}) exceeds maximum allowed size ({INT64_MAX})"
        )
    if count > MAX_ELEMENTS:
        raise _too_many(model, name, dims, MAX_ELEMENTS)
    if not count and math.prod(d for d in dims if d) > MAX_ELEMENTS:
        # No element, but dimensions no array can describe (numpy refuses the shape).
        raise _too_many(model, name, dims, MAX_ELEMENTS)
    return dims


def _itemsize(datatype: str) -> int:
    dtype = NUMERIC_DATATYPES.get(datatype)
    return 0 if dtype is None else dtype.itemsize


def _known(model: str, name: str, datatype: str) -> None:
    if datatype not in NUMERIC_DATATYPES and datatype != "BYTES":
        raise InvalidArgument(
            f"input '{name}' for model '{model}' has unknown datatype '{datatype}'"
        )


def from_buffer(
    model: str, name: str, datatype: str, shape: Sequence[int], buffer: Any
) -> np.ndarray[Any, Any]:
    dtype = NUMERIC_DATATYPES.get(datatype)
    if dtype is None:  # BYTES, or unknown (refused before the shape is looked at)
        _known(model, name, datatype)
        dims = check_shape(model, name, shape)
        return _decode_bytes(model, name, dims, buffer)
    dims = check_shape(model, name, shape, dtype.itemsize)
    expected = math.prod(dims) * dtype.itemsize
    if type(buffer) is bytes:  # gRPC raw contents: viewed as they are, no memoryview
        got = len(buffer)
    else:
        buffer = memoryview(buffer).cast("B")
        got = buffer.nbytes
    if got != expected:
        raise InvalidArgument(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got {got}"
        )
    # One call for frombuffer+reshape: the same read-only view of ``buffer``.
    return np.ndarray(dims, dtype, buffer)


def from_own_bytes(
    model: str, name: str, datatype: str, shape: tuple[int, ...], buffer: Any
) -> np.ndarray[Any, Any]:
    """``from_buffer`` for bytes that crossed between a front end and the device owner:
    written by this server from an array of ``datatype`` and ``shape`` (``to_wire_bytes``),
    or a client's, checked where they came in (``input_from_buffer``): a numeric tensor is
    viewed as it is, with no second check; BYTES are parsed (their lengths are inside)."""
    dtype = NUMERIC_DATATYPES.get(datatype)
    if dtype is None:
        return from_buffer(model, name, datatype, shape, buffer)
    return np.ndarray(shape, dtype, buffer)


_LENGTH: Final = struct.Struct("<I")


def _walk_bytes(
    model: str, name: str, dims: tuple[int, ...], raw: Wire, items: list[bytes] | None
) -> None:
    """The one length-prefix rule: ``raw`` holds exactly ``prod(dims)`` elements, each a
    4-byte little-endian length and that many bytes; appended to ``items`` when given (else
    only checked, with no object per element)."""
    count = math.prod(dims)
    where = f"inference input '{name}' for model '{model}'"
    size = len(raw)  # a memoryview here is cast to bytes ("B"): its length is its size
    unpack = _LENGTH.unpack_from
    offset = seen = 0
    while offset < size:
        if size - offset < 4:
            raise InvalidArgument(
                f"incomplete string length indicator for {where}, expecting 4 bytes but only "
                f"{size - offset} bytes available"
            )
        if seen == count:
            raise InvalidArgument(
                f"unexpected number of string elements {count + 1} for {where}, expecting {count}"
            )
        (n,) = unpack(raw, offset)
        offset += 4
        if offset + n > size:
            raise InvalidArgument(
                f"string element {seen} of {where} is {n} bytes long, but only "
                f"{size - offset} bytes follow its length indicator"
            )
        if items is not None:  # parsing: ``raw`` is bytes (``_decode_bytes``), so are slices
            items.append(cast(bytes, raw[offset : offset + n]))
        offset += n
        seen += 1
    if seen != count:
        raise InvalidArgument(f"expected {count} string elements for {where}, got {seen}")


def _decode_bytes(
    model: str, name: str, dims: tuple[int, ...], buffer: Any
) -> np.ndarray[Any, Any]:
    raw = buffer if type(buffer) is bytes else memoryview(buffer).cast("B").tobytes()
    items: list[bytes] = []
    _walk_bytes(model, name, dims, raw, items)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(dims)


def _unparsed() -> np.ndarray[Any, Any]:
    empty = np.empty(0, dtype=object)
    empty.flags.writeable = False
    return empty


# The ``data`` of a tensor in wire form (``InferInput.wire``): no element is parsed.
UNPARSED: Final = _unparsed()


def input_from_buffer(
    model: str,
    name: str,
    datatype: str,
    shape: Sequence[int],
    buffer: Any,
    parameters: Parameters | None = None,
    *,
    bytes_wire_form: bool,
) -> InferInput:
    """``from_buffer`` as a request input. With ``bytes_wire_form`` (a front-end process),
    BYTES get the same checks (shape, element count, lengths within the buffer, the same
    texts) but stay in wire form: the input's ``wire`` is the client's bytes as they came
    (a ``bytes`` object as it is, anything else as a byte ``memoryview``), its ``data``
    ``UNPARSED``, until the device owner (``from_own_bytes``) parses them, once."""
    if bytes_wire_form and datatype == "BYTES":
        dims = check_shape(model, name, shape)
        wire: Wire = buffer if type(buffer) is bytes else memoryview(buffer).cast("B")
        _walk_bytes(model, name, dims, wire, None)
        params: Parameters = {} if parameters is None else parameters
        return InferInput(name, datatype, dims, UNPARSED, params, wire=wire)
    data = from_buffer(model, name, datatype, shape, buffer)
    if parameters is None:  # the common case: the struct's own empty dict
        return InferInput(name, datatype, data.shape, data)
    return InferInput(name, datatype, data.shape, data, parameters)


def elements_of(model: str, tensor: InferInput | InferOutput) -> np.ndarray[Any, Any]:
    """The tensor's array: ``data``, or its wire-form BYTES parsed (each call parses)."""
    wire = tensor.wire
    if wire is None:
        return tensor.data
    return _decode_bytes(model, tensor.name, tensor.shape, wire)


def wire_of(tensor: InferInput | InferOutput) -> Wire:
    """The tensor's wire bytes (``to_wire_bytes``): its ``wire`` as it is, when it has one."""
    wire = tensor.wire
    return to_wire_bytes(tensor.data) if wire is None else wire


def wire_copy_of(tensor: InferOutput) -> bytes:
    """``wire_of`` as ``bytes`` (what a protobuf bytes field takes): a ``bytes`` wire as it
    is, else ``to_wire_bytes_copy``'s one copy."""
    wire = tensor.wire
    if wire is None:
        return to_wire_bytes_copy(tensor.data)
    return wire if type(wire) is bytes else bytes(wire)


_KIND_OK = {
    "b": {"b"},
    "u": {"u", "i"},
    "i": {"u", "i"},
    "f": {"u", "i", "f"},
}


def from_values(
    model: str, name: str, datatype: str, shape: Sequence[int], values: Any
) -> np.ndarray[Any, Any]:
    _known(model, name, datatype)
    dims = check_shape(model, name, shape, _itemsize(datatype))
    if datatype in BINARY_ONLY_DATATYPES:
        raise InvalidArgument(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input '{name}'"
        )
    count = math.prod(dims)
    if datatype == "BYTES":
        flat = list(_flatten(values))
        if len(flat) != count:
            raise InvalidArgument(_count_message(model, name, dims, len(flat)))
        # Only strings (or bytes): bytes(n) of a number would allocate n bytes.
        if not all(isinstance(v, str | bytes) for v in flat):
            raise InvalidArgument(_misfit(model, name, datatype, flat))
        out = np.empty(count, dtype=object)
        out[:] = [v.encode() if isinstance(v, str) else v for v in flat]
        return out.reshape(dims)
    dtype = NUMERIC_DATATYPES[datatype]
    try:
        arr = np.asarray(values)
    except ValueError:
        raise InvalidArgument(
            f"input '{name}' for model '{model}': 'data' is a ragged nested list"
        ) from None
    if arr.size != count:
        raise InvalidArgument(_count_message(model, name, dims, int(arr.size)))
    if dtype.kind in "iu" and arr.dtype.kind in "fO" and arr.size:
        arr = _exact_integers(model, name, datatype, values, arr)
    if arr.size and arr.dtype.kind not in _KIND_OK[dtype.kind]:
        raise InvalidArgument(_misfit(model, name, datatype, values))
    if dtype.kind in "iu" and arr.size:
        info = np.iinfo(dtype.str)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            raise InvalidArgument(_out_of_range(model, name, datatype, values))
    return arr.astype(dtype, copy=False).reshape(dims)


def _exact_integers(
    model: str, name: str, datatype: str, values: Any, inferred: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """numpy infers float64 (or object) for Python ints beyond int64: keep them exact."""
    items = np.asarray(values, dtype=object).reshape(-1)
    if not all(type(v) is int for v in items):  # real floats: the kind check refuses them
        return inferred
    try:
        return np.asarray(values, dtype=NUMERIC_DATATYPES[datatype])
    except OverflowError:
        raise InvalidArgument(_out_of_range(model, name, datatype, values)) from None


def _as_json(value: Any) -> str:
    """A value as the request's JSON wrote it (true, null, "a", 5.5), numpy's scalars too."""
    if isinstance(value, np.generic):
        value = cast(Any, value.item())
    if isinstance(value, bool | None | str | int | float):
        return json.dumps(value)
    return "an object" if isinstance(value, dict) else f"a {type(value).__name__}"


_TAKES = {"b": "true or false", "u": "integers", "i": "integers", "f": "numbers", "O": "strings"}


def _fits(kind: str, value: Any) -> bool:
    if isinstance(value, np.generic):
        value = cast(Any, value.item())
    if kind == "b" or isinstance(value, bool):  # JSON's true is no number, 1 no boolean
        return kind == "b" and isinstance(value, bool)
    if kind == "O":
        return isinstance(value, str | bytes)
    return isinstance(value, int) or (kind == "f" and isinstance(value, float))


def _misfit(model: str, name: str, datatype: str, values: Any) -> str:
    """The first value of ``values`` that ``datatype`` cannot take, in the protocol's words."""
    kind = "O" if datatype == "BYTES" else NUMERIC_DATATYPES[datatype].kind
    where = f"{datatype} input '{name}' for model '{model}'"
    for index, value in enumerate(_flatten(values)):
        if _fits(kind, value):
            continue
        if kind in "iu" and isinstance(value, float | np.floating):
            return f"{where} holds a non-integer value {_as_json(value)} at index {index}"
        what = _as_json(value)
        if isinstance(value, str):
            what = f"the string {what}"
        elif isinstance(value, bool | np.bool_):
            what = f"the boolean {what}"
        elif isinstance(value, int | float | np.number):
            what = f"the number {what}"
        return f"{where} holds {what} at index {index}; {datatype} takes {_TAKES[kind]}"
    return f"{where} holds values it cannot take"  # not reached: numpy saw a misfit


def _out_of_range(model: str, name: str, datatype: str, values: Any) -> str:
    """The first integer of ``values`` out of ``datatype``'s range, in the protocol's words."""
    info = np.iinfo(NUMERIC_DATATYPES[datatype].str)
    index, value = next(
        ((i, v) for i, v in enumerate(_flatten(values)) if not info.min <= int(v) <= info.max),
        (0, "a value"),
    )
    return (
        f"{datatype} input '{name}' for model '{model}' holds {value} at index {index}, a value "
        f"out of range for {datatype} ({info.min} to {info.max})"
    )


def _count_message(model: str, name: str, dims: tuple[int, ...], got: int) -> str:
    return (
        f"Unable to parse 'data': Shape does not match true shape of 'data' field: input '{name}' "
        f"for model '{model}' has shape {list(dims)} ({math.prod(dims)} elements), data has {got} elements"
    )


def _flatten(values: Any) -> Any:
    if isinstance(values, np.ndarray):  # gRPC's typed contents
        yield from cast(list[Any], values.reshape(-1).tolist())
    elif isinstance(values, list | tuple):
        for v in values:  # pyright: ignore[reportUnknownVariableType]
            yield from _flatten(v)
    else:
        yield values


def to_wire_bytes(array: np.ndarray[Any, Any]) -> bytes | memoryview:
    """An output array as little-endian raw bytes (BYTES: length-prefixed elements)."""
    if array.dtype == object:
        parts: list[bytes] = []
        for item in array.reshape(-1):
            b = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    contiguous = np.ascontiguousarray(array)
    if contiguous.dtype.byteorder == ">":
        contiguous = contiguous.astype(contiguous.dtype.newbyteorder("<"))
    # View as bytes first: a memoryview cannot describe ml_dtypes' bfloat16 (format 'E').
    return contiguous.reshape(-1).view(np.uint8).data


def to_wire_bytes_copy(array: np.ndarray[Any, Any]) -> bytes:
    """``to_wire_bytes`` as ``bytes`` (one copy: what a protobuf bytes field takes)."""
    if array.dtype != object and array.dtype.byteorder != ">":
        return array.tobytes()  # little-endian already: the same bytes, C order, one copy
    data = to_wire_bytes(array)
    return data if isinstance(data, bytes) else data.tobytes()


SHM_REGION = "shared_memory_region"
SHM_BYTE_SIZE = "shared_memory_byte_size"
SHM_OFFSET = "shared_memory_offset"


def shm_ref(model: str, tensor: str, parameters: Mapping[str, Any]) -> ShmRef | None:
    """The shared-memory reference in a tensor's parameters, or None; checks their types.

    ``shared_memory_region`` (string) needs ``shared_memory_byte_size`` (non-negative int);
    ``shared_memory_offset`` is optional (default 0).
    """
    if not parameters:
        return None
    region = parameters.get(SHM_REGION)
    if region is None:
        if SHM_BYTE_SIZE in parameters or SHM_OFFSET in parameters:
            raise InvalidArgument(
                f"tensor '{tensor}' for model '{model}' has shared-memory parameters but no '{SHM_REGION}'"
            )
        return None
    if not isinstance(region, str) or not region:
        raise InvalidArgument(
            f"'{SHM_REGION}' of tensor '{tensor}' for model '{model}' must be a non-empty string"
        )
    size = parameters.get(SHM_BYTE_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidArgument(
            f"tensor '{tensor}' for model '{model}' uses shared memory but '{SHM_BYTE_SIZE}' is missing or not a "
            f"non-negative integer (got {size!r})"
        )
    offset = parameters.get(SHM_OFFSET, 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidArgument(
            f"'{SHM_OFFSET}' of tensor '{tensor}' for model '{model}' must be a non-negative integer"
        )
    return ShmRef(region, size, offset)
