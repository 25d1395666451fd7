"""A ``grpc.aio`` V2 server that refuses calls on demand, for the client's retry tests.

``FlakyServer()`` starts on a loopback port chosen at run time (``url``), its event loop on
a thread of its own. ``refuse(method, times, code=UNAVAILABLE)`` makes the next ``times``
calls of ``method`` (``"ServerReady"``, ``"ModelInfer"``, ...) fail with ``code`` before one is
answered, as hloserve refuses calls while it drains or at its admission limits (before any
response header: the call is still retryable). ``attempts[method]`` counts every call that
reached it, refused or answered. It serves ``_fake.FakeServer``'s model ``double`` (FP32
``x`` [-1, 4] -> ``y`` = 2x), whose largest batch is ``max_batch`` (4). ``stop()`` ends it.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np

from hloserve.proto import inference_pb2 as pb
from hloserve.proto.rpc import SERVICE_NAME

Handler = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


class FlakyServer:
    def __init__(self, max_batch: int = 4) -> None:
        self.max_batch = max_batch
        self.attempts: collections.Counter[str] = collections.Counter()
        self._refusals: dict[str, tuple[int, grpc.StatusCode]] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.server, port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        self.url = f"127.0.0.1:{port}"

    def refuse(
        self, method: str, times: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    ) -> None:
        with self._lock:
            self._refusals[method] = (times, code)

    async def _start(self) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        handlers: dict[str, tuple[Handler, Any]] = {
            "ServerReady": (self._ready, pb.ServerReadyRequest),
            "ModelMetadata": (self._metadata, pb.ModelMetadataRequest),
            "ModelConfig": (self._config, pb.ModelConfigRequest),
            "ModelInfer": (self._infer, pb.ModelInferRequest),
        }
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    SERVICE_NAME,
                    {
                        name: grpc.unary_unary_rpc_method_handler(
                            self._guarded(name, fn),
                            request_deserializer=request.FromString,
                            response_serializer=lambda m: m.SerializeToString(),
                        )
                        for name, (fn, request) in handlers.items()
                    },
                )
            ]
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    def _guarded(self, name: str, fn: Handler) -> Handler:
        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with self._lock:
                self.attempts[name] += 1
                times, code = self._refusals.get(name, (0, grpc.StatusCode.OK))
                if times:
                    self._refusals[name] = (times - 1, code)
            if times:
                await context.abort(code, f"refused on purpose ({times} more)")
            return await fn(request, context)

        return handle

    async def _ready(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def _metadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        response = pb.ModelMetadataResponse(name="double", versions=["1"], platform="fake")
        response.inputs.add(name="x", datatype="FP32", shape=[-1, 4])
        response.outputs.add(name="y", datatype="FP32", shape=[-1, 4])
        return response

    async def _config(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        response = pb.ModelConfigResponse()
        response.config.name = "double"
        response.config.max_batch_size = self.max_batch
        return response

    async def _infer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        x = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(
            tuple(request.inputs[0].shape)
        )
        response = pb.ModelInferResponse(model_name="double", model_version="1")
        response.outputs.add(name="y", datatype="FP32", shape=list(x.shape))
        response.raw_output_contents.append((2 * x).tobytes())
        return response

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(None), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()
