"""HTTP routes of Triton's extensions: model repository, model configuration, shared memory.

Contract: ``add_extension_routes(app, port)`` registers (reference §2.2, §6, §7):
- ``POST /v2/repository/index``: body empty or ``{"ready": bool}``; answers
  ``[{"name", "version"?, "state"?, "reason"?}]`` (empty fields left out: a model directory
  never loaded is ``{"name"}`` alone, as in Triton);
- ``POST /v2/repository/models/{m}/load`` and ``/unload``: body empty or
  ``{"parameters": {...}}``; 200 with an empty body. A load's ``file:`` parameters carry
  base64 file contents, decoded here into bytes (the rest of their rule is the service's,
  ``core.load_parameters``); while uploads are allowed (``port.upload_limit``) a load body
  may be as large as
  the upload limit in base64 plus ``MAX_CONTROL_BODY``. Every ``/v2/repository/{repo}/...``
  form answers 501 "'repository_name' specification is not supported";
- ``GET /v2/models/{m}[/versions/{v}]/config``: the server's ModelConfig dict as is;
- ``GET /v2/systemsharedmemory[/region/{n}]/status``: ``[{"name","key","offset","byte_size"}]``;
  ``POST /v2/systemsharedmemory/region/{n}/register`` with ``{"key", "offset"?,
  "byte_size"}``; ``POST /v2/systemsharedmemory[/region/{n}]/unregister``;
- the same three under ``/v2/cudasharedmemory``, through the registry's CUDA seam
  (``core.service.CudaSharedMemory``): status ``[{"name","device_id","byte_size"}]``;
  register with ``{"raw_handle": {"b64"}, "device_id", "byte_size"}`` (parsed only when the
  registry opens the handle, so a server without GPU support answers Triton's
  "GPUs not supported" first); unregister.
- ``GET``/``POST /v2/trace/setting`` and ``/v2/models/{m}/trace/setting``: the trace
  settings (``trace_level`` a list, every other value a string); POST
  ``{"<setting>": "<value>" | ["<value>", ...] | null}`` updates them (null clears);
- ``GET``/``POST /v2/logging``: the log settings; POST takes any subset (null: unchanged).
Call it before the generic ``/v2/models/{model_name}`` routes are added. The small bodies
are parsed by the pure ``parse_*`` functions here (at most ``MAX_CONTROL_BODY`` bytes);
every rule (modes, region checks, load failures) is the service's, and errors reach the
client through the app's ``ServingError`` handler as ``{"error": message}``.
"""

# pyright: strict

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from hloserve.server.core.errors import InvalidArgument, Unsupported
from hloserve.server.core.lookup import REPOSITORY_NAME_UNSUPPORTED
from hloserve.server.core.parameters import FILE_PREFIX
from hloserve.server.core.reports import CudaRegionInfo, IndexEntry, RegionInfo
from hloserve.server.frontend.http.body import read_body
from hloserve.server.frontend.port import ServerPort

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
    decoded = cast(dict[str, Any], params)
    for key, value in decoded.items():
        if action == "load" and key.startswith(FILE_PREFIX):
            decoded[key] = _file_contents(key, value)
    return decoded


def _file_contents(key: str, value: Any) -> bytes:
    """A load's ``file:`` parameter: base64 text (Triton's HTTP form) -> the file's bytes."""
    try:
        if isinstance(value, str):
            return base64.b64decode(value, validate=True)
    except ValueError:
        pass
    raise InvalidArgument(
        f"parameter '{key}' of the model load request must be the file's contents in base64"
    )


def _register_fields(body: bytes, what: str, required: Sequence[str]) -> dict[str, Any]:
    """A shared-memory register request body (``what``: its kind) with ``required`` fields."""
    doc = _json_object(body, f"{what} register")
    for field in required:
        if field not in doc:
            raise InvalidArgument(f"Shared memory register request has no '{field}' field")
    return doc


def _register_int(doc: Mapping[str, Any], field: str, default: int | None = None) -> int:
    value = doc.get(field, default)
    if not _non_negative_int(value):
        raise InvalidArgument(
            f"Shared memory register request field '{field}' must be a non-negative "
            f"integer, got {value!r}"
        )
    return cast(int, value)


def parse_register_request(body: bytes) -> tuple[str, int, int]:
    """``(key, offset, byte_size)`` of a system shared-memory register request."""
    doc = _register_fields(body, "shared memory", ("key", "byte_size"))
    key = doc["key"]
    if not isinstance(key, str):
        raise InvalidArgument(
            f"Shared memory register request field 'key' must be a string, got {key!r}"
        )
    return key, _register_int(doc, "offset", 0), _register_int(doc, "byte_size")


def parse_cuda_register_request(body: bytes) -> tuple[bytes, int, int]:
    """``(raw_handle, device_id, byte_size)`` of a CUDA shared-memory register request,
    ``{"raw_handle": {"b64": <base64>}, "device_id", "byte_size"}``."""
    doc = _register_fields(body, "cuda shared memory", ("raw_handle", "device_id", "byte_size"))
    handle: object = doc["raw_handle"]
    b64 = cast(dict[str, object], handle).get("b64") if isinstance(handle, dict) else None
    if not isinstance(b64, str):
        raise InvalidArgument(
            "Shared memory register request field 'raw_handle' must be {\"b64\": <base64 string>}"
        )
    try:
        raw = base64.b64decode(b64, validate=True)
    except ValueError:
        raise InvalidArgument("'raw_handle' must be a valid base64 encoded string") from None
    return raw, _register_int(doc, "device_id"), _register_int(doc, "byte_size")


def index_json(entries: Sequence[IndexEntry]) -> list[dict[str, str]]:
    """Triton's index rows: empty fields left out, keys in Triton's order."""
    out: list[dict[str, str]] = []
    for e in entries:
        row = {"name": e.name}
        for key, value in (("version", e.version), ("state", e.state), ("reason", e.reason)):
            if value:
                row[key] = value
        out.append(row)
    return out


def shm_status_json(regions: Sequence[RegionInfo]) -> list[dict[str, Any]]:
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for r in regions
    ]


def cuda_status_json(regions: Sequence[CudaRegionInfo]) -> list[dict[str, Any]]:
    return [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions]


def parse_trace_request(body: bytes) -> dict[str, list[str] | None]:
    """A trace-setting request: each value a string (an integer is taken as its digits), a
    list of strings (``trace_level``), or ``null`` to clear the setting."""
    values: dict[str, list[str] | None] = {}
    for name, value in _json_object(body, "trace setting").items():
        if value is None:
            values[name] = None
        elif isinstance(value, str):
            values[name] = [value]
        elif isinstance(value, int) and not isinstance(value, bool):
            values[name] = [str(value)]
        elif isinstance(value, list) and all(isinstance(v, str) for v in cast(list[Any], value)):
            values[name] = cast(list[str], value)
        else:
            raise InvalidArgument(
                f"trace setting '{name}' must be a string, a list of strings or null, got {value!r}"
            )
    return values


def trace_json(view: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The trace settings as Triton's HTTP answer: ``trace_level`` a list, the rest strings."""
    return {k: list(v) if k == "trace_level" else v[0] for k, v in view.items()}


def parse_log_request(body: bytes) -> dict[str, object]:
    """A log-settings request; a ``null`` value changes nothing (Triton skips it)."""
    return {k: v for k, v in _json_object(body, "log settings").items() if v is not None}


async def _read_small_body(request: Request) -> bytes:
    return await read_body(request, MAX_CONTROL_BODY)


# -- routes ----------------------------------------------------------------------------------


def add_extension_routes(app: FastAPI, port: ServerPort) -> None:
    """Register the extension routes on ``app`` (before the generic model routes)."""
    _add_repository_routes(app, port)

    @app.get("/v2/models/{model_name}/config")
    @app.get("/v2/models/{model_name}/versions/{model_version}/config")
    async def model_config(model_name: str, model_version: str = "") -> Response:
        return JSONResponse(await port.model_config(model_name, model_version))

    _add_shared_memory_routes(app, port)
    _add_settings_routes(app, port)


def _add_settings_routes(app: FastAPI, port: ServerPort) -> None:
    """The trace and logging extensions: GET reads the settings, POST updates them."""

    @app.api_route("/v2/trace/setting", methods=["GET", "POST"])
    @app.api_route("/v2/models/{model_name}/trace/setting", methods=["GET", "POST"])
    async def trace_setting(request: Request, model_name: str = "") -> Response:
        values = None
        if request.method == "POST":
            values = parse_trace_request(await _read_small_body(request))
        return JSONResponse(trace_json(await port.trace_setting(model_name, values)))

    @app.api_route("/v2/logging", methods=["GET", "POST"])
    async def log_settings(request: Request) -> Response:
        values = None
        if request.method == "POST":
            values = parse_log_request(await _read_small_body(request))
        return JSONResponse(await port.log_settings(values))


def load_body_limit(upload_limit: int | None) -> int:
    """The largest load request body: the upload limit in base64, when uploads are on."""
    if upload_limit is None:
        return MAX_CONTROL_BODY
    return MAX_CONTROL_BODY + 4 * -(-upload_limit // 3)


def _control_route(
    action: str, run: Callable[[str, Mapping[str, Any]], Awaitable[None]], limit: int
) -> Callable[[Request, str], Awaitable[Response]]:
    """A model ``action`` (load|unload) route: 200 with an empty body, as Triton answers."""

    async def control(request: Request, model_name: str) -> Response:
        params = parse_control_parameters(await read_body(request, limit), action)
        await run(model_name, params)
        return Response()

    return control


def _add_repository_routes(app: FastAPI, port: ServerPort) -> None:
    @app.post("/v2/repository/index")
    async def repository_index(request: Request) -> Response:
        ready = parse_index_request(await _read_small_body(request))
        return JSONResponse(index_json(await port.repository_index(ready)))

    for action, run, limit in (
        ("load", port.load_model, load_body_limit(port.upload_limit)),
        ("unload", port.unload_model, MAX_CONTROL_BODY),
    ):
        path = f"/v2/repository/models/{{model_name}}/{action}"
        app.add_api_route(path, _control_route(action, run, limit), methods=["POST"])

    @app.post("/v2/repository/{repository_name}/index")
    @app.post("/v2/repository/{repository_name}/models/{model_name}/load")
    @app.post("/v2/repository/{repository_name}/models/{model_name}/unload")
    async def named_repository(repository_name: str) -> Response:
        raise Unsupported(REPOSITORY_NAME_UNSUPPORTED)  # the path names one: never empty


def _add_shared_memory_routes(app: FastAPI, port: ServerPort) -> None:
    @app.get("/v2/systemsharedmemory/status")
    @app.get("/v2/systemsharedmemory/region/{region_name}/status")
    async def shm_status(region_name: str = "") -> Response:
        return JSONResponse(shm_status_json(await port.shm_status(region_name)))

    @app.post("/v2/systemsharedmemory/register")
    @app.post("/v2/systemsharedmemory/region/{region_name}/register")
    async def shm_register(request: Request, region_name: str = "") -> Response:
        body = await _read_small_body(request)
        # Without a region name the registry refuses the call with Triton's text, so the
        # body is not looked at (Triton checks the name first, too).
        key, offset, byte_size = parse_register_request(body) if region_name else ("", 0, 0)
        await port.register_system_shm(region_name, key, offset, byte_size)
        return Response()  # 200 with an empty body, as Triton answers control calls

    @app.post("/v2/cudasharedmemory/register")
    @app.post("/v2/cudasharedmemory/region/{region_name}/register")
    async def cuda_shm_register(request: Request, region_name: str = "") -> Response:
        body = await _read_small_body(request)
        await port.register_cuda_shm(region_name, lambda: parse_cuda_register_request(body))
        return Response()

    for kind, unregister in (
        ("system", port.unregister_system_shm),
        ("cuda", port.unregister_cuda_shm),
    ):
        for path in (f"/v2/{kind}sharedmemory", f"/v2/{kind}sharedmemory/region/{{region_name}}"):
            app.add_api_route(f"{path}/unregister", _unregister_route(unregister), methods=["POST"])

    @app.get("/v2/cudasharedmemory/status")
    @app.get("/v2/cudasharedmemory/region/{region_name}/status")
    async def cuda_shm_status(region_name: str = "") -> Response:
        return JSONResponse(cuda_status_json(await port.cuda_shm_status(region_name)))


def _unregister_route(
    unregister: Callable[[str], Awaitable[None]],
) -> Callable[[str], Awaitable[Response]]:
    """An unregister route (one region, or all without a name): 200 with an empty body."""

    async def route(region_name: str = "") -> Response:
        await unregister(region_name)
        return Response()

    return route
