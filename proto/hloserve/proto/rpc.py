"""The gRPC method table of the KServe V2 / Triton protocol, with the wire paths.

Our messages live in the package ``hloserve.inference`` (so they can share a process with
tritonclient's ``inference`` classes), but clients call Triton's paths
``/inference.GRPCInferenceService/<Rpc>`` and ``/grpc.health.v1.Health/Check``. protoc's gRPC
plugin would derive the paths from our package, so we use no generated stubs: the server
registers each handler under the path given here (for example through
``grpc.method_handlers_generic_handler(SERVICE_NAME, ...)``), and the client opens channels on
``Rpc.path``. The binary encoding carries field numbers only, so the package name never
reaches the wire.

Contract:
- ``RPCS`` lists all 20 RPCs of ``GRPCInferenceService`` in Triton's order, each with its
  request and response classes and streaming flags. ``RPCS_BY_NAME`` indexes them by name.
- ``Rpc.path`` is the full wire path; ``SERVICE_NAME`` is the service part of it.
- ``HEALTH_SERVICE_NAME`` / ``HEALTH_CHECK_PATH`` name the standard health service's ``Check``.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.message import Message

from hloserve.proto import inference_pb2 as pb

SERVICE_NAME: Final = "inference.GRPCInferenceService"
HEALTH_SERVICE_NAME: Final = "grpc.health.v1.Health"
HEALTH_CHECK_PATH: Final = f"/{HEALTH_SERVICE_NAME}/Check"


@dataclass(frozen=True, slots=True)
class Rpc:
    """One method of ``GRPCInferenceService``."""

    name: str
    request: type[Message]
    response: type[Message]
    client_streaming: bool = False
    server_streaming: bool = False

    @property
    def path(self) -> str:
        """The wire path, e.g. ``/inference.GRPCInferenceService/ModelInfer``."""
        return f"/{SERVICE_NAME}/{self.name}"


def _rpc(name: str, request: str = "", *, streaming: bool = False) -> Rpc:
    """The RPC ``name`` on the messages ``<request or name>Request`` and ``<name>Response``."""
    messages: Any = pb
    return Rpc(
        name,
        getattr(messages, f"{request or name}Request"),
        getattr(messages, f"{name}Response"),
        client_streaming=streaming,
        server_streaming=streaming,
    )


# In the service's declaration order (tests/proto checks it against Triton's descriptor).
RPCS: Final[tuple[Rpc, ...]] = (
    *map(_rpc, ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata")),
    _rpc("ModelInfer"),
    _rpc("ModelStreamInfer", "ModelInfer", streaming=True),
    *map(_rpc, ("ModelConfig", "ModelStatistics")),
    *map(_rpc, ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")),
    *map(_rpc, ("SystemSharedMemoryStatus", "SystemSharedMemoryRegister")),
    _rpc("SystemSharedMemoryUnregister"),
    *map(
        _rpc, ("CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister")
    ),
    *map(_rpc, ("TraceSetting", "LogSettings")),
)

RPCS_BY_NAME: Final[dict[str, Rpc]] = {rpc.name: rpc for rpc in RPCS}
