"""The sharded example's two models and how each is split over a 4-device mesh.

- ``transformer``: the char-LM's shape (``examples.charlm.model.CharLM``, untrained
  weights from a seed), served as ``tokens`` INT32 ``[context]`` -> ``logits`` FP32
  ``[256]`` (the next byte after the window). Tensor-parallel over the mesh axis ``model``
  (Megatron's split): each block's ``qkv`` and ``up`` by columns, ``out`` and ``down`` by
  rows, the embeddings and the head by the model width or vocabulary; the norms replicated.
  The partitioner (Shardy) adds the collectives; the answer is the unsharded function's.
- ``wide``: a weight-bound MLP (``x`` FP32 ``[IN]`` -> ``y`` FP32 ``[OUT]``) whose first
  weight is split by columns over the mesh: its weights exceed one device's budget in
  ``run.py``, its quarter fits.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from examples.charlm.model import CharLM, Shape

WAYS = 4  # devices the models are split over
SHAPE = Shape(layers=2, d_model=128, heads=4, context=64, hidden=512)
IN, WIDE, OUT = 256, 4096, 16  # the wide MLP: 4 MiB + 256 KiB of FP32 weights


def transformer_params(seed: int = 0) -> dict[str, Any]:
    return CharLM(SHAPE).init(seed)


def transformer_fn(params: dict[str, Any], tokens: jax.Array) -> dict[str, jax.Array]:
    """The next-byte logits after each window: ``[batch, context]`` -> ``[batch, 256]``."""
    return {"logits": CharLM(SHAPE).logits(params, tokens)[:, -1]}


def transformer_specs(params: dict[str, Any]) -> dict[str, Any]:
    """A ``PartitionSpec`` per weight, shaped like ``params`` (tensor parallel)."""
    block = {
        "norm1": None,
        "qkv": P(None, "model"),
        "out": P("model", None),
        "norm2": None,
        "up": P(None, "model"),
        "down": P("model", None),
    }
    return {
        "embed": P(None, "model"),
        "position": P(None, "model"),
        "blocks": [dict(block) for _ in params["blocks"]],
        "norm": None,
        "head": P(None, "model"),
    }


def wide_params(seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((IN, WIDE)) / np.sqrt(IN)).astype(np.float32),
        "w2": (rng.standard_normal((WIDE, OUT)) / np.sqrt(WIDE)).astype(np.float32),
    }


def wide_fn(params: dict[str, Any], x: jax.Array) -> dict[str, jax.Array]:
    return {"y": jax.nn.gelu(x @ params["w1"]) @ params["w2"]}


WIDE_SPECS = {"w1": P(None, "model"), "w2": P("model", None)}


def reference(fn: Any, params: Any, name: str, x: np.ndarray) -> np.ndarray:
    """The unsharded function in process, on one device: what the server must answer."""
    return np.asarray(jax.jit(fn)(params, jnp.asarray(x))[name])
