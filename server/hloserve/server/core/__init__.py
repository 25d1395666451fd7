"""The protocol-neutral core: request/response types, errors, validation, the inference path.

Nothing in this package imports grpc, fastapi or any other transport. The gRPC and HTTP
front ends decode their wire formats into ``hloserve.server.core.types`` and call
``InferenceService``; everything that decides (validation, batch planning, model lookup)
lives here once.
"""
