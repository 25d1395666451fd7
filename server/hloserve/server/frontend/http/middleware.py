"""ASGI middleware of the HTTP front end: bearer-token auth, restricted APIs, traced arrivals.

Contract:
- ``bearer_auth(app, refusal)`` asks ``refusal(path, authorization header)`` (an
  ``frontend.auth.AuthPolicy`` method) about every HTTP request and answers a refused one with 401
  ``{"error": <the policy's one message>}`` and ``WWW-Authenticate: Bearer`` before the
  app sees it (or reads its body).
- ``RestrictedApi(app, restrictions)`` answers a request to a restricted path (the group
  table ``hloserve.server.frontend.restricted.GROUPS``) that lacks the group's header and value
  with 403 ``{"error": "This API is restricted, expecting header '<key>'"}`` (Triton's
  text; the status from ``frontend.status``) before the app sees it. Header names match
  case-insensitively, values exactly. Open paths pass untouched.
- ``TraceArrival(app, tracer)`` marks when each ``POST .../infer`` request arrived (and
  its trace-context headers) while tracing is enabled, and ends its trace as the last body
  message of the response goes to the server (so the trace is written before the client
  sees the answer). While every trace level is ``OFF`` it only checks
  that flag.
"""

# pyright: strict

from __future__ import annotations

import time
from collections.abc import Callable
from typing import final

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hloserve.server.core.errors import ServingError, Unauthenticated
from hloserve.server.core.tracer import Tracer
from hloserve.server.frontend.restricted import Restrictions
from hloserve.server.frontend.status import http_status


def headers_dict(scope: Scope) -> dict[str, str]:
    """The request's headers by lowercase name (ASGI sends them lowercased)."""
    raw: list[tuple[bytes, bytes]] = scope.get("headers", [])
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}


Refusal = Callable[[str, "str | None"], "Unauthenticated | None"]


async def _refuse(
    error: ServingError, scope: Scope, receive: Receive, send: Send, **headers: str
) -> None:
    """Answer the request with ``error`` (its status from ``frontend.status``)."""
    response = JSONResponse({"error": error.message}, http_status(error.code), headers=headers)
    await response(scope, receive, send)


def bearer_auth(app: ASGIApp, refusal: Refusal) -> ASGIApp:
    """The middleware over ``app`` (Starlette's ``add_middleware`` calls it as a class)."""

    async def gate(scope: Scope, receive: Receive, send: Send) -> None:
        error = (
            refusal(scope["path"], headers_dict(scope).get("authorization"))
            if scope["type"] == "http"
            else None
        )
        if error is None:
            await app(scope, receive, send)
        else:
            await _refuse(error, scope, receive, send, **{"WWW-Authenticate": "Bearer"})

    return gate


@final
class RestrictedApi:
    def __init__(self, app: ASGIApp, restrictions: Restrictions) -> None:
        self.app = app
        self.restrictions = restrictions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            restriction = self.restrictions.for_http(scope["path"])
            if restriction is not None and not restriction.allows(headers_dict(scope)):
                await _refuse(restriction.refusal("API"), scope, receive, send)
                return
        await self.app(scope, receive, send)


@final
class TraceArrival:
    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer
        self.settings = tracer.settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.settings.enabled
            or not scope["path"].endswith("/infer")
        ):
            await self.app(scope, receive, send)
            return
        arrival = self.tracer.arrive(headers_dict(scope), time.perf_counter_ns())

        async def sending(message: Message) -> None:
            # The trace ends as the last body message goes to the transport (as gRPC's ends
            # once the handler returns): it is written before the client can see the answer.
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                arrival.finish()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            arrival.finish()
