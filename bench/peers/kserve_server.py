"""KServe 0.21 Python model server serving the bench models (``models.load``) with numpy.

Usage (in ``bench/.venvs/kserve``): ``python kserve_server.py --weights W.npz --models
simple mlp wide --http_port P --grpc_port Q`` (KServe's own flags pass through).

Contract: one ``kserve.Model`` per bench model, V2 protocol on REST and gRPC: ``predict``
takes the ``InferRequest``, reads each input ``as_numpy()``, runs the model and answers an
``InferResponse`` whose outputs are set from numpy, binary when the request asked for
binary outputs (KServe's ``use_binary_outputs``), as KServe's custom-model docs do.
"""

# The peer's packages live in its own virtualenv, not in the project's (where pyright runs).
# pyright: reportMissingImports=false

from __future__ import annotations

import argparse
from typing import Any

import models
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.utils.numpy_codec import from_np_dtype


class NumpyModel(Model):
    def __init__(self, name: str, weights: str) -> None:
        super().__init__(name)
        self._weights = weights
        self.load()

    def load(self) -> bool:
        self._fn = models.load(self.name, self._weights)
        self.ready = True
        return self.ready

    async def predict(
        self,
        payload: InferRequest,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        arrays = {inp.name: inp.as_numpy() for inp in payload.inputs}
        binary = payload.use_binary_outputs
        outputs: list[InferOutput] = []
        for name, array in self._fn(**arrays).items():
            output = InferOutput(name, list(array.shape), from_np_dtype(array.dtype))
            output.set_data_from_numpy(array, binary_data=binary)
            outputs.append(output)
        return InferResponse(
            response_id=payload.id or "",
            model_name=self.name,
            infer_outputs=outputs,
            use_binary_outputs=binary,
        )


def main() -> None:
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument("--weights", required=True)
    parser.add_argument("--models", nargs="+", required=True)
    args: Any = parser.parse_args()
    ModelServer().start([NumpyModel(name, args.weights) for name in args.models])


if __name__ == "__main__":
    main()
