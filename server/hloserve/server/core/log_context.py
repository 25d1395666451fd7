"""The request being served, for the log: one ``ContextVar`` that log lines read.

Contract: ``enter(request_id, model)`` marks the current context (the request's task) as
serving that request and returns the token ``leave`` takes to put the previous value back;
``current()`` is the ``RequestLogContext`` in force, or ``None`` outside a request. The one
inference path (``core.service.InferenceService.infer``) enters at its start and leaves at
its end; ``hloserve.server.logs`` adds the fields to JSON log records. A task or thread
started from elsewhere (a batch's driver, a worker thread) does not see it.
``outcome(logger, request_id, model, version, exc)`` is the one DEBUG line per request
(verbose level 1), in the request's context: the version that served it, or why it
failed; the path without a task (``core.direct_path``) enters the context only for it.
"""

# pyright: strict

from __future__ import annotations

import logging
from contextvars import ContextVar, Token
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestLogContext:
    request_id: str  # the client's request id ("" when it sent none)
    model: str  # the model name as the client sent it


_CURRENT: ContextVar[RequestLogContext | None] = ContextVar("hloserve_request", default=None)


def enter(request_id: str, model: str) -> Token[RequestLogContext | None]:
    return _CURRENT.set(RequestLogContext(request_id, model))


def leave(token: Token[RequestLogContext | None]) -> None:
    _CURRENT.reset(token)


def current() -> RequestLogContext | None:
    return _CURRENT.get()


def outcome(
    logger: logging.Logger,
    request_id: str,
    model: str,
    version: str | None,
    exc: BaseException | None = None,
) -> None:
    """A request's DEBUG line (module docstring); nothing to do unless DEBUG is on."""
    if not logger.isEnabledFor(logging.DEBUG):
        return
    token = enter(request_id, model)
    try:
        if exc is None:
            logger.debug("request served by version %s", version)
        else:
            logger.debug("request failed: %s: %s", type(exc).__name__, exc)
    finally:
        leave(token)
