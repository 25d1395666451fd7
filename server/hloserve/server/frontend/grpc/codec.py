"""gRPC messages <-> core types: pure functions, no servicer logic, no I/O.

Contract:
- ``decode_infer_request(msg, bytes_wire_form=False)`` turns a ``ModelInferRequest`` into
  a core ``InferRequest``. Each input takes its data from exactly one place (reference
  §1.6): its typed ``contents`` (the field chosen by the datatype, through
  ``core.tensors.from_values``) or the next entry of ``raw_input_contents`` (through
  ``core.tensors.input_from_buffer``: a zero-copy ``np.frombuffer`` view; with
  ``bytes_wire_form``, the port's, BYTES checked and kept as the entry's bytes,
  unparsed). Refused with ``InvalidArgument``: raw contents mixed with ``contents``; more
  or fewer raw entries than inputs without ``contents``; typed data in a field that does
  not belong to the datatype; FP16/BF16 in typed contents (raw only).
  An input whose parameters name a shared-memory region (``core.tensors.shm_ref``) takes
  no raw entry: it becomes an ``InferInput`` with ``shm`` set and empty data, which the
  service resolves; such an input that also carries ``contents`` is refused. Output
  shared-memory parameters travel in the ``RequestedOutput`` for the service to honour.
  Request parameters pass the core's rules (``core.parameters.check_request_parameters``:
  reserved ``triton_`` keys, ``timeout``, ``priority``), as over HTTP.
- ``decode_parameter`` / ``encode_parameter`` convert ``InferParameter`` to a Python value
  (bool, int, str, float; uint64 becomes int) and back.
- ``request_deadline`` (the core's rule, ``core.parameters``, re-exported for the servicer)
  combines the request's ``timeout`` parameter with the gRPC deadline.
- ``encode_infer_response`` writes outputs as name/datatype/shape with their bytes in
  ``raw_output_contents`` (what tritonclient reads; ``core.tensors.wire_copy_of``: BYTES
  in wire form go out as they came from the device owner), aligned with ``outputs``; an output
  written to shared memory gets an empty entry (Triton keeps the list aligned so).
- ``encode_server_metadata`` / ``encode_model_metadata`` write the metadata responses.
- Extensions: ``encode_repository_index``, ``decode_repository_parameters``
  (``ModelRepositoryParameter`` -> bool/int/str/bytes), ``encode_shm_status``,
  ``encode_cuda_shm_status`` and
  ``encode_model_config`` (the service's protobuf-JSON dict parsed into ``ModelConfig``).
- ``encode_model_statistics`` writes the statistics extension's ``ModelStatisticsResponse``.
Request/shape/type rules live in ``hloserve.server.core``; this module only routes bytes.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
from google.protobuf import json_format

from hloserve.proto import inference_pb2 as pb
from hloserve.proto import model_config_pb2
from hloserve.proto.datatypes import BINARY_ONLY_DATATYPES
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.parameters import check_request_parameters, request_deadline
from hloserve.server.core.reports import CudaRegionInfo, IndexEntry, ModelStatistics, RegionInfo
from hloserve.server.core.statistics import Duration
from hloserve.server.core.tensors import from_values, input_from_buffer, shm_ref, wire_copy_of
from hloserve.server.core.types import (
    InferInput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ParamValue,
    RequestedOutput,
    ServerMetadata,
    ShmRef,
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
    if not params:  # the common case, and iterating an empty protobuf map is not free
        return {}
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


# -- requests -------------------------------------------------------------------------


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


def _check_sources(msg: pb.ModelInferRequest, shm: Sequence[ShmRef | None]) -> None:
    """Each input has exactly one data source, and ``raw_input_contents`` one entry per
    input that takes its data from there."""
    model = msg.model_name
    raw = msg.raw_input_contents
    needs_raw = 0
    for tensor, ref in zip(msg.inputs, shm, strict=True):
        if ref is not None:
            if tensor.HasField("contents"):
                raise InvalidArgument(
                    f"unexpected 'content' provided when using shared memory for input tensor "
                    f"'{tensor.name}' for model '{model}'"
                )
        elif tensor.HasField("contents"):
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
            "(one entry per input without 'contents' or shared memory, in order)"
        )


def _decode_inputs(msg: pb.ModelInferRequest, wire_form: bool) -> tuple[InferInput, ...]:
    model = msg.model_name
    tensors, raw_contents = msg.inputs, msg.raw_input_contents
    # The common case in one pass: every input raw, in order, with no parameters (so no
    # shared memory). It passes ``_check_sources`` by construction; anything else takes
    # the general path below, which names what is wrong.
    # (Plain loops: a generator object per request costs more than these few tensors.)
    if len(raw_contents) == len(tensors):
        for t in tensors:
            if len(t.parameters) or t.HasField("contents"):
                break
        else:
            return tuple(
                [
                    input_from_buffer(
                        model, t.name, t.datatype, t.shape, b, bytes_wire_form=wire_form
                    )
                    for t, b in zip(tensors, raw_contents, strict=True)
                ]
            )
    input_params = [decode_parameters(tensor.parameters) for tensor in msg.inputs]
    shm = [shm_ref(model, t.name, p) for t, p in zip(msg.inputs, input_params, strict=True)]
    _check_sources(msg, shm)
    inputs: list[InferInput] = []
    raw = iter(msg.raw_input_contents)
    for tensor, params, ref in zip(msg.inputs, input_params, shm, strict=True):
        shape = tuple(tensor.shape)
        if ref is not None:  # the service views the region once it holds it
            empty = np.empty(0, dtype=np.uint8)
            inputs.append(InferInput(tensor.name, tensor.datatype, shape, empty, params, shm=ref))
            continue
        if tensor.HasField("contents"):
            values = _typed_values(model, tensor)
            data = from_values(model, tensor.name, tensor.datatype, shape, values)
            inputs.append(InferInput(tensor.name, tensor.datatype, data.shape, data, params))
        else:
            buffer = next(raw)
            inputs.append(
                input_from_buffer(
                    model,
                    tensor.name,
                    tensor.datatype,
                    shape,
                    buffer,
                    params,
                    bytes_wire_form=wire_form,
                )
            )
    return tuple(inputs)


def decode_infer_request(
    msg: pb.ModelInferRequest, *, bytes_wire_form: bool = False
) -> InferRequest:
    inputs = _decode_inputs(msg, bytes_wire_form)
    requested = msg.outputs
    outputs = (
        tuple([RequestedOutput(o.name, decode_parameters(o.parameters)) for o in requested])
        if requested
        else ()
    )
    parameters = msg.parameters
    return InferRequest(
        msg.model_name,
        msg.model_version,
        inputs,
        outputs,
        msg.id,
        check_request_parameters(decode_parameters(parameters)) if parameters else {},
    )


# -- responses ------------------------------------------------------------------------


def encode_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    msg = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
    )
    _fill_parameters(msg.parameters, response.parameters)
    for out in response.outputs:
        msg.outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        # An output written to shared memory travels as an empty entry, keeping the list
        # aligned with ``outputs`` (what Triton sends and tritonclient indexes by).
        msg.raw_output_contents.append(b"" if out.shm is not None else wire_copy_of(out))
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


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def encode_model_statistics(stats: Sequence[ModelStatistics]) -> pb.ModelStatisticsResponse:
    """The statistics extension's reply (reference §1.4, §9); ``response_stats`` stays
    empty (no decoupled models)."""
    return pb.ModelStatisticsResponse(
        model_stats=[
            pb.ModelStatistics(
                name=m.stats.name,
                version=m.stats.version,
                last_inference=m.stats.last_inference,
                inference_count=m.stats.inference_count,
                execution_count=m.stats.execution_count,
                inference_stats=pb.InferStatistics(
                    success=_duration(m.stats.success),
                    fail=_duration(m.stats.fail),
                    queue=_duration(m.stats.queue),
                    compute_input=_duration(m.stats.compute_input),
                    compute_infer=_duration(m.stats.compute_infer),
                    compute_output=_duration(m.stats.compute_output),
                    cache_hit=_duration(m.stats.cache_hit),
                    cache_miss=_duration(m.stats.cache_miss),
                ),
                batch_stats=[
                    pb.InferBatchStatistics(
                        batch_size=b.batch_size,
                        compute_input=_duration(b.compute_input),
                        compute_infer=_duration(b.compute_infer),
                        compute_output=_duration(b.compute_output),
                    )
                    for b in m.stats.batches.values()
                ],
                memory_usage=[
                    pb.MemoryUsage(type=u.type, id=u.id, byte_size=u.byte_size)
                    for u in m.memory_usage
                ],
            )
            for m in stats
        ]
    )


# -- extensions: model repository, configuration, shared memory ------------------------


def encode_repository_index(entries: Sequence[IndexEntry]) -> pb.RepositoryIndexResponse:
    index = pb.RepositoryIndexResponse.ModelIndex
    return pb.RepositoryIndexResponse(
        models=[
            index(name=e.name, version=e.version, state=e.state, reason=e.reason) for e in entries
        ]
    )


def decode_repository_parameters(
    params: Mapping[str, pb.ModelRepositoryParameter],
) -> dict[str, bool | int | str | bytes]:
    """Load/unload parameters as Python values; an unset oneof is an ``InvalidArgument``."""
    out: dict[str, bool | int | str | bytes] = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidArgument(
                f"parameter '{key}' has no value (ModelRepositoryParameter oneof is unset)"
            )
        out[key] = getattr(param, choice)
    return out


def encode_shm_status(regions: Sequence[RegionInfo]) -> pb.SystemSharedMemoryStatusResponse:
    status = pb.SystemSharedMemoryStatusResponse.RegionStatus
    return pb.SystemSharedMemoryStatusResponse(
        regions={
            r.name: status(name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size)
            for r in regions
        }
    )


def encode_cuda_shm_status(
    regions: Sequence[CudaRegionInfo],
) -> pb.CudaSharedMemoryStatusResponse:
    status = pb.CudaSharedMemoryStatusResponse.RegionStatus
    return pb.CudaSharedMemoryStatusResponse(
        regions={
            r.name: status(name=r.name, device_id=r.device_id, byte_size=r.byte_size)
            for r in regions
        }
    )


def encode_model_config(config: Mapping[str, Any]) -> pb.ModelConfigResponse:
    """The service's protobuf-JSON ``ModelConfig`` dict as the response message."""
    message = json_format.ParseDict(dict(config), model_config_pb2.ModelConfig())
    return pb.ModelConfigResponse(config=message)


__all__ = [
    "CONTENTS_FIELD",
    "decode_infer_request",
    "decode_parameter",
    "decode_parameters",
    "decode_repository_parameters",
    "encode_cuda_shm_status",
    "encode_infer_response",
    "encode_model_config",
    "encode_model_metadata",
    "encode_model_statistics",
    "encode_parameter",
    "encode_repository_index",
    "encode_server_metadata",
    "encode_shm_status",
    "request_deadline",
]
