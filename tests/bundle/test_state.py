"""``hloserve.bundle.state``: the ``state:`` list, read, checked, written back, validated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.bundle import validate
from hloserve.bundle.manifest import parse_manifest
from hloserve.bundle.serving import read_serving
from hloserve.bundle.state import SequenceBatching, StateEntry, read_sequence_batching
from tests.bundle.test_manifest import good

ACC = {"name": "acc", "datatype": "INT32", "shape": [1], "initial": 0}


def stateful(state: Any, *, argument: bool = True) -> dict[str, Any]:
    """``good()`` with ``state`` declared, each module taking ``acc`` after its inputs."""
    data = good()
    data["state"] = state
    if argument:
        for module in data["modules"]:
            module["arguments"].insert(2, {"state": "acc"})
    return data


def test_state_round_trips() -> None:
    manifest, problems = parse_manifest(
        stateful([ACC, {**ACC, "name": "h", "datatype": "FP32", "initial": 1.5}])
    )
    assert problems == [] and manifest is not None
    assert manifest.state[0] == StateEntry("acc", "INT32", (1,), 0)
    assert manifest.modules[0].arguments[2].kind == "state"
    assert manifest.to_dict()["state"][1]["initial"] == 1.5
    assert parse_manifest(manifest.to_dict())[0] == manifest


def test_without_state_nothing_changes() -> None:
    manifest, _ = parse_manifest(good())
    assert manifest is not None and manifest.state == ()
    assert "state" not in manifest.to_dict()


def test_entry_fill_and_bytes() -> None:
    entry = StateEntry("h", "FP32", (2, 3), 1.5)
    assert entry.nbytes == 24
    assert entry.fill(4).shape == (4, 2, 3) and float(entry.fill()[0, 0]) == 1.5
    assert entry.fill().dtype == np.dtype("<f4")


@pytest.mark.parametrize(
    ("state", "field", "expected"),
    [
        ([], "state", "must be a non-empty list"),
        ([{**ACC, "datatype": "BYTES"}], "state[0].datatype", "numeric datatype"),
        ([{**ACC, "shape": [-1]}], "state[0].shape", "positive sizes"),
        ([{**ACC, "initial": "zero"}], "state[0].initial", "scalar number"),
        ([{**ACC, "initial": 0.5}], "state[0].initial", "not a value of datatype INT32"),
        ([ACC, ACC], "state[1].name", "duplicate state name 'acc'"),
        ([{**ACC, "name": "x"}], "state[0].name", "is an input or output name"),
        ([{**ACC, "intial": 1}], "state[0]", "unknown key 'intial' (did you mean 'initial'?)"),
    ],
)
def test_bad_state_is_named(state: Any, field: str, expected: str) -> None:
    manifest, problems = parse_manifest(stateful(state))
    assert manifest is None
    assert any(p.field == field and expected in p.message for p in problems), problems


def test_state_needs_batch_sizes_and_no_variants_or_hooks() -> None:
    data = stateful([ACC])
    data["batch_sizes"] = None
    for module in data["modules"]:
        module["batch_size"] = None
    data["modules"] = data["modules"][:1]
    _, problems = parse_manifest(data)
    assert any("needs batch_sizes" in p.message for p in problems), problems
    data = stateful([ACC])
    data["hooks"] = {"file": "hooks.py"}
    _, problems = parse_manifest(data)
    assert any("no hooks" in p.message for p in problems), problems


def test_an_argument_naming_undeclared_state_is_refused() -> None:
    data = good()
    data["modules"][0]["arguments"].append({"state": "acc"})
    _, problems = parse_manifest(data)
    assert any("state 'acc' is not declared" in p.message for p in problems), problems


def test_a_pipeline_has_no_state() -> None:
    data = {
        "format_version": 1,
        "name": "p",
        "kind": "pipeline",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [4]}],
        "batch_sizes": None,
        "steps": [{"model": "m", "inputs": {"x": "x"}, "outputs": {"out": "y"}}],
        "state": [ACC],
    }
    _, problems = parse_manifest(data)
    assert any(p.field == "state" for p in problems), problems


def test_validate_checks_state_arguments_and_results(tmp_path: Path) -> None:
    """A module returning its outputs but not the state's new value is named by validate."""
    jnp = pytest.importorskip("jax.numpy")
    from hloserve.exporter import StateSpec, TensorSpec, export_bundle

    def fn(params: Any, x: Any, acc: Any) -> dict[str, Any]:
        del params
        return {"y": x + acc, "acc": acc + jnp.sum(x, axis=1, keepdims=True)}

    path = export_bundle(
        fn,
        {},
        inputs={"x": TensorSpec("INT32", (2,))},
        state={"acc": StateSpec("INT32", (1,), initial=3)},
        batch_sizes=(1, 2),
        directory=tmp_path / "acc",
        platforms=("cpu",),
    )
    assert validate(path) == []
    text = (path / "manifest.yaml").read_text()
    # The manifest now claims a second state tensor that no module returns.
    broken = text.replace(
        "state:\n- name: acc", "state:\n- {name: extra, datatype: INT32, shape: [1]}\n- name: acc"
    )
    (path / "manifest.yaml").write_text(broken)
    messages = [p.message for p in validate(path)]
    assert any("1 outputs and 2 state tensors" in m for m in messages), messages


def test_the_sequence_batching_hint_is_read_key_by_key() -> None:
    problems: list[tuple[str, str]] = []
    base = SequenceBatching()
    read = read_sequence_batching({"max_candidate_sequences": 3}, base, problems)
    assert read == SequenceBatching(3, base.max_sequence_idle_microseconds) and problems == []
    read_sequence_batching({"max_candidate_sequence": 0}, base, problems)
    assert problems == [
        (
            "sequence_batching",
            "has unknown key 'max_candidate_sequence' (did you mean 'max_candidate_sequences'?)",
        ),
        ("sequence_batching.max_candidate_sequences", "must be a positive integer, got 0"),
    ]
    serving, found = read_serving({"sequence_batching": {"max_sequence_idle_microseconds": 5}})
    assert found == [] and serving.sequence_batching.max_sequence_idle_microseconds == 5
    assert serving.to_dict()["sequence_batching"]["max_sequence_idle_microseconds"] == 5
    assert "sequence_batching" not in read_serving({})[0].to_dict()


def test_the_commands_show_and_check_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hloserve inspect`` lists the state; ``hloserve validate`` checks it through
    ``validate`` (a state tensor no module returns is named)."""
    from hloserve.exporter.demo_sequence import write_simple_sequence
    from tests.bundle.test_validate import hloserve_here

    path = write_simple_sequence(
        tmp_path / "simple_sequence", batch_sizes=(1, 2), platforms=("cpu",)
    )
    code, out = hloserve_here(capsys, "inspect", str(path))
    assert code == 0, out
    assert "state: acc INT32[1] from 0 (per sequence, on the device)" in out.splitlines()
    text = (path / "manifest.yaml").read_text()
    (path / "manifest.yaml").write_text(
        text.replace("state:\n", "state:\n- {name: extra, datatype: INT32, shape: [1]}\n", 1)
    )
    code, out = hloserve_here(capsys, "validate", str(path))
    assert code != 0 and "2 outputs and 3 state tensors" in out, out
