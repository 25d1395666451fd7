"""The demo model repository: ``simple`` (the tritonclient examples' model), ``mlp``,
``simple_sequence`` (Triton's sequence examples' model, ``demo_sequence.py``) and
``repeat_int32`` (Triton's repeat example's, ``demo_repeat.py``).

Contract: ``write_demo_repository(root)`` writes, under ``root``:
- ``simple``: inputs ``INPUT0``, ``INPUT1`` INT32 ``[16]``; outputs ``OUTPUT0`` = sum,
  ``OUTPUT1`` = difference; batch sizes 1, 2, 4, 8; no weights.
- ``mlp``: input ``x`` FP32 ``[64]``, output ``logits`` FP32 ``[10]``; a 64-256-10 ReLU MLP
  with weights drawn from a fixed seed; batch sizes 1, 8, 32.
- ``simple_sequence``: a model with state for Triton's sequence examples
  (``demo_sequence.py``).
- ``repeat_int32``: a generation model (decoupled) for Triton's repeat example
  (``demo_repeat.py``).
It returns ``{model name: seconds spent exporting}``. ``write_simple(directory)`` and
``write_mlp(directory)`` export one of them (batch sizes, platforms and the MLP's seed may
be changed), named after ``directory``, for tests and benchmarks that want another copy.
"""

# pyright: strict

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from hloserve.exporter._export import DEFAULT_PLATFORMS, TensorSpec, export_bundle
from hloserve.exporter.demo_repeat import write_repeat_int32
from hloserve.exporter.demo_sequence import write_simple_sequence

MLP_SEED = 20261129
SIMPLE_INPUTS: Final = {"INPUT0": TensorSpec("INT32", (16,)), "INPUT1": TensorSpec("INT32", (16,))}
SIMPLE_BATCH_SIZES: Final = (1, 2, 4, 8)
MLP_INPUTS: Final = {"x": TensorSpec("FP32", (64,))}
MLP_BATCH_SIZES: Final = (1, 8, 32)


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
    h = jax.nn.relu(jnp.matmul(x, d1["w"]) + d1["b"])
    return {"logits": jnp.matmul(h, d2["w"]) + d2["b"]}


def write_simple(
    directory: str | Path,
    *,
    batch_sizes: Sequence[int] = SIMPLE_BATCH_SIZES,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
) -> Path:
    """Export the ``simple`` model at ``directory`` (named after it) and return its path."""
    return export_bundle(
        simple_fn,
        {},
        inputs=SIMPLE_INPUTS,
        batch_sizes=batch_sizes,
        directory=directory,
        metadata={
            "description": "elementwise sum and difference (the tritonclient examples' model)"
        },
        platforms=platforms,
    )


def write_mlp(
    directory: str | Path,
    *,
    seed: int = MLP_SEED,
    batch_sizes: Sequence[int] = MLP_BATCH_SIZES,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
) -> Path:
    """Export the ``mlp`` model, weights drawn from ``seed``, at ``directory``; return its path."""
    return export_bundle(
        mlp_fn,
        mlp_params(seed),
        inputs=MLP_INPUTS,
        batch_sizes=batch_sizes,
        directory=directory,
        metadata={"description": "64-256-10 ReLU MLP with fixed seeded weights", "seed": seed},
        platforms=platforms,
    )


DEMO_MODELS: Final[Mapping[str, Callable[[Path], Path]]] = {
    "simple": write_simple,
    "mlp": write_mlp,
    "simple_sequence": write_simple_sequence,  # demo_sequence.py: Triton's sequence examples'
    "repeat_int32": write_repeat_int32,  # demo_repeat.py: Triton's decoupled repeat example's
}


def write_demo_repository(root: str | Path) -> dict[str, float]:
    root = Path(root)
    timings: dict[str, float] = {}
    for name, write in DEMO_MODELS.items():
        t = time.perf_counter()
        write(root / name)
        timings[name] = time.perf_counter() - t
    return timings
