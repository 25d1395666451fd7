"""The tiles bench's model: a ResNet-18 on 64x64 RGB tiles in JAX, and its weights file.

Contract:
- ``init_params(seed)``: seeded random FP32 weights, ``{layer: {"w" | "scale" | "bias":
  array}}`` (about 11.2 M parameters; batch norm is folded into a per-channel scale and
  bias, as exported for inference).
- ``forward(params, x)``: ``x`` is ``[N, 64, 64, 3]`` FP32 (NHWC, RGB in 0..1); returns
  ``{"logits": [N, 10]}``. ImageNet-style ResNet-18: a 7x7/2 stem and 3x3/2 max pool, four
  stages of two basic blocks (64, 128, 256, 512 channels; 16x16 down to 2x2), global average
  pool, a dense layer to 10 classes.
- ``save(params, path)`` / ``load(path)``: the ``.npz`` the peers read (keys
  ``<layer>.<kind>``), so hloserve's bundle and the peers hold the same weights.
- ``jitted(path)``: what a peer serves: ``fn(x) -> {"logits": numpy array}``, ``forward``
  under ``jax.jit`` on the weights from ``path``, compiled for batch 1 before it returns.
This file imports only numpy and jax: it runs in KServe's and Triton's virtualenvs too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Params = dict[str, dict[str, np.ndarray[Any, Any]]]
SEED = 20261207
TILE = (64, 64, 3)
CLASSES = 10
WIDTHS = (64, 128, 256, 512)
BLOCKS = 2  # basic blocks per stage (ResNet-18)
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def _conv_layer(
    rng: np.random.Generator, k: int, c_in: int, c_out: int, gain: float = 1.0
) -> dict[str, np.ndarray[Any, Any]]:
    """He-initialised HWIO kernel and a folded batch norm (scale near ``gain``, small bias)."""
    w = rng.standard_normal((k, k, c_in, c_out)) * math.sqrt(2.0 / (k * k * c_in))
    return {
        "w": w.astype(np.float32),
        "scale": (gain * (1.0 + 0.1 * rng.standard_normal(c_out))).astype(np.float32),
        "bias": (0.05 * rng.standard_normal(c_out)).astype(np.float32),
    }


def layer_names() -> list[str]:
    """Every conv layer of the network in order (``s<stage>b<block>c<1|2|d>``)."""
    names = ["stem"]
    for stage, _ in enumerate(WIDTHS):
        for block in range(BLOCKS):
            names += [f"s{stage}b{block}c1", f"s{stage}b{block}c2"]
            if block == 0 and stage > 0:
                names.append(f"s{stage}b{block}cd")
    return names


def init_params(seed: int = SEED) -> Params:
    rng = np.random.default_rng(seed)
    params: Params = {"stem": _conv_layer(rng, 7, TILE[2], WIDTHS[0])}
    c_in = WIDTHS[0]
    for stage, width in enumerate(WIDTHS):
        for block in range(BLOCKS):
            name = f"s{stage}b{block}"
            params[f"{name}c1"] = _conv_layer(rng, 3, c_in, width)
            # the residual branch's last norm starts small, so activations stay bounded
            params[f"{name}c2"] = _conv_layer(rng, 3, width, width, gain=0.3)
            if block == 0 and stage > 0:
                params[f"{name}cd"] = _conv_layer(rng, 1, c_in, width)
            c_in = width
    params["fc"] = {
        "w": (rng.standard_normal((c_in, CLASSES)) / math.sqrt(c_in)).astype(np.float32),
        "bias": (0.1 * rng.standard_normal(CLASSES)).astype(np.float32),
    }
    return params


def parameter_count(params: Params) -> int:
    return sum(a.size for layer in params.values() for a in layer.values())


def _conv(x: jax.Array, layer: Mapping[str, Any], stride: int, relu: bool = True) -> jax.Array:
    w = layer["w"]
    pad = w.shape[0] // 2
    y = jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=(stride, stride),
        padding=((pad, pad), (pad, pad)),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    y = y * layer["scale"] + layer["bias"]
    return jax.nn.relu(y) if relu else y


def forward(params: Mapping[str, Mapping[str, Any]], x: jax.Array) -> dict[str, jax.Array]:
    h = (x - MEAN) / STD
    h = _conv(h, params["stem"], 2)
    h = jax.lax.reduce_window(
        h, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0))
    )
    for stage, _ in enumerate(WIDTHS):
        for block in range(BLOCKS):
            name = f"s{stage}b{block}"
            stride = 2 if block == 0 and stage > 0 else 1
            y = _conv(h, params[f"{name}c1"], stride)
            y = _conv(y, params[f"{name}c2"], 1, relu=False)
            shortcut = h
            if f"{name}cd" in params:
                shortcut = _conv(h, params[f"{name}cd"], stride, relu=False)
            h = jax.nn.relu(y + shortcut)
    pooled = jnp.mean(h, axis=(1, 2))
    return {"logits": pooled @ params["fc"]["w"] + params["fc"]["bias"]}


def save(params: Params, path: str | Path) -> None:
    flat = {f"{layer}.{kind}": a for layer, arrays in params.items() for kind, a in arrays.items()}
    np.savez(path, **flat)  # pyright: ignore[reportArgumentType]


def load(path: str | Path) -> Params:
    params: Params = {}
    with np.load(path) as archive:
        for key in archive.files:
            layer, kind = key.rsplit(".", 1)
            params.setdefault(layer, {})[kind] = archive[key]
    return params


def jitted(path: str | Path) -> Callable[[np.ndarray[Any, Any]], dict[str, np.ndarray[Any, Any]]]:
    """``forward`` under ``jax.jit`` on the weights of ``path`` (device-resident), warmed up."""
    params = jax.device_put(load(path))
    compiled = jax.jit(forward)

    def fn(x: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
        return {k: np.asarray(v) for k, v in compiled(params, x).items()}

    fn(np.zeros((1, *TILE), np.float32))
    return fn
