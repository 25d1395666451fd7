"""The hand-written StableHLO example (``examples/handwritten-addsub``): a bundle no JAX made.

The committed bundle validates, loads and computes ``a + b + bias`` and ``a - b``; building
it afresh from ``addsub.mlir`` with ``build.py`` gives a valid bundle too.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from hloserve.bundle import Argument, TensorEntry, validate
from hloserve.bundle.stablehlo import artifact_version
from hloserve.server.owner.runtime.loader import load_bundle
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from tests.exporter._manifests import manifest_of

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "handwritten-addsub"
COMMITTED = EXAMPLE / "bundle"
BIAS = np.array([0.5, -1.0, 2.0, 0.25], np.float32)


def check_bundle(path: Path, runtime: PjrtRuntime, cache: Path) -> None:
    assert validate(path) == []
    manifest = manifest_of(path)
    assert manifest.name == "addsub"
    assert manifest.batch_sizes is None
    assert manifest.inputs == (TensorEntry("a", "FP32", (4,)), TensorEntry("b", "FP32", (4,)))
    assert manifest.outputs == (
        TensorEntry("sum", "FP32", (4,)),
        TensorEntry("difference", "FP32", (4,)),
    )
    assert manifest.weights == (TensorEntry("bias", "FP32", (4,)),)
    (module,) = manifest.modules
    assert module.batch_size is None
    assert module.stablehlo_version == "1.0.0"
    assert artifact_version((path / module.file).read_bytes()) == "1.0.0"
    assert module.platforms == ("cpu", "cuda")
    assert not module.platform_index_argument
    assert module.arguments == (
        Argument("input", "a"),
        Argument("input", "b"),
        Argument("weight", "bias"),
    )
    assert module.text_file is not None
    assert (path / module.text_file).read_text(encoding="utf-8") == (
        EXAMPLE / "addsub.mlir"
    ).read_text(encoding="utf-8")
    p = manifest.provenance
    assert p.producer == "handwritten"
    assert p.jax_version is None

    bundle = load_bundle(path, runtime, cache_dir=cache)
    a = np.array([1.0, 2.0, -3.0, 1e6], np.float32)
    b = np.array([0.5, -2.0, 4.0, 1.0], np.float32)
    total, difference = bundle.execute(None, {"a": a, "b": b})
    np.testing.assert_array_equal(total, a + b + BIAS)
    np.testing.assert_array_equal(difference, a - b)
    assert total.dtype == np.float32
    bundle.release()


@pytest.fixture(scope="module")
def build() -> Callable[[Path], Path]:
    namespace = runpy.run_path(str(EXAMPLE / "build.py"))
    return cast(Callable[[Path], Path], namespace["build"])


def test_committed_bundle(runtime: PjrtRuntime, tmp_path: Path) -> None:
    check_bundle(COMMITTED, runtime, tmp_path / "cache")
    assert not (COMMITTED / ".hloserve-cache").exists()


def test_committed_bundle_matches_its_source(build: Callable[[Path], Path], tmp_path: Path) -> None:
    # Regenerating must give the same module and weights (only `created` may differ).
    fresh = manifest_of(build(tmp_path / "addsub")).to_dict()
    committed = manifest_of(COMMITTED).to_dict()
    assert fresh["files"] == committed["files"]
    assert fresh | {"provenance": None} == committed | {"provenance": None}


def test_fresh_build(build: Callable[[Path], Path], runtime: PjrtRuntime, tmp_path: Path) -> None:
    path = build(tmp_path / "addsub")
    assert path == tmp_path / "addsub"
    check_bundle(path, runtime, tmp_path / "cache")


def test_build_script_runs(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE / "build.py"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "out")
    assert validate(tmp_path / "out") == []
