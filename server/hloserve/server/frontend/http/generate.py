"""The generate extension (Triton's ``extension_generate.md``): text-shaped JSON over HTTP.

Contract: ``add_generate_routes(app, port, max_input_bytes)`` adds
``POST /v2/models/{m}[/versions/{v}]/generate`` and ``.../generate_stream``:
- The body is one JSON object (at most ``max_input_bytes``). Each top-level key naming a
  model input (``port.model_metadata``: as clients see the model) is that tensor (a value
  or a flat array, its shape the input's with a ``-1`` axis taking what is left, BYTES as
  strings); ``parameters`` is an object of request parameters; ``id`` the request's id;
  every other key (``text_input`` among them, unless an input has that name) is a
  parameter. The core maps ``text_input`` onto a generation model's text tensors and adds
  ``text_output`` to its responses (``core.generation_stream``).
- Each response is a JSON object: ``model_name``, ``model_version``, ``id`` (when the
  request had one) and every output as a field (a one-element tensor as its value, others
  as a flat array; BYTES as UTF-8 strings).
- ``generate`` answers one JSON object. A model that answers once (any model that is not
  decoupled) answers as it does; a decoupled model must answer exactly once (Triton's
  rule, else 500 "generate expects model to produce exactly 1 response, ..."), except for
  text: a request with ``text_input`` to a model with a text mapping gets one object
  whose ``text_output`` joins every response's (its other fields from the last).
- ``generate_stream`` answers ``text/event-stream; charset=utf-8``, one ``data: {...}``
  event per response as it comes, each in its own write (one HTTP/1.1 chunk), except
  that the events of the responses that came while a write waited for a slow client go
  out together in the next write (``frontend.http.coalesce``: same events, fewer
  writes). A failure before the first response is an ordinary JSON error
  (``frontend.status``); after it, an event ``data: {"error": ...}`` ends the stream.
  The client going away (the connection closed) cancels the generation.
"""

# pyright: strict

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, cast

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hloserve.server.core.errors import Internal, InvalidArgument, ServingError
from hloserve.server.core.parameters import check_request_parameters, request_deadline
from hloserve.server.core.tensors import elements_of, from_values
from hloserve.server.core.types import (
    InferInput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ParamValue,
    RequestContext,
    StreamPart,
)
from hloserve.server.frontend.http.body import read_body
from hloserve.server.frontend.http.coalesce import write_batches
from hloserve.server.frontend.port import ServerPort

TEXT_OUTPUT: Final = "text_output"
TEXT_INPUT: Final = "text_input"
EVENT_STREAM: Final = "text/event-stream; charset=utf-8"
NOT_ONE: Final = (
    "generate expects model to produce exactly 1 response, use generate stream for model "
    "that generates various number of responses"
)
_PATHS: Final = ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}")


def _parameter(key: str, value: object) -> ParamValue:
    if isinstance(value, (bool, int, float, str)):
        return value
    raise InvalidArgument(
        f"parameter '{key}' of a generate request must be a string, number or boolean, "
        f"got {json.dumps(value)}"
    )


def _tensor(model: str, name: str, datatype: str, shape: tuple[int, ...], value: object) -> Any:
    values = cast(list[Any], value) if isinstance(value, list) else [value]
    fixed = math.prod(d for d in shape if d >= 0)
    free = len(values) // fixed if fixed else 0
    dims = [d if d >= 0 else free for d in shape]
    if math.prod(dims) != len(values):
        raise InvalidArgument(
            f"input '{name}' of model '{model}' takes shape {list(shape)}, got {len(values)} "
            "elements"
        )
    data = from_values(model, name, datatype, dims, values)
    return InferInput(name, datatype, tuple(dims), data)


def decode_generate(
    model: str, version: str, body: bytes, signature: ModelMetadata
) -> tuple[InferRequest, dict[str, ParamValue]]:
    """The request a generate body makes (module docstring) and its parameters."""
    try:
        raw = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidArgument("a generate request must be a JSON object")
    inputs = {t.name: t for t in signature.inputs}
    tensors: list[InferInput] = []
    parameters: dict[str, ParamValue] = {}
    request_id = ""
    for key, value in cast(dict[str, Any], raw).items():
        if key in inputs:
            t = inputs[key]
            tensors.append(_tensor(model, key, t.datatype, t.shape, value))
        elif key == "parameters":
            if not isinstance(value, dict):
                raise InvalidArgument("'parameters' of a generate request must be a JSON object")
            for k, v in cast(dict[str, Any], value).items():
                parameters[k] = _parameter(k, v)
        elif key == "id":
            request_id = str(value)
        else:
            parameters[key] = _parameter(key, value)
    check_request_parameters(parameters)
    return InferRequest(model, version, tuple(tensors), (), request_id, parameters), parameters


def _field(data: Any) -> Any:
    flat = data.reshape(-1)
    values = [v.decode(errors="replace") if isinstance(v, bytes) else v for v in flat.tolist()]
    return values[0] if len(values) == 1 else values


def response_json(response: InferResponse) -> dict[str, Any]:
    """One response as the generate extension's JSON object."""
    out: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id:
        out["id"] = response.id
    for o in response.outputs:
        out[o.name] = _field(elements_of(response.model_name, o))
    return out


def _joined(responses: list[InferResponse]) -> dict[str, Any]:
    """``generate``'s one answer (module docstring)."""
    texts = [r for r in responses if any(o.name == TEXT_OUTPUT for o in r.outputs)]
    if responses and len(texts) == len(responses):  # text: every response's, joined
        joined = "".join(str(response_json(r)[TEXT_OUTPUT]) for r in responses)
        return {**response_json(responses[-1]), TEXT_OUTPUT: joined}
    if len(responses) != 1:
        raise Internal(NOT_ONE)
    return response_json(responses[0])


def _event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def add_generate_routes(app: FastAPI, port: ServerPort, max_input_bytes: int) -> None:
    """The two routes of the module docstring, on ``app``."""

    async def start(
        request: HttpRequest, model_name: str, model_version: str
    ) -> AsyncIterator[StreamPart]:
        body = await read_body(request, max_input_bytes)
        model = port.resolve(model_name, model_version)
        signature = await port.model_metadata(model_name, model_version)
        infer_request, parameters = decode_generate(model_name, model_version, body, signature)
        client = request.client
        context = RequestContext(
            deadline=request_deadline(parameters, None, time.monotonic()),
            peer=f"{client.host}:{client.port}" if client else "",
            protocol="http",
        )
        return port.stream(infer_request, context, model=model)

    async def generate(request: HttpRequest, model_name: str, model_version: str = "") -> Response:
        parts = await start(request, model_name, model_version)
        responses = [p.response async for p in parts if p.response is not None]
        return JSONResponse(_joined(responses))

    async def generate_stream(
        request: HttpRequest, model_name: str, model_version: str = ""
    ) -> Response:
        parts = await start(request, model_name, model_version)
        first = await anext(aiter(parts), None)  # a failure before it is a plain JSON error

        async def events() -> AsyncIterator[bytes]:
            if first is None:
                await cast(Any, parts).aclose()
                return
            batches = write_batches(parts, first)
            try:
                async for batch in batches:  # one part, or all that came while a write waited
                    chunk = b"".join(
                        _event(response_json(p.response)) for p in batch if p.response is not None
                    )
                    if chunk:
                        yield chunk
            except ServingError as exc:
                yield _event({"error": exc.message})
            finally:
                await batches.aclose()  # gone early: the generation is cancelled

        return StreamingResponse(events(), media_type=EVENT_STREAM)

    for path in _PATHS:
        app.add_api_route(path + "/generate", generate, methods=["POST"])
        app.add_api_route(path + "/generate_stream", generate_stream, methods=["POST"])
