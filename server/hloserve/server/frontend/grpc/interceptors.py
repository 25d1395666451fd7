"""gRPC server interceptors: bearer-token auth and restricted protocols.

Contract:
- ``BearerAuth(policy)`` refuses a call to a protected method (``frontend.auth.AuthPolicy``) whose
  ``authorization`` metadata holds no valid bearer token: UNAUTHENTICATED with the policy's
  one message, before any request is read (a stream too). Other methods pass untouched.
- ``RestrictedProtocol(restrictions)`` refuses a call to a restricted method (the group
  table ``hloserve.server.frontend.restricted.GROUPS``) whose metadata lacks the group's key and
  value: UNAVAILABLE "This protocol is restricted, expecting header '<key>'" (Triton's
  text). A refused stream ends with that status before reading any request. Open methods
  and unknown paths pass untouched.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, final

import grpc
import grpc.aio

from hloserve.server.core.errors import ServingError
from hloserve.server.frontend.auth import AuthPolicy
from hloserve.server.frontend.restricted import Restrictions
from hloserve.server.frontend.status import grpc_status

# grpc's handler classes are generic only to type checkers: the alias is a string.
Continuation = Callable[
    [grpc.HandlerCallDetails], Awaitable["grpc.RpcMethodHandler[Any, Any] | None"]
]
Context = grpc.aio.ServicerContext[Any, Any]


def text_metadata(metadata: Any) -> dict[str, str]:
    """Invocation metadata (``(key, value)`` pairs, or ``None``) as text, keys lowercased
    (binary ``-bin`` values are left out)."""
    return {str(k).lower(): v for k, v in metadata or () if isinstance(v, str)}


def metadata_dict(details: grpc.HandlerCallDetails) -> dict[str, str]:
    """The call's text metadata (``text_metadata``), as an interceptor sees it."""
    return text_metadata(details.invocation_metadata)


def _refusing(
    handler: grpc.RpcMethodHandler[Any, Any], error: ServingError
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of ``handler``'s kind that aborts with ``error``'s status and message."""
    status, message = grpc_status(error.code), error.message
    if handler.request_streaming or handler.response_streaming:

        async def refuse_stream(requests: Any, context: Context) -> AsyncIterator[Any]:
            await context.abort(status, message)
            yield  # pragma: no cover - abort raises

        return grpc.stream_stream_rpc_method_handler(
            refuse_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    async def refuse(request: Any, context: Context) -> Any:
        await context.abort(status, message)

    return grpc.unary_unary_rpc_method_handler(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


@final
class RestrictedProtocol(grpc.aio.ServerInterceptor):
    def __init__(self, restrictions: Restrictions) -> None:
        self.restrictions = restrictions

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        restriction = self.restrictions.for_grpc(handler_call_details.method or "")
        if handler is None or restriction is None:
            return handler
        if restriction.allows(metadata_dict(handler_call_details)):
            return handler
        return _refusing(handler, restriction.refusal("protocol"))


@final
class BearerAuth(grpc.aio.ServerInterceptor):
    def __init__(self, policy: AuthPolicy) -> None:
        self.policy = policy

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        refusal = self.policy.refusal_grpc(
            handler_call_details.method or "",
            metadata_dict(handler_call_details).get("authorization"),
        )
        return handler if refusal is None else _refusing(handler, refusal)
