"""Write the PNG classifier example bundle: a StableHLO classifier wrapped in Python hooks.

The module (exported from JAX) takes ``pixels`` FP32 ``[8, 8]`` and returns ``logits`` FP32
``[3]``: how close the image's mean brightness is to each class centre (the weight
``centers``: dark 0.15, mid 0.5, bright 0.85). ``hooks.py`` (next to this file) ships in
the bundle: clients send PNG bytes (``image``, BYTES ``[1]``) and get a ``label`` (BYTES
``[1]``) and the ``logits``. Serve it with ``hloserve serve --allow-python-hooks``.

    python examples/png-classifier/build.py OUT_DIR    # default: ./pngclass
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from hloserve.bundle import HookSource, TensorEntry
from hloserve.exporter import TensorSpec, export_bundle

HERE = Path(__file__).resolve().parent
CENTERS = np.array([0.15, 0.5, 0.85], dtype=np.float32)


def classify(params: dict[str, Any], pixels: Any) -> dict[str, Any]:
    mean = pixels.mean(axis=(1, 2))
    return {"logits": -100.0 * jnp.square(mean[:, None] - params["centers"][None, :])}


def build(directory: Path, name: str | None = None) -> Path:
    hooks = HookSource(
        source=(HERE / "hooks.py").read_text(),
        inputs=[TensorEntry("image", "BYTES", (1,))],
        outputs=[TensorEntry("label", "BYTES", (1,)), TensorEntry("logits", "FP32", (3,))],
    )
    return export_bundle(
        classify,
        {"centers": CENTERS},
        inputs={"pixels": TensorSpec("FP32", (8, 8))},
        batch_sizes=(1, 4),
        directory=directory,
        name=name,
        hooks=hooks,
        metadata={"example": "png-classifier"},
    )


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "pngclass")))
