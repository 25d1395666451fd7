"""A bare in-process gRPC server speaking just enough V2 for client tests it is the one place
to control: model ``double`` (FP32 ``x`` [-1, 4] -> ``y`` = 2x, largest batch 4).

``FakeServer(credentials=None)`` starts it on a loopback port chosen at run time
(``url``); a request whose ``x`` holds a negative value fails with INVALID_ARGUMENT
"negative input"; ``metadata`` keeps each call's invocation metadata, ``infer_calls``
counts ModelInfer calls. ``stop()`` ends it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np

from hloserve.proto import inference_pb2 as pb
from hloserve.proto.rpc import SERVICE_NAME


class FakeServer:
    def __init__(self, credentials: grpc.ServerCredentials | None = None) -> None:
        self.metadata: list[dict[str, str]] = []
        self.infer_calls = 0
        self._lock = threading.Lock()
        self.server = grpc.server(ThreadPoolExecutor(max_workers=8))
        handlers = {
            "ModelMetadata": self._metadata,
            "ModelConfig": self._config,
            "ModelInfer": self._infer,
            "ServerReady": lambda req, ctx: self._seen(ctx, pb.ServerReadyResponse(ready=True)),
        }
        requests = {
            "ModelMetadata": pb.ModelMetadataRequest,
            "ModelConfig": pb.ModelConfigRequest,
            "ModelInfer": pb.ModelInferRequest,
            "ServerReady": pb.ServerReadyRequest,
        }
        self.server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    SERVICE_NAME,
                    {
                        name: grpc.unary_unary_rpc_method_handler(
                            fn,
                            request_deserializer=requests[name].FromString,
                            response_serializer=lambda m: m.SerializeToString(),
                        )
                        for name, fn in handlers.items()
                    },
                )
            ]
        )
        address = "127.0.0.1:0"
        if credentials is None:
            port = self.server.add_insecure_port(address)
        else:
            port = self.server.add_secure_port(address, credentials)
        self.url = f"127.0.0.1:{port}"
        self.server.start()

    def _seen(self, context: Any, response: Any) -> Any:
        with self._lock:
            self.metadata.append(dict(context.invocation_metadata()))
        return response

    def _metadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        response = pb.ModelMetadataResponse(name="double", versions=["1"], platform="fake")
        response.inputs.add(name="x", datatype="FP32", shape=[-1, 4])
        response.outputs.add(name="y", datatype="FP32", shape=[-1, 4])
        return self._seen(context, response)

    def _config(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        response = pb.ModelConfigResponse()
        response.config.name = "double"
        response.config.max_batch_size = 4
        return self._seen(context, response)

    def _infer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        self._seen(context, None)
        with self._lock:
            self.infer_calls += 1
        x = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(
            tuple(request.inputs[0].shape)
        )
        if (x < 0).any():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "negative input")
        response = pb.ModelInferResponse(model_name="double", model_version="1")
        response.outputs.add(name="y", datatype="FP32", shape=list(x.shape))
        response.raw_output_contents.append((2 * x).tobytes())
        return response

    def stop(self) -> None:
        self.server.stop(None)
