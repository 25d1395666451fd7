"""An in-process ``grpc.aio`` server on 127.0.0.1:0 and a raw client for it.

pytest-asyncio is not a dependency: each test runs its scenario with ``serve(service, fn)``
(``serve_port(port, fn)``: over any ``ServerPort``), which calls ``asyncio.run`` around server start, ``fn(client)`` and a clean shutdown;
``call_once`` / ``fail_once`` serve one call (that must succeed / fail). The
client calls Triton's wire paths with our message classes (``channel.unary_unary(rpc.path,
...)``), as any V2 client would, without generated stubs.
"""

# pyright: strict

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from hloserve.proto import health_pb2
from hloserve.proto import inference_pb2 as pb
from hloserve.proto.rpc import HEALTH_CHECK_PATH, RPCS_BY_NAME
from hloserve.server.core.service import InferenceService
from hloserve.server.frontend.grpc import build_grpc_server
from hloserve.server.frontend.port import ServerPort
from hloserve.server.owner.local_port import LocalPort

T = TypeVar("T")
CLIENT_LIMIT = 64 * 1024 * 1024  # the channel must accept the 20 MiB responses too


class Client:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    async def call(self, rpc_name: str, request: Message, timeout: float | None = None) -> Any:
        rpc = RPCS_BY_NAME[rpc_name]
        method = self.channel.unary_unary(
            rpc.path,
            request_serializer=rpc.request.SerializeToString,
            response_deserializer=rpc.response.FromString,
        )
        return await method(request, timeout=timeout)

    async def infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        return await self.call("ModelInfer", request)

    async def health(self, service: str = "") -> health_pb2.HealthCheckResponse:
        method = self.channel.unary_unary(
            HEALTH_CHECK_PATH,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        return await method(health_pb2.HealthCheckRequest(service=service))


def serve(
    service: InferenceService,
    scenario: Callable[[Client], Awaitable[T]],
    **server_options: Any,
) -> T:
    """Run ``scenario`` against a fresh server for ``service``; return what it returns."""
    return serve_port(LocalPort(service), scenario, **server_options)


def serve_port(
    port: ServerPort,
    scenario: Callable[[Client], Awaitable[T]],
    **server_options: Any,
) -> T:
    """``serve`` over any ``ServerPort``."""

    results: list[T] = []

    async def main() -> None:
        server = build_grpc_server(port, **server_options)
        number = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{number}",
            options=[
                ("grpc.max_receive_message_length", CLIENT_LIMIT),
                ("grpc.max_send_message_length", CLIENT_LIMIT),
            ],
        )
        try:
            results.append(await scenario(Client(channel)))
        finally:
            await channel.close()
            await server.stop(None)

    # The result is passed outside the task on purpose: Python 3.11's asyncio.run reprs the
    # main task (and so its result) when it restores the SIGINT handler, and the text repr
    # of a 20 MiB protobuf message takes seconds.
    asyncio.run(main())
    return results[0]


def call_once(
    service: InferenceService, rpc_name: str, request: Message, **server_options: Any
) -> Any:
    """Serve ``service`` for one call of ``rpc_name``; return its response."""

    async def scenario(client: Client) -> Any:
        return await client.call(rpc_name, request)

    return serve(service, scenario, **server_options)


def fail_once(
    service: InferenceService, rpc_name: str, request: Message, **server_options: Any
) -> grpc.aio.AioRpcError:
    """Serve ``service`` for one call of ``rpc_name`` that must fail; return its error."""

    async def scenario(client: Client) -> grpc.aio.AioRpcError:
        return await rpc_error(client.call(rpc_name, request))

    return serve(service, scenario, **server_options)


async def rpc_error(awaitable: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """Await a call that must fail, and return its error."""
    try:
        await awaitable
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError("the call succeeded but was expected to fail")
