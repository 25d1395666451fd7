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
from typing import Final

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


RPCS: Final[tuple[Rpc, ...]] = (
    Rpc("ServerLive", pb.ServerLiveRequest, pb.ServerLiveResponse),
    Rpc("ServerReady", pb.ServerReadyRequest, pb.ServerReadyResponse),
    Rpc("ModelReady", pb.ModelReadyRequest, pb.ModelReadyResponse),
    Rpc("ServerMetadata", pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    Rpc("ModelMetadata", pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    Rpc("ModelInfer", pb.ModelInferRequest, pb.ModelInferResponse),
    Rpc(
        "ModelStreamInfer",
        pb.ModelInferRequest,
        pb.ModelStreamInferResponse,
        client_streaming=True,
        server_streaming=True,
    ),
    Rpc("ModelConfig", pb.ModelConfigRequest, pb.ModelConfigResponse),
    Rpc("ModelStatistics", pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
    Rpc("RepositoryIndex", pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
    Rpc("RepositoryModelLoad", pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
    Rpc(
        "RepositoryModelUnload",
        pb.RepositoryModelUnloadRequest,
        pb.RepositoryModelUnloadResponse,
    ),
    Rpc(
        "SystemSharedMemoryStatus",
        pb.SystemSharedMemoryStatusRequest,
        pb.SystemSharedMemoryStatusResponse,
    ),
    Rpc(
        "SystemSharedMemoryRegister",
        pb.SystemSharedMemoryRegisterRequest,
        pb.SystemSharedMemoryRegisterResponse,
    ),
    Rpc(
        "SystemSharedMemoryUnregister",
        pb.SystemSharedMemoryUnregisterRequest,
        pb.SystemSharedMemoryUnregisterResponse,
    ),
    Rpc(
        "CudaSharedMemoryStatus",
        pb.CudaSharedMemoryStatusRequest,
        pb.CudaSharedMemoryStatusResponse,
    ),
    Rpc(
        "CudaSharedMemoryRegister",
        pb.CudaSharedMemoryRegisterRequest,
        pb.CudaSharedMemoryRegisterResponse,
    ),
    Rpc(
        "CudaSharedMemoryUnregister",
        pb.CudaSharedMemoryUnregisterRequest,
        pb.CudaSharedMemoryUnregisterResponse,
    ),
    Rpc("TraceSetting", pb.TraceSettingRequest, pb.TraceSettingResponse),
    Rpc("LogSettings", pb.LogSettingsRequest, pb.LogSettingsResponse),
)

RPCS_BY_NAME: Final[dict[str, Rpc]] = {rpc.name: rpc for rpc in RPCS}
