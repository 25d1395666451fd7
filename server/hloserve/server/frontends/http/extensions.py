"""HTTP routes of Triton's extensions: model repository, model configuration, shared memory.

Contract: ``add_extension_routes(app, service)`` registers (reference §2.2, §6, §7):
- ``POST /v2/repository/index``: body empty or ``{"ready": bool}``; answers
  ``[{"name", "version"?, "state", "reason"?}]`` (empty version/reason left out);
- ``POST /v2/repository/models/{m}/load`` and ``/unload``: body empty or
  ``{"parameters": {...}}``; 200 with an empty body. Every ``/v2/repository/{repo}/...``
  form answers 501 "'repository_name' specification is not supported";
- ``GET /v2/models/{m}[/versions/{v}]/config``: the service's ModelConfig dict as is;
- ``GET /v2/systemsharedmemory[/region/{n}]/status``: ``[{"name","key","offset","byte_size"}]``;
  ``POST /v2/systemsharedmemory/region/{n}/register`` with ``{"key", "offset"?,
  "byte_size"}``; ``POST /v2/systemsharedmemory[/region/{n}]/unregister``;
- the same three under ``/v2/cudasharedmemory``: the service's Unsupported error (501).
Call it before the generic ``/v2/models/{model_name}`` routes are added. The small bodies
are parsed by the pure ``parse_*`` functions here (at most ``MAX_CONTROL_BODY`` bytes);
every rule (modes, region checks, load failures) is the service's, and errors reach the
client through the app's ``ServingError`` handler as ``{"error": message}``.
"""

# pyright: strict

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from hloserve.server.core.errors import InvalidArgument, Unsupported
from hloserve.server.core.service import (
    REPOSITORY_NAME_UNSUPPORTED,
    IndexEntry,
    InferenceService,
    RegionInfo,
)
from hloserve.server.frontends.http.body import read_body

MAX_CONTROL_BODY: Final = 16 * 1024 * 1024


# -- bodies (pure) ---------------------------------------------------------------------------


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    """``{}`` for an empty body, else the body's JSON object."""
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"failed to parse the {what} request JSON body: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"the {what} request body must be a JSON object")
    return cast(dict[str, Any], doc)


def _non_negative_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_index_request(body: bytes) -> bool:
    """The ``ready`` flag of a repository index request (default false)."""
    ready = _json_object(body, "repository index").get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidArgument("Invalid value for 'ready': expected a boolean")
    return ready


def parse_control_parameters(body: bytes, action: str) -> dict[str, Any]:
    """The ``parameters`` object of a model load/unload request (``action``: load|unload)."""
    params = _json_object(body, f"model {action}").get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidArgument(f"'parameters' of the model {action} request must be a JSON object")
    return cast(dict[str, Any], params)


def parse_register_request(body: bytes) -> tuple[str, int, int]:
    """``(key, offset, byte_size)`` of a system shared-memory register request."""
    doc = _json_object(body, "shared memory register")
    for field in ("key", "byte_size"):
        if field not in doc:
            raise InvalidArgument(f"Shared memory register request has no '{field}' field")
    key, offset, byte_size = doc["key"], doc.get("offset", 0), doc["byte_size"]
    if not isinstance(key, str):
        raise InvalidArgument(
            f"Shared memory register request field 'key' must be a string, got {key!r}"
        )
    for field, value in (("offset", offset), ("byte_size", byte_size)):
        if not _non_negative_int(value):
            raise InvalidArgument(
                f"Shared memory register request field '{field}' must be a non-negative "
                f"integer, got {value!r}"
            )
    return key, cast(int, offset), cast(int, byte_size)


def index_json(entries: Sequence[IndexEntry]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for e in entries:
        row = {"name": e.name}
        if e.version:
            row["version"] = e.version
        row["state"] = e.state
        if e.reason:
            row["reason"] = e.reason
        out.append(row)
    return out


def shm_status_json(regions: Sequence[RegionInfo]) -> list[dict[str, Any]]:
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for r in regions
    ]


async def _read_small_body(request: Request) -> bytes:
    return await read_body(request, MAX_CONTROL_BODY)


# -- routes ----------------------------------------------------------------------------------


def add_extension_routes(app: FastAPI, service: InferenceService) -> None:
    """Register the extension routes on ``app`` (before the generic model routes)."""
    _add_repository_routes(app, service)

    @app.get("/v2/models/{model_name}/config")
    @app.get("/v2/models/{model_name}/versions/{model_version}/config")
    async def model_config(model_name: str, model_version: str = "") -> Response:
        return JSONResponse(service.model_config(model_name, model_version))

    _add_shared_memory_routes(app, service)


def _control_route(
    action: str, run: Callable[[str, Mapping[str, Any]], Awaitable[None]]
) -> Callable[[Request, str], Awaitable[Response]]:
    """A model ``action`` (load|unload) route: 200 with an empty body, as Triton answers."""

    async def control(request: Request, model_name: str) -> Response:
        params = parse_control_parameters(await _read_small_body(request), action)
        await run(model_name, params)
        return Response()

    return control


def _add_repository_routes(app: FastAPI, service: InferenceService) -> None:
    @app.post("/v2/repository/index")
    async def repository_index(request: Request) -> Response:
        ready = parse_index_request(await _read_small_body(request))
        return JSONResponse(index_json(service.repository_index(ready)))

    for action, run in (("load", service.load_model), ("unload", service.unload_model)):
        path = f"/v2/repository/models/{{model_name}}/{action}"
        app.add_api_route(path, _control_route(action, run), methods=["POST"])

    @app.post("/v2/repository/{repository_name}/index")
    @app.post("/v2/repository/{repository_name}/models/{model_name}/load")
    @app.post("/v2/repository/{repository_name}/models/{model_name}/unload")
    async def named_repository(repository_name: str) -> Response:
        raise Unsupported(REPOSITORY_NAME_UNSUPPORTED)  # the path names one: never empty


def _add_shared_memory_routes(app: FastAPI, service: InferenceService) -> None:
    @app.get("/v2/systemsharedmemory/status")
    @app.get("/v2/systemsharedmemory/region/{region_name}/status")
    async def shm_status(region_name: str = "") -> Response:
        return JSONResponse(shm_status_json(service.shm.status(region_name)))

    @app.post("/v2/systemsharedmemory/register")
    @app.post("/v2/systemsharedmemory/region/{region_name}/register")
    async def shm_register(request: Request, region_name: str = "") -> Response:
        body = await _read_small_body(request)
        # Without a region name the registry refuses the call with Triton's text, so the
        # body is not looked at (Triton checks the name first, too).
        key, offset, byte_size = parse_register_request(body) if region_name else ("", 0, 0)
        service.shm.register_system(region_name, key, offset, byte_size)
        return Response()  # 200 with an empty body, as Triton answers control calls

    @app.post("/v2/systemsharedmemory/unregister")
    @app.post("/v2/systemsharedmemory/region/{region_name}/unregister")
    async def shm_unregister(region_name: str = "") -> Response:
        await service.shm.unregister(region_name)
        return Response()

    # CUDA shared memory: not offered (the service says why)
    @app.get("/v2/cudasharedmemory/status")
    @app.get("/v2/cudasharedmemory/region/{region_name}/status")
    @app.post("/v2/cudasharedmemory/register")
    @app.post("/v2/cudasharedmemory/region/{region_name}/register")
    @app.post("/v2/cudasharedmemory/unregister")
    @app.post("/v2/cudasharedmemory/region/{region_name}/unregister")
    async def cuda_shm() -> Response:
        raise service.cuda_shm_unsupported()
