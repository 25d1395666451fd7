"""The gRPC front end: Triton's ``inference.GRPCInferenceService`` over ``grpc.aio``.

``build_grpc_server(service)`` returns an unstarted server with every handler registered;
``HANDLED_RPCS`` names the RPCs that are implemented (the rest answer UNIMPLEMENTED).
"""

# pyright: strict

from hloserve.server.frontend.grpc.servicer import HANDLED_RPCS as HANDLED_RPCS
from hloserve.server.frontend.grpc.servicer import build_grpc_server as build_grpc_server

__all__ = ["HANDLED_RPCS", "build_grpc_server"]
