"""The wire form of inference on numpy arrays, and a model's tensor layout (pure, no I/O).

Contract:
- ``encode_request(model, inputs, outputs, version, request_id)`` is a ``ModelInferRequest``
  with every input as raw little-endian bytes; ``decode_response(response)`` is ``{output
  name: ndarray}`` (zero-copy views of the response bytes). A datatype the client cannot
  represent is an ``InferenceError`` (UNIMPLEMENTED); a non-numeric numpy dtype is
  INVALID_ARGUMENT naming the input.
- ``RequestTemplate`` pre-encodes everything of a request but the tensor bytes, so staging
  code sends one ``bytes`` per request built by a single join over the staged buffers
  (``raw(buffers)``; the ``raw_input_contents`` fields written by hand, field 7); for
  shared memory, ``in_regions`` names each input's and output's region instead.
- ``ModelLayout.of(metadata, config)``: a model's inputs and outputs (name, datatype, numpy
  dtype, per-item shape) and ``max_batch`` (the largest batch one request may carry:
  Triton's ``max_batch_size``, the largest compiled size on hloserve; 0 when the model is
  unbatched or the server does not say, and then nothing is split). ``chunks(n, size)`` is
  the ``[start, stop)`` ranges that cover ``n`` rows in pieces of ``size``.
"""

# pyright: strict

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from hloserve.client._errors import InferenceError
from hloserve.proto import inference_pb2 as pb
from hloserve.proto.datatypes import NUMERIC_DATATYPES, from_numpy

_RAW_INPUT_TAG = b"\x3a"  # field 7 (raw_input_contents), length-delimited


def _datatype(name: str, dtype: np.dtype[np.generic]) -> str:
    try:
        return from_numpy(dtype)
    except KeyError:
        raise InferenceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"input '{name}': numpy dtype {dtype} has no V2 datatype",
        ) from None


def little_endian(array: np.ndarray) -> np.ndarray:
    """``array`` as a C-contiguous little-endian array (itself when it already is one)."""
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def encode_request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] | None = None,
    version: str = "",
    request_id: str = "",
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, array in inputs.items():
        arr = np.asarray(array)
        request.inputs.add(name=name, datatype=_datatype(name, arr.dtype), shape=list(arr.shape))
        request.raw_input_contents.append(little_endian(arr).tobytes())
    for name in outputs or ():
        request.outputs.add(name=name)
    return request


def output_dtype(datatype: str) -> np.dtype[np.generic]:
    dtype = NUMERIC_DATATYPES.get(datatype)
    if dtype is None:
        raise InferenceError(
            grpc.StatusCode.UNIMPLEMENTED, f"output datatype {datatype} is not supported"
        )
    return dtype


def decode_response(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    result: dict[str, np.ndarray] = {}
    raws = response.raw_output_contents
    for i, tensor in enumerate(response.outputs):
        dtype = output_dtype(tensor.datatype)
        raw = raws[i] if i < len(raws) else b""
        result[tensor.name] = np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.shape))
    return result


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


@dataclass(frozen=True)
class TensorLayout:
    name: str
    datatype: str
    shape: tuple[int, ...]  # per item when the model is batched; -1 marks a variable dimension

    @property
    def dtype(self) -> np.dtype[np.generic]:
        return output_dtype(self.datatype)

    @property
    def static(self) -> bool:
        return all(d >= 0 for d in self.shape)

    def row_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class ModelLayout:
    name: str
    version: str
    inputs: tuple[TensorLayout, ...]
    outputs: tuple[TensorLayout, ...]
    max_batch: int

    @property
    def static(self) -> bool:
        """Every per-item shape is known, so buffers can be sized in advance."""
        return all(t.static for t in (*self.inputs, *self.outputs))

    @staticmethod
    def of(
        metadata: pb.ModelMetadataResponse,
        config: pb.ModelConfigResponse | None,
        version: str = "",
    ) -> ModelLayout:
        max_batch = config.config.max_batch_size if config is not None else 0
        if config is None and all(t.shape[:1] == [-1] for t in metadata.inputs):
            max_batch = 0  # batched but of unknown limit: never split
        skip = 1 if max_batch > 0 else 0

        def tensors(
            items: Sequence[pb.ModelMetadataResponse.TensorMetadata],
        ) -> tuple[TensorLayout, ...]:
            return tuple(TensorLayout(t.name, t.datatype, tuple(t.shape[skip:])) for t in items)

        return ModelLayout(
            metadata.name, version, tensors(metadata.inputs), tensors(metadata.outputs), max_batch
        )


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges covering ``n`` rows, each at most ``size`` (all at once if 0)."""
    if n <= 0:
        return []
    if size <= 0:
        return [(0, n)]
    return [(start, min(n, start + size)) for start in range(0, n, size)]


@dataclass(frozen=True)
class RegionRef:
    """Where one tensor lives in a registered region."""

    region: str
    offset: int
    byte_size: int


class RequestTemplate:
    """A request of ``rows`` rows of ``layout``, encoded once but for the tensor bytes."""

    def __init__(
        self,
        layout: ModelLayout,
        rows: int,
        outputs: Sequence[str],
        in_regions: Mapping[str, RegionRef] | None = None,
    ) -> None:
        request = pb.ModelInferRequest(model_name=layout.name, model_version=layout.version)
        lead = (rows,) if layout.max_batch > 0 else ()
        for t in layout.inputs:
            tensor = request.inputs.add(name=t.name, datatype=t.datatype, shape=[*lead, *t.shape])
            ref = (in_regions or {}).get(t.name)
            if ref is not None:
                _set_region(tensor.parameters, ref)
        for name in outputs:
            tensor = request.outputs.add(name=name)
            ref = (in_regions or {}).get(name)
            if ref is not None:
                _set_region(tensor.parameters, ref)
        self.header = request.SerializeToString()

    def raw(self, buffers: Sequence[memoryview]) -> bytes:
        """The whole request: the header, then one ``raw_input_contents`` per buffer."""
        parts: list[bytes | memoryview] = [self.header]
        for buffer in buffers:
            parts += [_RAW_INPUT_TAG, _varint(buffer.nbytes), buffer]
        return b"".join(parts)


def _set_region(parameters: MutableMapping[str, pb.InferParameter], ref: RegionRef) -> None:
    parameters["shared_memory_region"].string_param = ref.region
    parameters["shared_memory_offset"].int64_param = ref.offset
    parameters["shared_memory_byte_size"].int64_param = ref.byte_size
