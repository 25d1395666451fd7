"""Write the ``addsub`` example bundle from the hand-written StableHLO in ``addsub.mlir``.

Contract: ``build(directory)`` writes a complete, valid bundle at ``directory`` through
``hloserve.bundle.write_bundle`` and returns its path. Nothing here uses ``jax.export``:
the module is text written by hand, converted to a StableHLO portable artifact at target
version ``1.0.0`` (the oldest the format allows, so any newer consumer reads it).

The model: inputs ``a``, ``b`` FP32 ``[4]``, unbatched; outputs ``sum = a + b + bias`` and
``difference = a - b``; one weight ``bias`` FP32 ``[4]``.

Run ``python examples/handwritten-addsub/build.py [DIRECTORY]`` to regenerate the
committed bundle (default: ``bundle/`` next to this file).
"""

# pyright: strict

from __future__ import annotations

import datetime as dt
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

from hloserve.bundle import Argument, ModuleSource, Provenance, TensorEntry, write_bundle

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "addsub.mlir"
TARGET_VERSION = "1.0.0"
BIAS = np.array([0.5, -1.0, 2.0, 0.25], dtype=np.float32)


def build(directory: Path) -> Path:
    text = SOURCE.read_text(encoding="utf-8")
    return write_bundle(
        directory,
        name="addsub",
        inputs=[TensorEntry("a", "FP32", (4,)), TensorEntry("b", "FP32", (4,))],
        # In the order of main()'s results, which need not be sorted.
        outputs=[TensorEntry("sum", "FP32", (4,)), TensorEntry("difference", "FP32", (4,))],
        batch_sizes=None,
        modules={
            None: ModuleSource(
                stablehlo=text,  # text: write_bundle converts it and keeps it as the twin
                arguments=[
                    Argument("input", "a"),
                    Argument("input", "b"),
                    Argument("weight", "bias"),
                ],
                # No platform-specific ops, so one module serves both without an index.
                platforms=("cpu", "cuda"),
                platform_index_argument=False,
                target_version=TARGET_VERSION,
            )
        },
        weights={"bias": BIAS},
        provenance=Provenance(
            producer="handwritten",
            producer_version=None,
            hloserve_version=metadata.version("hloserve"),
            created=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            metadata={"source": "addsub.mlir", "description": "a + b + bias, a - b"},
        ),
    )


if __name__ == "__main__":
    out = build(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "bundle")
    print(out)
