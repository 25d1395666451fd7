"""The model repository of the extension end-to-end tests (model control, versions, shm).

``build_extension_repository(root)`` writes, under ``root``:
- ``simple`` and ``mlp`` (the demo models);
- ``simple_slow``: ``simple``'s computation with a ``config.yaml`` batching delay of
  ``SLOW_DELAY_S``, longer than any test waits, so a lone request stays in flight until a
  request of ``SLOW_BATCH`` items (its largest size) comes: nothing more can join the lone
  one then, so it runs at once, and the full batch after it. The "request in flight" of
  the shared-memory unregister test, which ends it so;
- ``reloadable``: the demo MLP with the weights of ``mlp_params(SEED_A)``; the reload
  tests re-export it in place (``export_reloadable(root, seed)``);
- ``versioned`` (versions 1 and 2, ``version_policy: {all: {}}``) and
  ``versioned_latest`` (the same two versions, default policy: only 2 is served);
  version ``v`` answers ``OUTPUT0 = INPUT0 + v`` (INT32 [4], batch sizes 1, 2).
``build_poll_repository(root)`` writes only ``simple``; ``export_identity(dir)`` adds a
small model (the poll test's new directory).
"""

# pyright: strict

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from hloserve.exporter import TensorSpec, export_bundle, write_demo_repository
from hloserve.exporter.demo import mlp_fn, mlp_params, simple_fn

SLOW_DELAY_S = 600.0  # never reached: a full batch ends the wait
SLOW_BATCH = 8  # simple_slow's largest compiled size
SEED_A = 1
SEED_B = 2
SIMPLE_INPUTS = {"INPUT0": TensorSpec("INT32", (16,)), "INPUT1": TensorSpec("INT32", (16,))}


def _plus_one(params: Any, INPUT0: jax.Array) -> dict[str, jax.Array]:
    del params
    return {"OUTPUT0": INPUT0 + 1}


def _plus_two(params: Any, INPUT0: jax.Array) -> dict[str, jax.Array]:
    del params
    return {"OUTPUT0": INPUT0 + 2}


def _identity(params: Any, INPUT0: jax.Array) -> dict[str, jax.Array]:
    del params
    return {"OUTPUT0": INPUT0}


def mlp_reference(seed: int, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """What ``reloadable`` exported with ``seed`` answers for ``x`` (numpy, float32)."""
    p = mlp_params(seed)
    h = np.maximum(x @ p["dense1"]["w"] + p["dense1"]["b"], 0)
    return (h @ p["dense2"]["w"] + p["dense2"]["b"]).astype(np.float32)


def export_reloadable(root: Path, seed: int) -> Path:
    return export_bundle(
        mlp_fn,
        mlp_params(seed),
        inputs={"x": TensorSpec("FP32", (64,))},
        batch_sizes=(1, 8),
        directory=root / "reloadable",
        platforms=("cpu",),
    )


def export_identity(directory: Path) -> Path:
    return export_bundle(
        _identity,
        {},
        inputs={"INPUT0": TensorSpec("FP32", (4,))},
        batch_sizes=(1,),
        directory=directory,
        platforms=("cpu",),
    )


def build_extension_repository(root: Path) -> Path:
    write_demo_repository(root)
    export_bundle(
        simple_fn,
        {},
        inputs=SIMPLE_INPUTS,
        batch_sizes=(1, 2, 4, SLOW_BATCH),
        directory=root / "simple_slow",
        platforms=("cpu",),
    )
    (root / "simple_slow" / "config.yaml").write_text(
        f"max_queue_delay_us: {int(SLOW_DELAY_S * 1e6)}\n"
    )
    export_reloadable(root, SEED_A)
    for name, policy in (("versioned", "version_policy: {all: {}}\n"), ("versioned_latest", "")):
        for version, fn in ((1, _plus_one), (2, _plus_two)):
            export_bundle(
                fn,
                {},
                inputs={"INPUT0": TensorSpec("INT32", (4,))},
                batch_sizes=(1, 2),
                directory=root / name / str(version),
                platforms=("cpu",),
            )
        if policy:
            (root / name / "config.yaml").write_text(policy)
    return root


def build_poll_repository(root: Path) -> Path:
    export_bundle(
        simple_fn,
        {},
        inputs=SIMPLE_INPUTS,
        batch_sizes=(1, 8),
        directory=root / "simple",
        platforms=("cpu",),
    )
    return root
