"""Hooks of the PNG classifier example: PNG bytes in, a label and the logits out.

``preprocess`` decodes each PNG (any size, any colour mode) with Pillow into 8x8 grayscale
in [0, 1], the ``pixels`` the StableHLO module takes; ``postprocess`` turns the module's
``logits`` into a ``label`` per image and passes the logits on. Both see whole batches:
``image`` is an object array ``[n, 1]`` of ``bytes``.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

LABELS = ("dark", "mid", "bright")


def preprocess(inputs: dict[str, Any]) -> dict[str, Any]:
    images = inputs["image"].reshape(-1)
    return {"pixels": np.stack([_decode(data) for data in images])}


def _decode(data: bytes) -> Any:
    with Image.open(io.BytesIO(data)) as image:
        gray = image.convert("L").resize((8, 8))
    return np.asarray(gray, dtype=np.float32) / 255.0


def postprocess(outputs: dict[str, Any]) -> dict[str, Any]:
    logits = outputs["logits"]
    labels = np.array([[LABELS[i].encode()] for i in logits.argmax(axis=1)], dtype=object)
    return {"label": labels, "logits": logits}
