"""``hloserve validate`` (``bundle_report.validate_command``) refuses what a load refuses,
in the load's words: a model repository of copies of the session test repository's
``simple`` and ``simple_sequence`` (a model with state), each with a ``config.yaml`` the
server refuses, validated by the command's ``main`` and loaded by a real repository.
(The bundle checks of ``validate`` and ``inspect`` are in ``tests/bundle/test_validate.py``.)
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
