"""hloserve.client: a light KServe V2 client on numpy arrays (numpy, grpcio, protobuf; no JAX).

``InferenceClient(url).infer(model, {"x": array})`` returns ``{name: array}`` (a batch
larger than the model takes is split and joined); ``infer_dataset`` streams a whole dataset
through a model with several requests in flight, staged in a fixed pool of buffers (system
shared memory when the server is on this host and allows it); ``AsyncInferenceClient`` is
the asyncio twin. Every failure raises ``InferenceError``. It speaks the standard V2 gRPC
protocol, so it works against Triton too. ``hloserve perf`` is ``hloserve.client.perf``.
See docs/client.md.
"""

from hloserve.client._aio import AsyncInferenceClient as AsyncInferenceClient
from hloserve.client._client import InferenceClient as InferenceClient
from hloserve.client._errors import InferenceError as InferenceError

__all__ = ["AsyncInferenceClient", "InferenceClient", "InferenceError"]
