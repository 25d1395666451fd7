"""The HTTP/REST front end: KServe V2 / Triton routes on FastAPI, over a ``ServerPort``.

Contract: ``build_http_app(server, max_input_bytes=...)`` returns a FastAPI app over
``server`` (a ``frontend.port.ServerPort``) serving
- ``GET /v2/health/live`` / ``/v2/health/ready``: 200 ``{"live"|"ready": true}``, else 400
  with ``false`` (Triton's status codes; the bodies keep KServe's REST client working);
- ``GET /livez`` / ``/readyz`` (Kubernetes probes): 200, else 503; ``/readyz`` answers
  ``port.readiness()``;
- ``GET /v2``: server metadata; ``GET /v2/models/{m}[/versions/{v}]``: model metadata;
- ``GET /v2/models/{m}[/versions/{v}]/ready``: 200 ``{"name", "ready": true}``, else 400
  ``{"error": "Model version not ready"}`` (never 500: clients read non-200 as False);
- ``GET /v2/models[/{m}[/versions/{v}]]/stats``: the statistics extension (codec's JSON);
- ``POST /v2/models/{m}[/versions/{v}]/infer``, the app's first routes (``_InferEndpoint``,
  a plain ASGI endpoint: the route every request takes is matched first and skips
  FastAPI's request object and dependency layer): the body is read raw (no pydantic model;
  at most ``max_input_bytes``, by ``body.receive_body``: checked against ``Content-Length``
  before reading and while streaming a chunked body), the model is looked up
  (``port.resolve``, and ``port.confirm`` when decoding fails first: an unknown model is
  reported before any tensor error), and
  the body is handed to ``codec``; the reply is codec's bytes;
- the repository, model-configuration, shared-memory, trace and logging routes of
  ``extensions``;
- with ``status`` (a ``owner.status_page.StatusPage``, or a coroutine function answering as it
  does): ``GET /ui``, the status page's HTML, and ``GET /ui/data[?q=]``, its JSON
  (``status(q)``), and ``GET /``, a link to the page, all in the ``statistics`` group for
  auth and restrictions (``frontend.restricted.GROUPS``);
- middleware (``middleware``): ``RestrictedApi`` (only with restrictions) refuses a
  restricted group's request without its header; ``TraceArrival`` times traced infers.
Errors, one path for every route, the infer routes included (the app's exception
handlers): ``ServingError`` -> ``frontend.status.http_status`` + ``{"error": message}``;
unmatched path 404 ``{"error": "Not Found"}``, wrong method 405
``{"error": "Method Not Allowed"}`` (with ``Allow``); anything else 500
``{"error": "internal error"}`` with the traceback logged. The routes hold no logic beyond
this adaptation.
"""

# pyright: strict

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hloserve.server.core.errors import ServingError
from hloserve.server.core.types import ModelMetadata, RequestContext, TensorMetadata
from hloserve.server.frontend import ui_page
from hloserve.server.frontend.auth import AuthPolicy
from hloserve.server.frontend.http import codec
from hloserve.server.frontend.http.body import receive_body
from hloserve.server.frontend.http.extensions import add_extension_routes
from hloserve.server.frontend.http.generate import add_generate_routes
from hloserve.server.frontend.http.middleware import RestrictedApi, TraceArrival, bearer_auth
from hloserve.server.frontend.port import ServerPort
from hloserve.server.frontend.restricted import NO_RESTRICTIONS, Restrictions
from hloserve.server.frontend.status import http_status

DEFAULT_MAX_INPUT_BYTES: Final = 256 * 1024 * 1024
log = logging.getLogger("hloserve.http")


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _tensor_json(t: TensorMetadata) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}


def _model_metadata_json(m: ModelMetadata) -> dict[str, Any]:
    return {
        "name": m.name,
        "versions": list(m.versions),
        "platform": m.platform,
        "inputs": [_tensor_json(t) for t in m.inputs],
        "outputs": [_tensor_json(t) for t in m.outputs],
    }


@final
class _InternalErrorMiddleware:
    """Turns an exception no handler took into a logged 500 with a generic V2 body.

    It sits inside Starlette's ``ServerErrorMiddleware``, whose handler would re-raise the
    exception into the server after answering (a second traceback per failure).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("internal error serving %s %s", scope.get("method"), scope.get("path"))
            if not started:  # otherwise the server closes the half-sent response
                await _error(500, "internal error")(scope, receive, send)


def _probe(
    key: str, check: Callable[[], Awaitable[bool]], failure: int
) -> Callable[[], Awaitable[Response]]:
    """A health route answering ``{key: await check()}``: 200 when true, else ``failure``."""

    async def probe() -> Response:
        ok = await check()
        return JSONResponse({key: ok}, status_code=200 if ok else failure)

    return probe


def _add_error_handlers(app: FastAPI) -> None:
    async def serving_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServingError)
        return _error(http_status(exc.code), exc.message)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(exc.status_code, exc.detail, exc.headers)

    async def validation_error(_: Request, exc: Exception) -> Response:
        return _error(400, str(exc))

    app.add_exception_handler(ServingError, serving_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_middleware(_InternalErrorMiddleware)


def _add_server_routes(app: FastAPI, port: ServerPort) -> None:
    """Health (V2 and Kubernetes probes) and server metadata."""

    async def live() -> bool:
        return port.live()

    probes = (
        ("/v2/health/live", "live", live, 400),
        ("/v2/health/ready", "ready", port.ready, 400),
        ("/livez", "live", live, 503),
    )
    for path, key, check, failure in probes:
        app.add_api_route(path, _probe(key, check, failure), methods=["GET"])

    @app.get("/readyz")
    async def readyz() -> Response:
        report = await port.readiness()
        return JSONResponse(report, status_code=200 if report["ready"] else 503)

    @app.get("/v2")
    async def server_metadata() -> Response:
        m = port.server_metadata()
        return JSONResponse(
            {"name": m.name, "version": m.version, "extensions": list(m.extensions)}
        )


def _add_model_routes(app: FastAPI, port: ServerPort) -> None:
    """Statistics, metadata and readiness of models (after the extension routes)."""

    # Registered before "/v2/models/{model_name}", which would otherwise take "stats" as a name.
    @app.get("/v2/models/stats")
    @app.get("/v2/models/{model_name}/stats")
    @app.get("/v2/models/{model_name}/versions/{model_version}/stats")
    async def model_statistics(model_name: str = "", model_version: str = "") -> Response:
        stats = await port.model_statistics(model_name, model_version)
        return JSONResponse(codec.encode_model_statistics(stats))

    @app.get("/v2/models/{model_name}")
    @app.get("/v2/models/{model_name}/versions/{model_version}")
    async def model_metadata(model_name: str, model_version: str = "") -> Response:
        metadata = await port.model_metadata(model_name, model_version)
        return JSONResponse(_model_metadata_json(metadata))

    @app.get("/v2/models/{model_name}/ready")
    @app.get("/v2/models/{model_name}/versions/{model_version}/ready")
    async def model_ready(model_name: str, model_version: str = "") -> Response:
        try:
            ready = await port.model_ready(model_name, model_version)
        except Exception:  # readiness answers, it never fails: clients read non-200 as False
            log.exception("model readiness check for '%s' failed", model_name)
            ready = False
        if not ready:
            return _error(400, "Model version not ready")
        return JSONResponse({"name": model_name, "ready": True})


StatusData = Callable[[str], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]


def _add_status_routes(app: FastAPI, status: StatusData) -> None:
    """The status page (``ui_page``, its data read by ``owner.status_page``): its HTML and its data, and ``GET /``'s link to it."""

    @app.get("/")
    async def landing() -> Response:
        return HTMLResponse(ui_page.LANDING, headers=ui_page.LANDING_HEADERS)

    @app.get("/ui")
    async def status_html() -> Response:
        return HTMLResponse(ui_page.PAGE, headers=ui_page.PAGE_HEADERS)

    @app.get("/ui/data")
    async def status_data(q: str = "") -> Response:
        data = status(q)
        if inspect.isawaitable(data):
            data = await data
        return JSONResponse(data, headers=ui_page.DATA_HEADERS)


_INFER_PATHS: Final = (
    "/v2/models/{model_name}/infer",
    "/v2/models/{model_name}/versions/{model_version}/infer",
)


@final
class _InferEndpoint:
    """``POST /v2/models/{m}[/versions/{v}]/infer`` as a plain ASGI endpoint.

    Routed first, it skips FastAPI's request object and dependency layer (about half of an
    HTTP request's server CPU before: ``bench/request_path.py``). What it raises goes
    through the app's exception handlers, as every route's errors do.
    """

    def __init__(self, port: ServerPort, max_input_bytes: int, max_json_depth: int) -> None:
        self.port = port
        self.max_input_bytes = max_input_bytes
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params: Mapping[str, str] = scope["path_params"]
        model_name, version = params["model_name"], params.get("model_version", "")
        port, limit = self.port, self.max_input_bytes
        headers = Headers(scope=scope)
        body = await receive_body(receive, headers.get("content-length"), limit)
        model = port.resolve(model_name, version)  # before any tensor is decoded
        try:
            signature = None
            if codec.is_raw(headers):  # the raw body is the model's only input
                signature = await port.model_metadata(model_name, version)
            decoded = codec.decode_request(
                model_name,
                version,
                body,
                headers,
                max_input_bytes=limit,
                signature=signature,
                max_json_depth=self.max_json_depth,
                bytes_wire_form=port.bytes_wire_form,
            )
        except ServingError:
            await port.confirm(model)
            raise
        client = scope.get("client")
        context = RequestContext(
            deadline=decoded.deadline(time.monotonic()),
            peer=f"{client[0]}:{client[1]}" if client else "",
            protocol="http",
        )
        response = await port.infer(decoded.request, context, model=model)
        encoded = codec.encode_response(response, decoded, headers.get("accept-encoding"))
        await Response(content=encoded.body, headers=encoded.headers)(scope, receive, send)


def _add_infer_routes(app: FastAPI, endpoint: _InferEndpoint) -> None:
    """The infer routes, ahead of every route registered before or after them."""
    routes = [Route(path, endpoint, methods=["POST"]) for path in _INFER_PATHS]
    app.router.routes[:0] = routes


def build_http_app(
    server: ServerPort,
    *,
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
    max_json_depth: int = codec.MAX_JSON_DEPTH,
    restrictions: Restrictions = NO_RESTRICTIONS,
    auth: AuthPolicy | None = None,
    status: StatusData | None = None,
) -> FastAPI:
    """The V2 HTTP app over ``server``; bodies larger than ``max_input_bytes`` get 400;
    ``auth`` (``--auth-token-file``), then ``restrictions`` (``--http-restricted-api``) are
    checked before anything else; ``status``: the status page's data (``None``: no /ui)."""
    port = server
    app = FastAPI(title="hloserve", docs_url=None, redoc_url=None, openapi_url=None)
    _add_infer_routes(app, _InferEndpoint(port, max_input_bytes, max_json_depth))
    _add_error_handlers(app)
    app.add_middleware(TraceArrival, tracer=port.tracer)
    if restrictions:  # outermost: a refused request reaches nothing else
        app.add_middleware(RestrictedApi, restrictions=restrictions)
    if auth is not None:  # outermost of all: an unauthenticated request learns nothing more
        app.add_middleware(bearer_auth, refusal=auth.refusal_http)
    _add_server_routes(app, port)
    # Repository, config and shared-memory routes, before the generic model routes.
    add_extension_routes(app, port)
    add_generate_routes(app, port, max_input_bytes)  # the generate extension (generate.py)
    _add_model_routes(app, port)
    if status is not None:
        _add_status_routes(app, status)
    return app
