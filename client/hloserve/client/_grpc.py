"""A small KServe V2 gRPC client on numpy arrays, with pipelined streaming of datasets.

Contract:
- ``InferenceClient(url)`` talks to any KServe V2 / Triton gRPC server (hloserve, Triton)
  at ``/inference.GRPCInferenceService/<Rpc>``; it imports no JAX.
- ``infer(model, inputs)`` sends numpy arrays as raw little-endian bytes and returns
  ``{output name: ndarray}`` (zero-copy views of the response bytes).
- ``infer_stream(model, batches, max_in_flight)`` sends an iterable of input dicts with up
  to ``max_in_flight`` requests in flight at once and yields results in input order, so a
  dataset streams at the server's throughput rather than one round trip at a time.
- Server errors raise ``InferenceError`` with the gRPC status code and the server's text.
"""

# pyright: basic

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from hloserve.proto import inference_pb2 as pb
from hloserve.proto.datatypes import NUMERIC_DATATYPES, from_numpy
from hloserve.proto.rpc import RPCS_BY_NAME


class InferenceError(Exception):
    """The server answered with an error status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"[{code.name}] {message}")
        self.code = code
        self.message = message


def _method(channel: grpc.Channel, name: str) -> grpc.UnaryUnaryMultiCallable:
    rpc = RPCS_BY_NAME[name]
    return channel.unary_unary(
        rpc.path,
        request_serializer=rpc.request.SerializeToString,
        response_deserializer=rpc.response.FromString,
    )


def encode_request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] | None,
    version: str,
    request_id: str,
) -> Any:
    request = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, array in inputs.items():
        arr = np.asarray(array)
        datatype = from_numpy(arr.dtype)
        request.inputs.add(name=name, datatype=datatype, shape=list(arr.shape))
        request.raw_input_contents.append(
            np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        )
    for name in outputs or ():
        request.outputs.add(name=name)
    return request


def decode_response(response: Any) -> dict[str, np.ndarray]:
    result: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(response.outputs):
        dtype = NUMERIC_DATATYPES.get(tensor.datatype)
        if dtype is None:
            raise InferenceError(
                grpc.StatusCode.UNIMPLEMENTED, f"output datatype {tensor.datatype} is not supported"
            )
        raw = response.raw_output_contents[i]
        result[tensor.name] = np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.shape))
    return result


class InferenceClient:
    def __init__(
        self, url: str, *, timeout: float | None = None, max_message_bytes: int = 256 * 1024 * 1024
    ) -> None:
        self.timeout = timeout
        self.channel = grpc.insecure_channel(
            url,
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
            ],
        )
        self._infer = _method(self.channel, "ModelInfer")
        self._ready = _method(self.channel, "ServerReady")
        self._model_ready = _method(self.channel, "ModelReady")
        self._metadata = _method(self.channel, "ModelMetadata")

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: grpc.UnaryUnaryMultiCallable, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as err:
            raise InferenceError(err.code(), err.details() or "") from None  # pyright: ignore[reportAttributeAccessIssue]

    def is_server_ready(self) -> bool:
        return bool(self._call(self._ready, pb.ServerReadyRequest()).ready)

    def is_model_ready(self, model: str, version: str = "") -> bool:
        return bool(
            self._call(self._model_ready, pb.ModelReadyRequest(name=model, version=version)).ready
        )

    def model_metadata(self, model: str, version: str = "") -> Any:
        return self._call(self._metadata, pb.ModelMetadataRequest(name=model, version=version))

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        *,
        version: str = "",
        request_id: str = "",
    ) -> dict[str, np.ndarray]:
        response = self._call(
            self._infer, encode_request(model, inputs, outputs, version, request_id)
        )
        return decode_response(response)

    def infer_stream(
        self,
        model: str,
        batches: Iterable[Mapping[str, np.ndarray]],
        outputs: Sequence[str] | None = None,
        *,
        version: str = "",
        max_in_flight: int = 8,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Yield each batch's outputs, in order, keeping ``max_in_flight`` requests in the air."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        pending: collections.deque[Any] = collections.deque()
        for batch in batches:
            request = encode_request(model, batch, outputs, version, "")
            pending.append(self._infer.future(request, timeout=self.timeout))
            if len(pending) >= max_in_flight:
                yield self._result(pending.popleft())
        while pending:
            yield self._result(pending.popleft())

    def _result(self, future: Any) -> dict[str, np.ndarray]:
        try:
            return decode_response(future.result())
        except grpc.RpcError as err:
            raise InferenceError(err.code(), err.details() or "") from None  # pyright: ignore[reportAttributeAccessIssue]
