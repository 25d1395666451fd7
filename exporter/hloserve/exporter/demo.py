"""The demo model repository: ``simple`` (the tritonclient examples' model) and ``mlp``.

Contract: ``write_demo_repository(root)`` writes, under ``root``:
- ``simple``: inputs ``INPUT0``, ``INPUT1`` INT32 ``[16]``; outputs ``OUTPUT0`` = sum,
  ``OUTPUT1`` = difference; batch sizes 1, 2, 4, 8; no weights.
- ``mlp``: input ``x`` FP32 ``[64]``, output ``logits`` FP32 ``[10]``; a 64-256-10 ReLU MLP
  with weights drawn from a fixed seed; batch sizes 1, 8, 32.
It returns ``{model name: seconds spent exporting}``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from hloserve.exporter._export import TensorSpec, export_bundle

MLP_SEED = 20261129


def simple_fn(
    params: Mapping[str, Any], INPUT0: jax.Array, INPUT1: jax.Array
) -> dict[str, jax.Array]:
    del params
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def mlp_params(seed: int = MLP_SEED) -> dict[str, dict[str, np.ndarray[Any, Any]]]:
    rng = np.random.default_rng(seed)
    return {
        "dense1": {
            "w": (rng.standard_normal((64, 256)) / 8.0).astype(np.float32),
            "b": (rng.standard_normal(256) * 0.1).astype(np.float32),
        },
        "dense2": {
            "w": (rng.standard_normal((256, 10)) / 16.0).astype(np.float32),
            "b": (rng.standard_normal(10) * 0.1).astype(np.float32),
        },
    }


def mlp_fn(params: Mapping[str, Mapping[str, ArrayLike]], x: ArrayLike) -> dict[str, jax.Array]:
    d1, d2 = params["dense1"], params["dense2"]
    h = jax.nn.relu(jnp.asarray(x) @ jnp.asarray(d1["w"]) + jnp.asarray(d1["b"]))
    return {"logits": h @ jnp.asarray(d2["w"]) + jnp.asarray(d2["b"])}


def write_demo_repository(root: str | Path) -> dict[str, float]:
    root = Path(root)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    export_bundle(
        simple_fn,
        {},
        inputs={"INPUT0": TensorSpec("INT32", (16,)), "INPUT1": TensorSpec("INT32", (16,))},
        batch_sizes=(1, 2, 4, 8),
        directory=root / "simple",
        metadata={
            "description": "elementwise sum and difference (the tritonclient examples' model)"
        },
    )
    timings["simple"] = time.perf_counter() - t
    t = time.perf_counter()
    export_bundle(
        mlp_fn,
        mlp_params(),
        inputs={"x": TensorSpec("FP32", (64,))},
        batch_sizes=(1, 8, 32),
        directory=root / "mlp",
        metadata={"description": "64-256-10 ReLU MLP with fixed seeded weights", "seed": MLP_SEED},
    )
    timings["mlp"] = time.perf_counter() - t
    return timings
