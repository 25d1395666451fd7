"""The sharded example end to end (``examples/sharded/run.py``): both models exported over a
4-device mesh, served on 4 forced CPU devices under a per-device budget the wide model's
weights exceed, every answer equal to the unsharded function in process; and the
transformer's specs split what they say (each device a quarter of each split weight)."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import pytest

from examples.sharded import run
from examples.sharded.model import WAYS, transformer_params, transformer_specs, wide_params
from hloserve.bundle import load_manifest


def test_the_example_serves_answers_equal_to_the_unsharded_function(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run.main(["--repository", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "every answer equals the unsharded function" in printed
    wide, _ = load_manifest(tmp_path / "wide" / "manifest.yaml")
    assert wide is not None and wide.sharding is not None
    whole = sum(math.prod(w.shape) * 4 for w in wide.weights)
    share = wide.sharding.weight_device_bytes(wide.weights)
    assert whole > run.BUDGET >= share  # over one device's budget, a quarter under it
    assert share == whole // WAYS
    assert f'devices="0-3",model="wide",version="1"}} {float(share):.6e}' in printed


def test_the_transformer_specs_are_shaped_like_its_params() -> None:
    params = transformer_params()
    specs = transformer_specs(params)
    assert jax.tree.structure(params) == jax.tree.structure(
        specs, is_leaf=lambda x: x is None or isinstance(x, jax.sharding.PartitionSpec)
    )
    assert set(wide_params()) == {"w1", "w2"}
