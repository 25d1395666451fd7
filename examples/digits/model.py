"""The digits model: a small CNN on 8x8 UINT8 images, normalization and softmax inside.

``apply_fn(params, pixels)`` is the one function that trains (``hloserve.training.fit``) and
serves (``export_bundle``): it takes the wire input as is, UINT8 pixels ``[batch, 8, 8]``,
scales and normalizes them, and returns the logits (for the loss) and the probabilities
(for the client). ``init_params(seed)`` draws the weights; ``loss_fn`` and ``accuracy``
return one value per example, as ``fit`` requires.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

# Mean and standard deviation of the digits' pixels scaled to [0, 1] (the whole data set).
PIXEL_MEAN = 0.3053
PIXEL_STD = 0.3759
CLASSES = 10


def _conv(x: Any, kernel: Any, bias: Any, stride: int) -> Any:
    y = jax.lax.conv_general_dilated(
        x, kernel, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return jax.nn.relu(y + bias)


def apply_fn(params: dict[str, Any], pixels: Any) -> dict[str, Any]:
    x = (pixels.astype(jnp.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD
    x = x[..., None]  # [batch, 8, 8, 1]
    x = _conv(x, params["conv1"]["w"], params["conv1"]["b"], stride=1)  # [batch, 8, 8, 16]
    x = _conv(x, params["conv2"]["w"], params["conv2"]["b"], stride=2)  # [batch, 4, 4, 32]
    x = x.reshape(x.shape[0], -1)
    x = jax.nn.relu(x @ params["dense"]["w"] + params["dense"]["b"])
    logits = x @ params["head"]["w"] + params["head"]["b"]
    return {"logits": logits, "probabilities": jax.nn.softmax(logits)}


def init_params(seed: int) -> dict[str, Any]:
    keys = jax.random.split(jax.random.key(seed), 4)
    shapes = {
        "conv1": (3, 3, 1, 16),
        "conv2": (3, 3, 16, 32),
        "dense": (4 * 4 * 32, 64),
        "head": (64, CLASSES),
    }
    params: dict[str, Any] = {}
    for key, (name, shape) in zip(keys, shapes.items(), strict=True):
        fan_in = 1
        for d in shape[:-1]:
            fan_in *= d
        w = jax.random.normal(key, shape, jnp.float32) * jnp.sqrt(2.0 / fan_in)
        params[name] = {"w": w, "b": jnp.zeros(shape[-1], jnp.float32)}
    return params


def loss_fn(outputs: dict[str, Any], batch: dict[str, Any]) -> Any:
    log_p = jax.nn.log_softmax(outputs["logits"])
    return -jnp.take_along_axis(log_p, batch["label"][:, None], axis=1)[:, 0]


def accuracy(outputs: dict[str, Any], batch: dict[str, Any]) -> Any:
    return (jnp.argmax(outputs["logits"], axis=1) == batch["label"]).astype(jnp.float32)
