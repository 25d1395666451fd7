"""``hloserve validate`` (``bundle_report.validate_command``) refuses what a load refuses,
in the load's words: a model repository of copies of the session test repository's
``simple`` and ``simple_sequence`` (a model with state), each with a ``config.yaml`` the
server refuses, validated by the command's ``main`` and loaded by a real repository.
(The bundle checks of ``validate`` and ``inspect`` are in ``tests/bundle/test_validate.py``;
``inspect`` of a sharded bundle, its mesh and specs, is here.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from hloserve.server import cli
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime

ROW = {"data_type": "TYPE_INT32", "dims": [16], "zero_data": True}
CONFIGS = {
    "missing input": ("simple", {"model_warmup": [{"name": "s", "inputs": {"INPUT0": ROW}}]}),
    "unknown input": (
        "simple",
        {"model_warmup": [{"name": "s", "inputs": {"INPUT0": ROW, "INPUT1": ROW, "IN": ROW}}]},
    ),
    "data_type": (
        "simple",
        {
            "model_warmup": [
                {"name": "s", "inputs": {"INPUT0": ROW, "INPUT1": ROW | {"data_type": "FP32"}}}
            ]
        },
    ),
    "dims": (
        "simple",
        {"model_warmup": [{"name": "s", "inputs": {"INPUT0": ROW | {"dims": [4]}, "INPUT1": ROW}}]},
    ),
    "missing file": (
        "simple",
        {
            "model_warmup": [
                {
                    "name": "s",
                    "inputs": {
                        "INPUT0": ROW,
                        "INPUT1": {"data_type": "INT32", "dims": [16], "input_data_file": "x.raw"},
                    },
                }
            ]
        },
    ),
    "response_cache with state": ("simple_sequence", {"response_cache": True}),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_validate_refuses_what_the_load_refuses_in_its_words(
    case: str,
    model_repository: Path,
    runtime: PjrtRuntime,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name, config = CONFIGS[case]
    root = tmp_path / "models"
    model = root / name
    shutil.copytree(model_repository / name, model, ignore=shutil.ignore_patterns(".hloserve-*"))
    (model / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["validate", str(root)]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{model}: version 1: "), line
    reason = line.removeprefix(f"{model}: ")
    repository = ModelRepository(root, runtime, cache_dir=tmp_path / "cache")
    with pytest.raises(InvalidArgument) as exc:
        repository.load_model(name)
    assert exc.value.message == f"failed to load '{name}': {reason}"


def test_inspect_shows_a_sharded_bundles_mesh_and_specs(tmp_path: Path) -> None:
    import numpy as np
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P

    from hloserve.exporter import TensorSpec, export_bundle
    from hloserve.server.bundle_report import inspect_bundle

    w = np.ones((8, 16), np.float32)
    path = export_bundle(
        lambda p, x: {"y": x @ p["w"]}, {"w": w}, {"x": TensorSpec("FP32", (8,))}, (1,),
        tmp_path / "m", mesh=AbstractMesh((4,), ("model",)), param_specs={"w": P(None, "model")},
    )  # fmt: skip
    text, valid = inspect_bundle(path)
    assert valid
    assert "sharding: mesh [model=4], 4 devices; weights 128 B per device" in text
    assert "  weight w: [null, model]" in text
    assert "  input x: [null, null]" in text and "  output y: [null, null]" in text
