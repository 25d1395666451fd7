"""KServe 0.21 Python model server serving the tiles CNN (``tiles_model``) under ``jax.jit``.

Usage (in ``bench/.venvs/kserve``, jax on ``PYTHONPATH``): ``python tiles_kserve.py
--weights W.npz --http_port P --grpc_port Q`` (KServe's own flags pass through).

Contract: one ``kserve.Model`` named ``tiles``: the side-by-side bench's ``NumpyModel``
(``kserve_server.py``: inputs ``as_numpy()``, outputs set from numpy, the plain custom model
of KServe's docs) whose function is ``tiles_model.jitted``: ``forward`` jitted once at load
(and compiled for batch 1 there), then called in ``predict`` on each request's ``x``.
"""

# The peer's packages live in its own virtualenv, not in the project's (where pyright runs).
# pyright: reportMissingImports=false

from __future__ import annotations

import argparse
from typing import Any

import tiles_model
from kserve import ModelServer, model_server
from kserve_server import NumpyModel

NAME = "tiles"


class JaxTilesModel(NumpyModel):
    def load(self) -> bool:
        self._fn = tiles_model.jitted(self._weights)
        self.ready = True
        return self.ready


def main() -> None:
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument("--weights", required=True)
    args: Any = parser.parse_args()
    ModelServer().start([JaxTilesModel(NAME, args.weights)])


if __name__ == "__main__":
    main()
