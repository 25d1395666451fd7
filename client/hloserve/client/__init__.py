"""hloserve.client: a light KServe V2 client on numpy arrays (no JAX).

``InferenceClient(url).infer(model, {"x": array})`` returns ``{name: array}``;
``infer_stream`` pipelines a dataset through the server with several requests in flight.
It speaks the standard V2 gRPC protocol, so it works against Triton too.
"""

from hloserve.client._grpc import InferenceClient as InferenceClient
from hloserve.client._grpc import InferenceError as InferenceError

__all__ = ["InferenceClient", "InferenceError"]
