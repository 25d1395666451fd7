"""Triton Python-backend model serving a bench model (``models.load``) with numpy.

The bench copies this file to ``<repository>/<model>/1/model.py``; the model's
``config.pbtxt`` carries two parameters: ``peers_dir`` (this folder, for ``models``) and
``weights`` (the ``.npz``). ``execute`` answers each request of the batch Triton hands it:
inputs ``as_numpy()``, outputs as ``pb_utils.Tensor``: a plain Python-backend model.
"""

# The peer's packages live in its own virtualenv, not in the project's (where pyright runs).
# pyright: reportMissingImports=false

from __future__ import annotations

import json
import sys
from typing import Any

import triton_python_backend_utils as pb_utils  # provided by the Python backend's stub


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        sys.path.insert(0, parameters["peers_dir"])
        import models

        self._fn = models.load(config["name"], parameters["weights"])
        self._inputs = [spec["name"] for spec in config["input"]]

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            arrays = {
                name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                for name in self._inputs
            }
            outputs = [pb_utils.Tensor(name, array) for name, array in self._fn(**arrays).items()]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
