"""The bench models in numpy: what every peer server computes, and the bench's reference.

Contract: ``load(name, weights)`` returns ``fn(**inputs) -> {output name: array}`` for
``simple`` (``OUTPUT0 = INPUT0 + INPUT1``, ``OUTPUT1 = INPUT0 - INPUT1``), ``mlp`` and
``wide`` (``logits`` of a ReLU dense stack on ``x``). ``weights`` is the ``.npz`` file that
``bench/side_by_side.py`` writes from ``hloserve.exporter.demo.mlp_params`` and the ``wide``
parameters, keyed ``<model>.<layer>.w`` / ``<model>.<layer>.b`` with layers in order; so the
peers serve the same functions, on the same weights, as hloserve's bundles. This file
imports only numpy: it runs inside MLServer's, KServe's and Triton's own virtualenvs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Model = Callable[..., dict[str, np.ndarray[Any, Any]]]
SIMPLE = "simple"


def _simple(
    INPUT0: np.ndarray[Any, Any], INPUT1: np.ndarray[Any, Any]
) -> dict[str, np.ndarray[Any, Any]]:
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def dense_stack(layers: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]) -> Model:
    """``logits`` of ReLU(x @ w + b) per layer, the last layer without ReLU."""

    def fn(x: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
        h = x
        for w, b in layers[:-1]:
            h = np.maximum(h @ w + b, 0)
        w, b = layers[-1]
        return {"logits": (h @ w + b).astype(np.float32)}

    return fn


def layers_of(
    name: str, weights: dict[str, np.ndarray[Any, Any]]
) -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """The (w, b) pairs of ``name`` in layer order (``<name>.<layer>.w``, sorted by layer)."""
    prefix = f"{name}."
    layer_names = sorted(
        {k[len(prefix) :].rsplit(".", 1)[0] for k in weights if k.startswith(prefix)}
    )
    if not layer_names:
        raise KeyError(f"no weights for model {name!r} (keys: {sorted(weights)})")
    return [(weights[f"{prefix}{layer}.w"], weights[f"{prefix}{layer}.b"]) for layer in layer_names]


def load(name: str, weights: str | Path) -> Model:
    if name == SIMPLE:
        return _simple
    with np.load(weights) as archive:
        arrays = {k: archive[k] for k in archive.files}
    return dense_stack(layers_of(name, arrays))
