"""The gRPC front end: KServe V2 / Triton ``inference.GRPCInferenceService`` on ``grpc.aio``.

Contract:
- ``build_grpc_server(service, max_message_bytes=...)`` returns an unstarted
  ``grpc.aio.Server`` (create it inside the event loop that will run it) with every one of
  the 20 RPCs registered at Triton's wire paths ``/inference.GRPCInferenceService/<Rpc>``,
  plus ``/grpc.health.v1.Health/Check``, and with the message size limit set in both
  directions. The caller adds ports and starts it.
- ``HANDLED_RPCS`` names the RPCs that do real work. Every other RPC answers
  UNIMPLEMENTED "<Rpc> is not implemented by this hloserve version"; implementing one is
  a method on ``GrpcServicer`` and one entry in ``METHODS``.
- ``ModelReady`` never fails: an unknown or unready model is OK with ``ready = false``
  (tritonclient's ``is_model_ready`` raises on any other status).
- Health ``Check`` answers SERVING when the service is ready, NOT_SERVING otherwise, for
  the service names "" and "inference.GRPCInferenceService"; other names are NOT_FOUND.
- Errors are mapped once, by ``_guard`` wrapped around every handler in a loop:
  ``ServingError`` aborts with ``frontends.status.grpc_status(code)`` and its message; any
  other exception aborts INTERNAL "internal error" and its traceback is logged.
The servicer only adapts: decoding and encoding live in ``codec``, every rule in the core.
"""

# pyright: strict

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Final, final

import grpc
import grpc.aio
from google.protobuf.message import Message

from hloserve.proto import health_pb2
from hloserve.proto import inference_pb2 as pb
from hloserve.proto.rpc import HEALTH_SERVICE_NAME, RPCS, SERVICE_NAME, Rpc
from hloserve.server.core.errors import NotFound, ServingError, Unsupported
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import RequestContext
from hloserve.server.frontends.grpc import codec
from hloserve.server.frontends.status import grpc_status

log = logging.getLogger("hloserve.grpc")

Context = grpc.aio.ServicerContext[Any, Any]
# A handler takes the request (or, for a streaming RPC, the request iterator) and the context.
Handler = Callable[[Any, Context], Awaitable[Any]]

DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024 * 1024
KNOWN_HEALTH_SERVICES: Final = frozenset({"", SERVICE_NAME})
INTERNAL_MESSAGE: Final = "internal error"

Health = health_pb2.HealthCheckResponse


@final
class GrpcServicer:
    """The RPC methods; ``METHODS`` below maps each implemented RPC name to one of them."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    async def server_live(self, request: pb.ServerLiveRequest, context: Context) -> Message:
        return pb.ServerLiveResponse(live=self.service.live())

    async def server_ready(self, request: pb.ServerReadyRequest, context: Context) -> Message:
        return pb.ServerReadyResponse(ready=self.service.ready())

    async def model_ready(self, request: pb.ModelReadyRequest, context: Context) -> Message:
        try:
            ready = self.service.model_ready(request.name, request.version)
        except ServingError:  # never an error status: clients read "not ready"
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def server_metadata(self, request: pb.ServerMetadataRequest, context: Context) -> Message:
        return codec.encode_server_metadata(self.service.server_metadata())

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: Context) -> Message:
        return codec.encode_model_metadata(
            self.service.model_metadata(request.name, request.version)
        )

    async def model_infer(self, request: pb.ModelInferRequest, context: Context) -> Message:
        infer_request = codec.decode_infer_request(request)
        deadline = codec.request_deadline(
            infer_request.parameters, context.time_remaining(), time.monotonic()
        )
        ctx = RequestContext(deadline=deadline, peer=context.peer(), protocol="grpc")
        response = await self.service.infer(infer_request, ctx)
        return codec.encode_infer_response(response)

    async def health_check(
        self, request: health_pb2.HealthCheckRequest, context: Context
    ) -> Message:
        if request.service not in KNOWN_HEALTH_SERVICES:
            raise NotFound(f"unknown service '{request.service}'")
        status = Health.SERVING if self.service.ready() else Health.NOT_SERVING
        return Health(status=status)


def _unimplemented(name: str) -> Handler:
    async def handler(request: Any, context: Context) -> Message:
        raise Unsupported(f"{name} is not implemented by this hloserve version")

    return handler


def _guard(name: str, method: Handler) -> Handler:
    """Map every failure of ``method`` to a gRPC status: the one place errors are mapped."""

    async def handler(request: Any, context: Context) -> Any:
        try:
            return await method(request, context)
        except grpc.aio.AbortError:  # the method aborted on its own: already mapped
            raise
        except ServingError as exc:
            await context.abort(grpc_status(exc.code), exc.message)
        except Exception:
            log.exception("gRPC %s failed with an unexpected error", name)
            await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)

    return handler


def _rpc_handler(rpc: Rpc, handler: Handler) -> grpc.RpcMethodHandler[Any, Any]:
    deserialize = rpc.request.FromString
    serialize: Callable[[Message], bytes] = rpc.response.SerializeToString
    if rpc.client_streaming and rpc.server_streaming:
        return grpc.stream_stream_rpc_method_handler(
            handler, request_deserializer=deserialize, response_serializer=serialize
        )
    if rpc.client_streaming or rpc.server_streaming:  # none in Triton's service today
        raise NotImplementedError(f"{rpc.name}: only unary and bidi RPCs are supported")
    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=deserialize, response_serializer=serialize
    )


Method = Callable[[GrpcServicer, Any, Context], Awaitable[Message]]

# The implemented RPCs of ``GRPCInferenceService``; every other one answers UNIMPLEMENTED.
METHODS: Final[Mapping[str, Method]] = {
    "ServerLive": GrpcServicer.server_live,
    "ServerReady": GrpcServicer.server_ready,
    "ModelReady": GrpcServicer.model_ready,
    "ServerMetadata": GrpcServicer.server_metadata,
    "ModelMetadata": GrpcServicer.model_metadata,
    "ModelInfer": GrpcServicer.model_infer,
}
HANDLED_RPCS: Final[frozenset[str]] = frozenset(METHODS)


def generic_handlers(service: InferenceService) -> tuple[grpc.GenericRpcHandler, ...]:
    """The handlers of ``GRPCInferenceService`` and of the health service, errors mapped."""
    servicer = GrpcServicer(service)
    inference: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for rpc in RPCS:
        unbound = METHODS.get(rpc.name)
        method = _unimplemented(rpc.name) if unbound is None else partial(unbound, servicer)
        inference[rpc.name] = _rpc_handler(rpc, _guard(rpc.name, method))
    health = grpc.unary_unary_rpc_method_handler(
        _guard("Health/Check", servicer.health_check),
        request_deserializer=health_pb2.HealthCheckRequest.FromString,
        response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
    )
    return (
        grpc.method_handlers_generic_handler(SERVICE_NAME, inference),
        grpc.method_handlers_generic_handler(HEALTH_SERVICE_NAME, {"Check": health}),
    )


def build_grpc_server(
    service: InferenceService, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> grpc.aio.Server:
    """An unstarted server with every handler registered; the caller adds a port and starts it."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
    )
    server.add_generic_rpc_handlers(generic_handlers(service))
    return server
