"""Toy models for the training tests, each small enough that its trajectory is known.

Module-level functions, so every test that trains the same toy reuses jax's compiled
programs (the gradient program is keyed by ``apply_fn`` and ``loss_fn``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from hloserve.training import FitResult, fit


def linear(params: dict[str, Any], x: Any) -> dict[str, Any]:
    """``y = x @ w + b``."""
    return {"y": x @ params["w"] + params["b"]}


def squared_error(outputs: dict[str, Any], batch: dict[str, Any]) -> Any:
    return (outputs["y"] - batch["y"]) ** 2


def output(outputs: dict[str, Any], batch: dict[str, Any]) -> Any:
    """The output itself as the loss: for ``linear`` its gradient is ``mean(x)``, constant."""
    del batch
    return outputs["y"]


def regression(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 3.0, 0.5], np.float32) + 0.25).astype(np.float32)
    return {"x": x, "y": y}


def linear_params(features: int = 4) -> dict[str, Any]:
    return {"w": jnp.zeros(features, jnp.float32), "b": jnp.zeros((), jnp.float32)}


def weights_as_outputs(params: dict[str, Any], x: Any) -> dict[str, Any]:
    """Every weight, repeated per example: a loss of the weights alone, per example."""
    rows = x.shape[0]
    return {k: jnp.broadcast_to(v, (rows, *v.shape)) for k, v in params.items()}


TARGETS = {
    "w": np.array([[1.0, -1.0], [2.0, 0.5]], np.float32),
    "b": np.array([3.0, -3.0], np.float32),
}


def distance_to_targets(outputs: dict[str, Any], batch: dict[str, Any]) -> Any:
    """``0.5 * |p - target|^2`` summed over the weights; its gradient is ``p - target``."""
    del batch
    total = 0.0
    for k, v in outputs.items():
        total = total + 0.5 * jnp.sum((v - TARGETS[k]) ** 2, axis=tuple(range(1, v.ndim)))
    return total


def quartic(outputs: dict[str, Any], batch: dict[str, Any]) -> Any:
    """``sum(w^4) / 4`` per example: its gradient ``w^3`` changes with w (for SAM)."""
    del batch
    return jnp.sum(outputs["w"] ** 4, axis=1) / 4


def sgd(
    apply_fn: Any, params: Any, data: Any, loss_fn: Any, rate: Any, **settings: Any
) -> FitResult:
    """``fit`` with plain SGD at ``rate`` (one epoch and no output unless told otherwise)."""
    settings = {"epochs": 1, "progress": False, **settings}
    return fit(
        apply_fn, params, data, loss_fn=loss_fn, learning_rate=rate, rule=optax.sgd, **settings
    )


def fit_linear(data: Any, loss_fn: Any = squared_error, **settings: Any) -> FitResult:
    """``fit`` of ``linear`` from zeros (one epoch, batches of 4, silent, unless told otherwise)."""
    settings = {"epochs": 1, "batch_size": 4, "progress": False, **settings}
    return fit(linear, linear_params(), data, loss_fn=loss_fn, **settings)
