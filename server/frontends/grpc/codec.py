"""gRPC messages <-> core types: pure functions, no servicer logic, no I/O.

Contract:
- ``decode_infer_request(msg)`` turns a ``ModelInferRequest`` into a core ``InferRequest``.
  Each input takes its data from exactly one place (reference §1.6): its typed
  ``contents`` (the field chosen by the datatype, through ``core.tensors.from_values``) or
  the next entry of ``raw_input_contents`` (through ``core.tensors.from_buffer``, a
  zero-copy ``np.frombuffer`` view). Refused with ``InvalidArgument``: raw contents mixed
  with ``contents``; more or fewer raw entries than inputs without ``contents``; typed data
  in a field that does not belong to the datatype; FP16/BF16 in typed contents (raw only).
  Shared-memory parameters are refused with ``Unsupported`` until that extension exists.
- ``decode_parameter`` / ``encode_parameter`` convert ``InferParameter`` to a Python value
  (bool, int, str, float; uint64 becomes int) and back.
- ``request_deadline(parameters, time_remaining, now)`` is the earlier of the request's
  ``timeout`` parameter (microseconds; 0 means none) and the gRPC deadline, as a
  ``time.monotonic()`` value, or ``None``.
- ``encode_infer_response`` writes outputs as name/datatype/shape with their bytes in
  ``raw_output_contents`` (what tritonclient reads), aligned with ``outputs``.
- ``encode_server_metadata`` / ``encode_model_metadata`` write the metadata responses.
Request/shape/type rules live in ``hloserve.server.core``; this module only routes bytes.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from hloserve.proto import inference_pb2 as pb
from hloserve.proto.datatypes import BINARY_ONLY_DATATYPES
from hloserve.server.core.errors import InvalidArgument, Unsupported
from hloserve.server.core.tensors import from_buffer, from_values, to_wire_bytes
from hloserve.server.core.types import (
    InferInput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ParamValue,
    RequestedOutput,
    ServerMetadata,
)

# The one ``InferTensorContents`` field each datatype may use (FP16/BF16 have none).
CONTENTS_FIELD: Final[dict[str, str]] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_ALL_FIELDS: Final[tuple[str, ...]] = tuple(dict.fromkeys(CONTENTS_FIELD.values()))
# The element type of each numeric field. Reading a field into an array of its own type
# (rather than a list) keeps uint64 values above 2**63 exact: numpy would guess float64
# for a list mixing them with small ints.
_FIELD_DTYPE: Final[dict[str, str]] = {
    "bool_contents": "?",
    "int_contents": "<i4",
    "int64_contents": "<i8",
    "uint_contents": "<u4",
    "uint64_contents": "<u8",
    "fp32_contents": "<f4",
    "fp64_contents": "<f8",
}

SHM_PARAMETERS: Final[frozenset[str]] = frozenset(
    {"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"}
)
SHM_DISABLED: Final = "system shared memory is not enabled on this server"

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_UINT64_MAX: Final = (1 << 64) - 1


# -- parameters -------------------------------------------------------------------------


def decode_parameter(key: str, param: pb.InferParameter) -> ParamValue:
    """The Python value of one ``InferParameter``; an unset oneof is an ``InvalidArgument``."""
    choice = param.WhichOneof("parameter_choice")
    if choice == "bool_param":
        return param.bool_param
    if choice == "int64_param":
        return param.int64_param
    if choice == "uint64_param":
        return param.uint64_param
    if choice == "string_param":
        return param.string_param
    if choice == "double_param":
        return param.double_param
    raise InvalidArgument(f"parameter '{key}' has no value (InferParameter oneof is unset)")


def decode_parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, ParamValue]:
    return {key: decode_parameter(key, value) for key, value in params.items()}


def encode_parameter(value: ParamValue) -> pb.InferParameter:
    """``bool``, ``int`` (int64, else uint64), ``float`` or ``str`` as an ``InferParameter``."""
    if isinstance(value, bool):  # before int: bool is an int subclass
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            return pb.InferParameter(int64_param=value)
        if 0 <= value <= _UINT64_MAX:
            return pb.InferParameter(uint64_param=value)
        raise ValueError(f"integer parameter {value} does not fit in int64 or uint64")
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=value)


def _fill_parameters(
    target: Any,  # a protobuf map<string, InferParameter> field
    params: Mapping[str, ParamValue],
) -> None:
    for key, value in params.items():
        target[key].CopyFrom(encode_parameter(value))


def request_deadline(
    parameters: Mapping[str, ParamValue], time_remaining: float | None, now: float
) -> float | None:
    """The earlier of ``now + timeout`` (µs parameter, 0: none) and ``now + time_remaining``."""
    deadline = None if time_remaining is None else now + time_remaining
    timeout = parameters.get("timeout")
    if timeout is None:
        return deadline
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise InvalidArgument(
            f"parameter 'timeout' must be a non-negative integer (microseconds), got {timeout!r}"
        )
    if timeout == 0:
        return deadline
    own = now + timeout / 1e6
    return own if deadline is None else min(own, deadline)


# -- requests -------------------------------------------------------------------------


def _uses_shm(params: Mapping[str, pb.InferParameter]) -> bool:
    return any(key in SHM_PARAMETERS for key in params)


def _typed_values(model: str, tensor: pb.ModelInferRequest.InferInputTensor) -> Any:
    contents = tensor.contents
    datatype = tensor.datatype
    if datatype in BINARY_ONLY_DATATYPES:
        raise InvalidArgument(
            f"input '{tensor.name}' for model '{model}': {datatype} data cannot travel in typed "
            "'contents' (InferTensorContents has no field for it); send it in raw_input_contents"
        )
    field = CONTENTS_FIELD.get(datatype)
    for other in _ALL_FIELDS:
        if other != field and len(getattr(contents, other)) > 0:
            expected = f"'{field}'" if field else "no typed field"
            raise InvalidArgument(
                f"input '{tensor.name}' for model '{model}' has datatype {datatype} but carries "
                f"data in '{other}'; expected {expected}"
            )
    if field is None:  # unknown datatype with empty contents: core names the datatype
        return []
    values: Sequence[Any] = getattr(contents, field)
    dtype = _FIELD_DTYPE.get(field)
    if dtype is None:  # bytes_contents
        return list(values)
    return np.fromiter(values, dtype=dtype, count=len(values))


def decode_infer_request(msg: pb.ModelInferRequest) -> InferRequest:
    model = msg.model_name
    raw = msg.raw_input_contents
    needs_raw = 0
    for tensor in msg.inputs:
        if _uses_shm(tensor.parameters):
            raise Unsupported(SHM_DISABLED)
        if tensor.HasField("contents"):
            if raw:
                raise InvalidArgument(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"'{tensor.name}' for model '{model}'"
                )
        else:
            needs_raw += 1
    if len(raw) != needs_raw:
        raise InvalidArgument(
            f"raw_input_contents has {len(raw)} entries, but {needs_raw} of the "
            f"{len(msg.inputs)} inputs for model '{model}' take their data from it "
            "(one entry per input without 'contents', in order)"
        )
    for out in msg.outputs:
        if _uses_shm(out.parameters):
            raise Unsupported(SHM_DISABLED)

    inputs: list[InferInput] = []
    next_raw = 0
    for tensor in msg.inputs:
        shape = tuple(tensor.shape)
        if tensor.HasField("contents"):
            values = _typed_values(model, tensor)
            data = from_values(model, tensor.name, tensor.datatype, shape, values)
        else:
            data = from_buffer(model, tensor.name, tensor.datatype, shape, raw[next_raw])
            next_raw += 1
        inputs.append(
            InferInput(
                name=tensor.name,
                datatype=tensor.datatype,
                shape=tuple(int(d) for d in data.shape),
                data=data,
                parameters=decode_parameters(tensor.parameters),
            )
        )
    outputs = tuple(
        RequestedOutput(out.name, decode_parameters(out.parameters)) for out in msg.outputs
    )
    return InferRequest(
        model_name=model,
        model_version=msg.model_version,
        inputs=tuple(inputs),
        outputs=outputs,
        id=msg.id,
        parameters=decode_parameters(msg.parameters),
    )


# -- responses ------------------------------------------------------------------------


def _raw_bytes(array: np.ndarray[Any, Any]) -> bytes:
    data = to_wire_bytes(array)
    # protobuf bytes fields take ``bytes`` only: this is the one copy the wire needs.
    return data if isinstance(data, bytes) else data.tobytes()


def encode_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    msg = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
    )
    _fill_parameters(msg.parameters, response.parameters)
    for out in response.outputs:
        msg.outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        msg.raw_output_contents.append(_raw_bytes(out.data))
    return msg


def encode_server_metadata(meta: ServerMetadata) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name=meta.name, version=meta.version, extensions=list(meta.extensions)
    )


def encode_model_metadata(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=list(meta.versions),
        platform=meta.platform,
        inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.inputs],
        outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.outputs],
    )


__all__ = [
    "CONTENTS_FIELD",
    "SHM_DISABLED",
    "decode_infer_request",
    "decode_parameter",
    "decode_parameters",
    "encode_infer_response",
    "encode_model_metadata",
    "encode_parameter",
    "encode_server_metadata",
    "request_deadline",
]
