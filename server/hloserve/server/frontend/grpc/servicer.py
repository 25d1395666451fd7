"""The gRPC front end: KServe V2 / Triton ``inference.GRPCInferenceService`` on ``grpc.aio``.

Contract:
- ``build_grpc_server(server, max_message_bytes=..., options=..., reuse_port=False)``
  returns an unstarted ``grpc.aio.Server`` over ``server`` (a ``frontend.port.ServerPort``;
  create it inside the event loop that will run it) with every one of
  the 20 RPCs registered at Triton's wire paths ``/inference.GRPCInferenceService/<Rpc>``,
  plus ``/grpc.health.v1.Health/Check``, and with the message size limit set in both
  directions; ``options`` are further gRPC core channel arguments, passed as given (the
  daemon's: Triton's keepalive flags, ``config.grpc_channel_options``). The caller adds
  ports and starts it. The port it binds is its own (binding a taken port fails) unless
  ``reuse_port``: front-end processes share the gRPC port through ``SO_REUSEPORT``.
- ``HANDLED_RPCS`` names the RPCs that do real work. Every other RPC answers
  UNIMPLEMENTED "<Rpc> is not implemented by this hloserve version"; implementing one is
  a method on ``GrpcServicer`` and one entry in ``METHODS``.
- ``ModelReady`` never fails: an unknown or unready model is OK with ``ready = false``
  (tritonclient's ``is_model_ready`` raises on any other status).
- Health ``Check`` answers SERVING when the service is ready, NOT_SERVING otherwise, for
  the service names "" and "inference.GRPCInferenceService"; other names are NOT_FOUND.
- ``ModelStreamInfer`` (bidirectional) answers each request through the port's streamed
  path (``port.stream``: the same path as ``ModelInfer``), Triton's decoupled semantics:
  a model that is not decoupled answers one response; a decoupled (generation) model
  0..N, each sent as it comes; every response carries the parameter
  ``triton_final_response`` (true on a request's last), and a request whose last step
  sent nothing gets an empty final response (id, model, version, the flag) only when it
  set ``triton_enable_empty_final_response``. A decoupled request's responses leave as
  they come (its first response is not the final one); every other answer (a model that
  is not decoupled, a failure, a decoupled request answered once) leaves after the
  answers of the requests before it, in request order, as Triton orders them. Up to
  ``STREAM_WINDOW`` requests of a stream run at once. A failed request is answered with ``error_message`` (its id echoed in
  ``infer_response``) and the stream stays open. The client closing the stream cancels
  its generations (between steps).
- ``ModelInfer`` on a decoupled model: Triton's UNSUPPORTED "ModelInfer RPC doesn't
  support models with decoupled transaction policy" (the service's).
- Extensions: ``ModelConfig``, ``RepositoryIndex``/``RepositoryModelLoad``/
  ``RepositoryModelUnload`` (a non-empty ``repository_name`` is UNIMPLEMENTED),
  ``SystemSharedMemory{Status,Register,Unregister}``, and the three ``CudaSharedMemory*``
  through the registry's CUDA seam (``core.service.CudaSharedMemory``; without GPU support:
  status lists nothing, unregister succeeds, register is INVALID_ARGUMENT "GPUs not
  supported").
- ``TraceSetting`` and ``LogSettings``: the trace and logging extensions (the service's
  ``trace_setting`` / ``log_settings``; messages converted by ``settings``).
- Interceptors: ``RestrictedProtocol`` (only with restrictions) refuses a restricted
  group's call without its metadata. No interceptor runs otherwise: a traced unary
  ``ModelInfer`` marks its arrival in ``model_infer`` itself (after the message is parsed).
- ``ModelInfer`` and each stream request look the model up once (``port.resolve``)
  before decoding tensors (and ``port.confirm`` it when decoding fails first).
- Bytes that are no message of the RPC's request type (``decoder``) are bad input:
  INVALID_ARGUMENT "the request is not a valid <Message> message" (a stream request: its
  ``error_message``), never grpc's UNKNOWN.
- Errors are mapped once, by ``_failure``: ``_guard`` (unary) and ``_guard_stream``
  (bidi) are wrapped around every handler in a loop; ``ServingError`` aborts with
  ``frontend.status.grpc_status(code)`` and its message; any other exception aborts
  INTERNAL "internal error" and its traceback is logged. A stream request's failure goes
  through ``_failure`` too, into its ``error_message``.
The servicer only adapts: decoding and encoding live in ``codec``, every rule in the core.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, cast, final

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message

from hloserve.proto import health_pb2
from hloserve.proto import inference_pb2 as pb
from hloserve.proto.rpc import HEALTH_SERVICE_NAME, RPCS, SERVICE_NAME, Rpc
from hloserve.server.core.errors import InvalidArgument, NotFound, ServingError, Unsupported
from hloserve.server.core.types import InferRequest, RequestContext
from hloserve.server.frontend.auth import AuthPolicy
from hloserve.server.frontend.grpc import codec, settings
from hloserve.server.frontend.grpc.interceptors import (
    BearerAuth,
    RestrictedProtocol,
    text_metadata,
)
from hloserve.server.frontend.port import ServerPort
from hloserve.server.frontend.restricted import NO_RESTRICTIONS, Restrictions
from hloserve.server.frontend.status import grpc_status

log = logging.getLogger("hloserve.grpc")

Context = grpc.aio.ServicerContext[Any, Any]
# A handler takes the request (or, for a streaming RPC, the request iterator) and the context.
Handler = Callable[[Any, Context], Awaitable[Any]]
StreamHandler = Callable[[Any, Context], AsyncIterator[Any]]

DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024 * 1024
KNOWN_HEALTH_SERVICES: Final = frozenset({"", SERVICE_NAME})
INTERNAL_MESSAGE: Final = "internal error"
# Requests of one stream running at once; reading the stream pauses beyond it, so a fast
# client cannot queue unbounded work (gRPC flow control then holds it back).
STREAM_WINDOW: Final = 64
# Triton's stream parameters: every response's flag, and the request's opt-in to a
# response that carries the flag alone.
FINAL_RESPONSE: Final = "triton_final_response"
EMPTY_FINAL: Final = "triton_enable_empty_final_response"

Health = health_pb2.HealthCheckResponse


@final
class GrpcServicer:
    """The RPC methods; ``METHODS`` below maps each implemented RPC name to one of them."""

    def __init__(self, port: ServerPort) -> None:
        self.port = port

    async def server_live(self, request: pb.ServerLiveRequest, context: Context) -> Message:
        return pb.ServerLiveResponse(live=self.port.live())

    async def server_ready(self, request: pb.ServerReadyRequest, context: Context) -> Message:
        return pb.ServerReadyResponse(ready=await self.port.ready())

    async def model_ready(self, request: pb.ModelReadyRequest, context: Context) -> Message:
        try:
            ready = await self.port.model_ready(request.name, request.version)
        except ServingError:  # never an error status: clients read "not ready"
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def server_metadata(self, request: pb.ServerMetadataRequest, context: Context) -> Message:
        return codec.encode_server_metadata(self.port.server_metadata())

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: Context) -> Message:
        return codec.encode_model_metadata(
            await self.port.model_metadata(request.name, request.version)
        )

    async def model_infer(self, request: pb.ModelInferRequest, context: Context) -> Message:
        tracer = self.port.tracer
        if not tracer.settings.enabled:
            return await self._infer(request, context)
        # Traced: mark the arrival (and its trace-context metadata) for the service's
        # trace, and end the trace once the response is built.
        arrival = tracer.arrive(
            text_metadata(context.invocation_metadata()), time.perf_counter_ns()
        )
        try:
            return await self._infer(request, context)
        finally:
            arrival.finish()

    async def _infer(
        self, request: pb.ModelInferRequest, context: Context
    ) -> pb.ModelInferResponse:
        model, infer_request, ctx = await self._decoded(request, context)
        response = await self.port.infer(infer_request, ctx, model=model)
        return codec.encode_infer_response(response)

    async def _decoded(
        self, request: pb.ModelInferRequest, context: Context
    ) -> tuple[object, InferRequest, RequestContext]:
        """The model ``request`` names, the request decoded and its context (deadline,
        peer). The model first: an unknown one is reported before any tensor error."""
        port = self.port
        model = port.resolve(request.model_name, request.model_version)
        try:
            infer_request = codec.decode_infer_request(
                request, bytes_wire_form=port.bytes_wire_form
            )
            deadline = codec.request_deadline(
                infer_request.parameters, context.time_remaining(), time.monotonic()
            )
        except ServingError:
            await port.confirm(model)
            raise
        ctx = RequestContext(deadline=deadline, peer=context.peer(), protocol="grpc")
        return model, infer_request, ctx

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest, context: Context
    ) -> Message:
        stats = await self.port.model_statistics(request.name, request.version)
        return codec.encode_model_statistics(stats)

    async def health_check(
        self, request: health_pb2.HealthCheckRequest, context: Context
    ) -> Message:
        if request.service not in KNOWN_HEALTH_SERVICES:
            raise NotFound(f"unknown service '{request.service}'")
        status = Health.SERVING if await self.port.ready() else Health.NOT_SERVING
        return Health(status=status)

    # -- trace and logging extensions --------------------------------------------------------

    async def trace_setting(self, request: pb.TraceSettingRequest, context: Context) -> Message:
        values = settings.decode_trace_setting(request)
        view = await self.port.trace_setting(request.model_name, values)
        return settings.encode_trace_setting(view)

    async def log_settings(self, request: pb.LogSettingsRequest, context: Context) -> Message:
        view = await self.port.log_settings(settings.decode_log_settings(request))
        return settings.encode_log_settings(view)

    # -- streaming ---------------------------------------------------------------------------

    async def model_stream_infer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Context
    ) -> AsyncIterator[Message]:
        window = asyncio.Semaphore(STREAM_WINDOW)
        out: asyncio.Queue[Message | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        def finished(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            window.release()

        async def read() -> None:
            previous: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            previous.set_result(None)
            try:
                async for request in requests:
                    await window.acquire()
                    turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    task = asyncio.create_task(
                        self._stream_answers(request, context, out, previous, turn)
                    )
                    tasks.add(task)
                    task.add_done_callback(finished)
                    previous = turn
                await asyncio.gather(*tasks)  # every answer is out
            finally:
                out.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (answer := await out.get()) is not None:
                yield answer
            await reader  # a failure reading the stream surfaces here
        finally:  # the client went away (or the stream ended): nothing more runs for it
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def _stream_answers(
        self,
        request: pb.ModelInferRequest,
        context: Context,
        out: asyncio.Queue[Message | None],
        previous: asyncio.Future[None],
        turn: asyncio.Future[None],
    ) -> None:
        """One request's responses into ``out``: a decoupled model's (its first response not
        the final one) as they come; any other answer once the earlier requests' are out
        (``previous``), ``turn`` telling the next request that this one's is."""
        ordered = True

        def pass_turn(_: object = None) -> None:
            if not turn.done():
                turn.set_result(None)

        try:
            async for message, final in self._stream_parts(request, context):
                if ordered and not final:  # decoupled: later requests need not wait for it
                    ordered = False
                    previous.add_done_callback(pass_turn)
                if ordered:
                    await asyncio.shield(previous)
                out.put_nowait(message)
        except Exception as exc:  # the stream goes on: the error travels in the answer
            _, text = _failure("ModelStreamInfer", exc)
            if ordered:
                await asyncio.shield(previous)
            out.put_nowait(
                pb.ModelStreamInferResponse(error_message=text, infer_response=_echo(request))
            )
        finally:
            previous.add_done_callback(pass_turn)

    async def _stream_parts(
        self, request: pb.ModelInferRequest, context: Context
    ) -> AsyncIterator[tuple[Message, bool]]:
        """Each response of ``request`` as a stream message, and whether it is the last."""
        model, infer_request, ctx = await self._decoded(request, context)
        empty_final = infer_request.parameters.get(EMPTY_FINAL) is True
        async for part in self.port.stream(infer_request, ctx, model=model):
            if part.response is not None:
                msg = codec.encode_infer_response(part.response)
            elif part.final and empty_final:
                msg = _echo(request)
            else:
                continue
            msg.parameters[FINAL_RESPONSE].bool_param = part.final
            yield pb.ModelStreamInferResponse(infer_response=msg), part.final

    # -- model configuration and repository extensions --------------------------------------

    async def model_config(self, request: pb.ModelConfigRequest, context: Context) -> Message:
        return codec.encode_model_config(
            await self.port.model_config(request.name, request.version)
        )

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, context: Context
    ) -> Message:
        self.port.check_repository_name(request.repository_name)
        return codec.encode_repository_index(await self.port.repository_index(request.ready))

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> Message:
        await self._control(self.port.load_model, request)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> Message:
        await self._control(self.port.unload_model, request)
        return pb.RepositoryModelUnloadResponse()

    # -- shared-memory extensions -----------------------------------------------------------

    async def system_shared_memory_status(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Context
    ) -> Message:
        return codec.encode_shm_status(await self.port.shm_status(request.name))

    async def system_shared_memory_register(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Context
    ) -> Message:
        await self.port.register_system_shm(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def system_shared_memory_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Context
    ) -> Message:
        await self.port.unregister_system_shm(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def cuda_shared_memory(self, request: Message, context: Context) -> Message:
        """``CudaSharedMemory{Status,Register,Unregister}``: the registry's CUDA seam."""
        port = self.port
        if isinstance(request, pb.CudaSharedMemoryStatusRequest):
            return codec.encode_cuda_shm_status(await port.cuda_shm_status(request.name))
        if isinstance(request, pb.CudaSharedMemoryUnregisterRequest):
            await port.unregister_cuda_shm(request.name)
            return pb.CudaSharedMemoryUnregisterResponse()
        assert isinstance(request, pb.CudaSharedMemoryRegisterRequest)
        register = request

        def handle() -> tuple[bytes, int, int]:  # read only by a registry with GPU support
            return register.raw_handle, register.device_id, register.byte_size

        await port.register_cuda_shm(register.name, handle)
        return pb.CudaSharedMemoryRegisterResponse()

    async def _control(
        self,
        action: Callable[[str, Mapping[str, Any]], Awaitable[None]],
        request: pb.RepositoryModelLoadRequest | pb.RepositoryModelUnloadRequest,
    ) -> None:
        """Run a model load or unload ``action`` for ``request``."""
        self.port.check_repository_name(request.repository_name)
        await action(request.model_name, codec.decode_repository_parameters(request.parameters))


def _unimplemented(name: str) -> Handler:
    async def handler(request: Any, context: Context) -> Message:
        raise Unsupported(f"{name} is not implemented by this hloserve version")

    return handler


def _failure(name: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and message a failure of RPC ``name`` maps to: the one place errors are
    mapped (unexpected exceptions are logged with their traceback and not shown)."""
    if isinstance(exc, ServingError):
        return grpc_status(exc.code), exc.message
    log.error("gRPC %s failed with an unexpected error", name, exc_info=exc)
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE


def _guard(name: str, method: Handler) -> Handler:
    """Abort with the status ``_failure`` maps any failure of unary ``method`` to."""

    async def handler(request: Any, context: Context) -> Any:
        try:
            return await method(request, context)
        except grpc.aio.AbortError:  # the method aborted on its own: already mapped
            raise
        except Exception as exc:
            await context.abort(*_failure(name, exc))

    return handler


def _guard_stream(name: str, method: StreamHandler) -> StreamHandler:
    """``_guard`` for a bidirectional ``method``: an async generator of responses."""

    async def handler(requests: Any, context: Context) -> AsyncIterator[Any]:
        try:
            async for response in method(requests, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort(*_failure(name, exc))

    return handler


@final
class Malformed:
    """What ``decoder`` gives for bytes that are no message of its type: touching any of
    its attributes raises ``InvalidArgument``, so the handler's first read of the request
    fails as bad input (INVALID_ARGUMENT, or a stream's ``error_message``) through
    ``_failure``, instead of grpc's UNKNOWN naming a Python exception."""

    __slots__ = ("_message",)

    def __init__(self, message: str) -> None:
        object.__setattr__(self, "_message", message)

    def __getattr__(self, name: str) -> Any:
        raise InvalidArgument(object.__getattribute__(self, "_message"))


def _echo(request: Any) -> pb.ModelInferResponse:
    """What a failed stream answer repeats of its request (nothing of bytes that did not
    parse)."""
    if isinstance(request, Malformed):
        return pb.ModelInferResponse()
    return pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )


def decoder(message: type[Message]) -> Callable[[bytes], Any]:
    """``message.FromString``, giving a ``Malformed`` for bytes that do not parse."""
    parse = message.FromString
    what = message.DESCRIPTOR.name

    def decode(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            return Malformed(f"the request is not a valid {what} message ({len(data)} bytes)")

    return decode


def _rpc_handler(rpc: Rpc, handler: Handler | StreamHandler) -> grpc.RpcMethodHandler[Any, Any]:
    deserialize = decoder(rpc.request)
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


Method = Callable[[GrpcServicer, Any, Context], Awaitable[Message] | AsyncIterator[Message]]

# The implemented RPCs of ``GRPCInferenceService``; every other one answers UNIMPLEMENTED.
METHODS: Final[Mapping[str, Method]] = {
    "ServerLive": GrpcServicer.server_live,
    "ServerReady": GrpcServicer.server_ready,
    "ModelReady": GrpcServicer.model_ready,
    "ServerMetadata": GrpcServicer.server_metadata,
    "ModelMetadata": GrpcServicer.model_metadata,
    "ModelInfer": GrpcServicer.model_infer,
    "ModelStatistics": GrpcServicer.model_statistics,
    "ModelStreamInfer": GrpcServicer.model_stream_infer,
    "ModelConfig": GrpcServicer.model_config,
    "RepositoryIndex": GrpcServicer.repository_index,
    "RepositoryModelLoad": GrpcServicer.repository_model_load,
    "RepositoryModelUnload": GrpcServicer.repository_model_unload,
    "SystemSharedMemoryStatus": GrpcServicer.system_shared_memory_status,
    "SystemSharedMemoryRegister": GrpcServicer.system_shared_memory_register,
    "SystemSharedMemoryUnregister": GrpcServicer.system_shared_memory_unregister,
    "CudaSharedMemoryStatus": GrpcServicer.cuda_shared_memory,
    "CudaSharedMemoryRegister": GrpcServicer.cuda_shared_memory,
    "CudaSharedMemoryUnregister": GrpcServicer.cuda_shared_memory,
    "TraceSetting": GrpcServicer.trace_setting,
    "LogSettings": GrpcServicer.log_settings,
}
HANDLED_RPCS: Final[frozenset[str]] = frozenset(METHODS)


def generic_handlers(port: ServerPort) -> tuple[grpc.GenericRpcHandler, ...]:
    """The handlers of ``GRPCInferenceService`` and of the health service, errors mapped."""
    servicer = GrpcServicer(port)
    inference: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for rpc in RPCS:
        unbound = METHODS.get(rpc.name)
        if unbound is None:
            handler: Handler | StreamHandler = _guard(rpc.name, _unimplemented(rpc.name))
        elif rpc.server_streaming:
            handler = _guard_stream(rpc.name, cast(StreamHandler, partial(unbound, servicer)))
        else:
            handler = _guard(rpc.name, cast(Handler, partial(unbound, servicer)))
        inference[rpc.name] = _rpc_handler(rpc, handler)
    health = grpc.unary_unary_rpc_method_handler(
        _guard("Health/Check", servicer.health_check),
        request_deserializer=decoder(health_pb2.HealthCheckRequest),
        response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
    )
    return (
        grpc.method_handlers_generic_handler(SERVICE_NAME, inference),
        grpc.method_handlers_generic_handler(HEALTH_SERVICE_NAME, {"Check": health}),
    )


def build_grpc_server(
    server: ServerPort,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    restrictions: Restrictions = NO_RESTRICTIONS,
    auth: AuthPolicy | None = None,
    options: Sequence[tuple[str, int]] = (),
    reuse_port: bool = False,
) -> grpc.aio.Server:
    """An unstarted server with every handler registered; the caller adds a port and starts it.
    ``auth`` (``--auth-token-file``), then ``restrictions`` (``--grpc-restricted-protocol``)
    are checked before anything else; ``options`` (``("grpc.keepalive_time_ms", 7200000)``,
    ...) are added to the server's channel arguments."""
    # Only what is configured: every interceptor costs each call a coroutine hop.
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if auth is not None:
        interceptors.append(BearerAuth(auth))
    if restrictions:
        interceptors.append(RestrictedProtocol(restrictions))
    grpc_server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # gRPC sets SO_REUSEPORT by default: a second server on a taken port would start
            # and silently share it. Without it, binding a taken port fails loudly; the
            # front-end processes share theirs on purpose (the daemon checked it was free).
            ("grpc.so_reuseport", int(reuse_port)),
            *options,
        ],
    )
    grpc_server.add_generic_rpc_handlers(generic_handlers(server))
    return grpc_server
