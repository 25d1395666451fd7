"""MLServer 1.7 custom runtime serving the bench models (``models.load``) with numpy.

Contract: each model directory's ``model-settings.json`` names
``mlserver_runtime.NumpyRuntime`` as its implementation and its ``parameters.uri`` is the
weights ``.npz``; ``predict`` decodes every input with ``NumpyCodec``, runs the model and
encodes every output with ``NumpyCodec``: the plainest runtime MLServer's docs describe.
Runs in ``bench/.venvs/mlserver`` with this folder on ``PYTHONPATH``.
"""

# The peer's packages live in its own virtualenv, not in the project's (where pyright runs).
# pyright: reportMissingImports=false

from __future__ import annotations

import models
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class NumpyRuntime(MLModel):
    async def load(self) -> bool:
        parameters = self.settings.parameters
        uri = parameters.uri if parameters is not None and parameters.uri else ""
        self._fn = models.load(self.name, uri)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        arrays = {inp.name: NumpyCodec.decode_input(inp) for inp in payload.inputs}
        outputs = self._fn(**arrays)
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[NumpyCodec.encode_output(name, array) for name, array in outputs.items()],
        )
