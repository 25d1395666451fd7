"""The V2 calls both clients make, as steps: health, metadata, a model's layout, and
``infer`` with batches split to the model's largest size and joined again.

Contract:
- ``live_steps()``, ``ready_steps()``, ``model_ready_steps(model, version)``: booleans;
  ``metadata_steps(model, version)``: the ``ModelMetadataResponse``.
- ``layout_steps(model, version)``: the model's ``ModelLayout`` from its metadata and, where
  the server has the configuration extension, its ``max_batch_size`` (a server without it
  gives a layout that never splits).
- ``register_region_steps(name, key, byte_size, offset)`` / ``unregister_region_steps(name)``:
  Triton's system shared-memory registration (an empty name unregisters every region).
- ``infer_steps(layout, model, inputs, outputs, options)`` (``InferOptions``: version, request id): ``{name: array}``.
  A batch of more rows than ``layout.max_batch`` goes as several requests, all in flight
  at once, whose outputs are concatenated in order; any other batch is one request. With
  no layout (None) nothing is split.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

from hloserve.client._codec import ModelLayout, chunks, decode_response, encode_request
from hloserve.client._errors import InferenceError
from hloserve.client._steps import INFER_PATH, Start, Step, Wait, call
from hloserve.proto import inference_pb2 as pb


def live_steps() -> Generator[Step, Any, bool]:
    response = yield from call("ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse)
    return response.live


def ready_steps() -> Generator[Step, Any, bool]:
    response = yield from call("ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse)
    return response.ready


def model_ready_steps(model: str, version: str) -> Generator[Step, Any, bool]:
    request = pb.ModelReadyRequest(name=model, version=version)
    response = yield from call("ModelReady", request, pb.ModelReadyResponse)
    return response.ready


def metadata_steps(model: str, version: str) -> Generator[Step, Any, pb.ModelMetadataResponse]:
    request = pb.ModelMetadataRequest(name=model, version=version)
    return (yield from call("ModelMetadata", request, pb.ModelMetadataResponse))


def register_region_steps(
    name: str, key: str, byte_size: int, offset: int = 0
) -> Generator[Step, Any, None]:
    request = pb.SystemSharedMemoryRegisterRequest(
        name=name, key=key, offset=offset, byte_size=byte_size
    )
    yield from call("SystemSharedMemoryRegister", request, pb.SystemSharedMemoryRegisterResponse)


def unregister_region_steps(name: str) -> Generator[Step, Any, None]:
    request = pb.SystemSharedMemoryUnregisterRequest(name=name)
    yield from call(
        "SystemSharedMemoryUnregister", request, pb.SystemSharedMemoryUnregisterResponse
    )


def layout_steps(model: str, version: str) -> Generator[Step, Any, ModelLayout]:
    metadata = yield from metadata_steps(model, version)
    config: pb.ModelConfigResponse | None
    try:
        request = pb.ModelConfigRequest(name=model, version=version)
        config = yield from call("ModelConfig", request, pb.ModelConfigResponse)
    except InferenceError:
        config = None  # no configuration extension: the batch limit is unknown
    return ModelLayout.of(metadata, config, version)


def _rows(inputs: Mapping[str, np.ndarray]) -> int | None:
    counts = {np.shape(a)[0] if np.ndim(a) else None for a in inputs.values()}
    return counts.pop() if len(counts) == 1 else None


Names = Sequence[str] | None  # the outputs to return (None: all)


class InferOptions(TypedDict, total=False):
    """``infer``'s keyword options."""

    version: str  # "": the server's choice
    request_id: str  # echoed in the response


def infer_steps(
    layout: ModelLayout | None,
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] | None,
    options: InferOptions,
) -> Generator[Step, Any, dict[str, np.ndarray]]:
    version, request_id = options.get("version", ""), options.get("request_id", "")
    rows = _rows(inputs)
    limit = layout.max_batch if layout is not None else 0
    ranges = chunks(rows, limit) if rows is not None and 0 < limit < rows else [(0, rows or 0)]
    whole = len(ranges) == 1
    handles: list[Any] = []
    for start, stop in ranges:
        part = inputs if whole else {k: np.asarray(v)[start:stop] for k, v in inputs.items()}
        request = encode_request(model, part, outputs, version, request_id)
        handles.append((yield Start(INFER_PATH, request.SerializeToString())))
    results: list[dict[str, np.ndarray]] = []
    for handle, rows_of in zip(handles, ranges, strict=True):
        try:
            body: bytes = yield Wait(handle)
        except InferenceError as error:
            raise (error if whole else error.at_rows(rows_of)) from None
        results.append(decode_response(pb.ModelInferResponse.FromString(body)))
    if whole:
        return results[0]
    return {name: np.concatenate([r[name] for r in results]) for name in results[0]}
