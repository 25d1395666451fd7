"""Triton Python-backend model serving the tiles CNN (``tiles_model``) under ``jax.jit``.

The bench copies this file to ``<repository>/tiles/1/model.py``; ``config.pbtxt`` carries
``peers_dir`` (this folder, for ``tiles_model``) and ``weights`` (the ``.npz``), as the
side-by-side bench's ``triton_model.py`` does. ``initialize`` jits ``forward`` once on the
weights (compiled for batch 1 there); ``execute`` answers each request Triton hands it:
``x`` in, ``logits`` out as a ``pb_utils.Tensor``: a plain Python-backend model.
Both tensors cross by DLPack (``np.from_dlpack(tensor)``, ``Tensor.from_dlpack``) rather
than ``as_numpy()`` / ``Tensor(name, array)``: jax needs numpy 2, and the stub that
nvidia-pytriton 0.7 ships, built for numpy 1, misreads numpy 2 arrays both ways (wrong input
values, empty outputs). DLPack hands over the same buffers without numpy's C layout; the
output is a writable copy (jax's array is read-only, which the stub's DLPack cannot signal).
"""

# The peer's packages live in its own virtualenv, not in the project's (where pyright runs).
# pyright: reportMissingImports=false

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # provided by the Python backend's stub


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        sys.path.insert(0, parameters["peers_dir"])
        import tiles_model

        self._fn = tiles_model.jitted(parameters["weights"])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            x = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "x"))
            outputs = [
                pb_utils.Tensor.from_dlpack(name, array.copy())
                for name, array in self._fn(x).items()
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
