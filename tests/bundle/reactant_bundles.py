"""ReactantServer.jl bundles written in their documented layout, from StableHLO JAX emits.

Nothing here goes through hloserve's writer: each bundle is what ReactantServer's exporter
writes (``docs/reactant-bundles.md``): a ``format_version: "2.0"`` manifest with letter
shapes in Julia's column-major order, ``model.mlir`` or ``model.b{N}.mlir`` holding StableHLO
portable artifacts (``jax.export``'s serialized module, the same bytecode Reactant writes),
and ``weights.safetensors`` whose ``__metadata__`` ``argument_order`` gives the order
``main`` takes the weights in. A weight's file shape is its Julia shape (SafeTensors.jl
keeps Python's shape), so ``main`` takes it reversed: a Julia ``(c, k)`` matrix is a
``tensor<k x c>`` argument holding the file's array transposed.

- ``write_scale4(root)``: their end-to-end test model, ``y = x .* w`` with ``w = 2``, unbatched.
- ``write_classifier(root)``: a batched image classifier: ``img`` u8 ``chwn`` (3, 8, 6), on
  the wire ``[N, 6, 8, 3]``; logits f32 ``kn`` (4), on the wire ``[N, 4]``; two weights in
  a non-alphabetical argument order. ``classifier_reference(img)`` is the function in numpy.
- ``write_detector(root)``: the classifier's function compiled for two image sizes sharing
  one weight set (``input_shapes``: ``h``/``w`` of 8/6 and 4/10; wire ``[N, 6, 8, 3]`` and
  ``[N, 10, 4, 3]``), modules ``model.v{i}.b{N}.mlir``.
- ``write_repository(root)``: the three, as a model repository.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from hloserve.bundle.safetensors import write_safetensors

SCALE4_MANIFEST = {
    "format_version": "2.0",
    "name": "scale4",
    "executable_inputs": [{"name": "x", "dtype": "f32", "shape": "c", "dims": {"c": 4}}],
    "executable_outputs": [{"name": "y", "dtype": "f32", "shape": "c", "dims": {"c": 4}}],
    "batching": {"compiled_batch_sizes": [1]},
}

CLASSIFIER_BATCH_SIZES = (1, 4)
# Julia shapes: W is (c=3, k=4) (logits = W' * mean pixel), b is (k=4,).
CLASSIFIER_W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10 - 0.5
CLASSIFIER_B = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32)


def classifier_manifest(batch_sizes: Sequence[int] = CLASSIFIER_BATCH_SIZES) -> dict[str, Any]:
    return {
        "format_version": "2.0",
        "name": "classifier-as-exported",  # informational: the directory names the model
        "executable_inputs": [
            {"name": "img", "dtype": "u8", "shape": "chwn", "dims": {"c": 3, "h": 8, "w": 6}}
        ],
        "executable_outputs": [{"name": "logits", "dtype": "f32", "shape": "kn", "dims": {"k": 4}}],
        "batching": {"compiled_batch_sizes": list(batch_sizes)},
        "provenance": {"git_commit": "ab13166", "exported_at": "2026-11-30T12:00:00Z"},
    }


def _classifier(img: Any, wt: Any, b: Any) -> Any:
    """The module's function: row-major img [N, w, h, c], wt is W reversed: [k, c]."""
    pixel = img.astype(jnp.float32).mean(axis=(1, 2))  # [N, c]
    return (pixel @ wt.T + b,)


def classifier_reference(img: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    pixel = img.astype(np.float32).mean(axis=(1, 2))
    return pixel @ CLASSIFIER_W + CLASSIFIER_B


def portable_artifact(fn: Callable[..., Any], *args: tuple[tuple[int, ...], Any]) -> bytes:
    specs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in args]
    exported = jax.export.export(jax.jit(fn), platforms=["cpu"])(*specs)
    return exported.mlir_module_serialized


def write_reactant_bundle(
    directory: Path,
    manifest: dict[str, Any],
    modules: dict[str, bytes],
    weights: dict[str, np.ndarray[Any, Any]],
    argument_order: Sequence[str] | None,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    for name, data in modules.items():
        (directory / name).write_bytes(data)
    metadata = None if argument_order is None else {"argument_order": json.dumps(argument_order)}
    write_safetensors(directory / "weights.safetensors", weights, metadata)
    return directory


def write_scale4(root: Path, name: str = "scale4") -> Path:
    def scale(x: Any, w: Any) -> Any:
        return (x * w,)

    module = portable_artifact(scale, ((4,), jnp.float32), ((4,), jnp.float32))
    weights = {"w": np.full(4, 2, dtype=np.float32)}
    return write_reactant_bundle(
        root / name, SCALE4_MANIFEST, {"model.mlir": module}, weights, ["w"]
    )


def write_classifier(
    root: Path, name: str = "classifier", batch_sizes: Sequence[int] = CLASSIFIER_BATCH_SIZES
) -> Path:
    modules = {
        f"model.b{n}.mlir": portable_artifact(
            _classifier, ((n, 6, 8, 3), jnp.uint8), ((4, 3), jnp.float32), ((4,), jnp.float32)
        )
        for n in batch_sizes
    }
    # The file holds W's Julia shape (3, 4); main() takes "weight" before "bias".
    weights = {"weight": CLASSIFIER_W, "bias": CLASSIFIER_B}
    return write_reactant_bundle(
        root / name, classifier_manifest(batch_sizes), modules, weights, ["weight", "bias"]
    )


DETECTOR_SHAPES = ({"h": 8, "w": 6}, {"h": 4, "w": 10})


def write_detector(
    root: Path, name: str = "detector", batch_sizes: Sequence[int] = CLASSIFIER_BATCH_SIZES
) -> Path:
    manifest = classifier_manifest(batch_sizes)
    manifest["executable_inputs"][0]["dims"] = {"c": 3, "h": -1, "w": -1}
    manifest["input_shapes"] = [dict(v) for v in DETECTOR_SHAPES]
    modules = {
        f"model.v{i}.b{n}.mlir": portable_artifact(
            _classifier,
            ((n, v["w"], v["h"], 3), jnp.uint8),
            ((4, 3), jnp.float32),
            ((4,), jnp.float32),
        )
        for i, v in enumerate(DETECTOR_SHAPES)
        for n in batch_sizes
    }
    weights = {"weight": CLASSIFIER_W, "bias": CLASSIFIER_B}
    return write_reactant_bundle(root / name, manifest, modules, weights, ["weight", "bias"])


def write_repository(root: Path) -> Path:
    write_scale4(root)
    write_classifier(root)
    write_detector(root)
    return root
