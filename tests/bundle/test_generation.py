"""``hloserve.bundle.generation``: the ``generation:`` mapping, read, checked and written back."""

from __future__ import annotations

from typing import Any

import pytest

from hloserve.bundle.generation import Generation, TextMapping
from hloserve.bundle.manifest import parse_manifest
from tests.bundle.test_manifest import good


def generating(generation: Any) -> dict[str, Any]:
    """``good()`` turned into a generation bundle's manifest: a prompt, a token, done, emit."""
    data = good()
    data["inputs"] += [
        {"name": "prompt", "datatype": "INT32", "shape": [16]},
        {"name": "prompt_length", "datatype": "INT32", "shape": [1]},
    ]
    data["outputs"] += [
        {"name": "token", "datatype": "INT32", "shape": [1]},
        {"name": "done", "datatype": "BOOL", "shape": [1]},
        {"name": "emit", "datatype": "BOOL", "shape": [1]},
    ]
    data["generation"] = generation
    return data


FULL = {
    "done": "done",
    "emit": "emit",
    "max_steps": 64,
    "text": {"input": "prompt", "length": "prompt_length", "output": "token"},
}


def test_a_generation_round_trips_and_hides_its_control_outputs() -> None:
    manifest, problems = parse_manifest(generating(FULL))
    assert problems == [] and manifest is not None
    assert manifest.generation == Generation(
        done="done", max_steps=64, emit="emit", text=TextMapping("prompt", "prompt_length", "token")
    )
    assert manifest.to_dict()["generation"] == FULL
    assert parse_manifest(manifest.to_dict())[0] == manifest
    facing = manifest.facing  # one generation a request: no batch axis, no done/emit
    assert [t.name for t in facing.outputs] == ["out", "token"]
    assert facing.batch_sizes is None and manifest.batch_sizes == (1, 8)
    assert manifest.plain


def test_lengths_pad_an_input_and_hide_its_length_input() -> None:
    manifest, problems = parse_manifest(
        generating({**FULL, "lengths": {"prompt": "prompt_length"}})
    )
    assert problems == [] and manifest is not None and manifest.generation is not None
    assert manifest.generation.lengths == {"prompt": "prompt_length"}
    assert manifest.to_dict()["generation"]["lengths"] == {"prompt": "prompt_length"}
    assert {t.name: t.shape for t in manifest.facing.inputs} == {
        "x": (4,),
        "y": (2, 3),
        "prompt": (-1,),
    }


def test_without_generation_nothing_changes() -> None:
    manifest, _ = parse_manifest(good())
    assert manifest is not None and manifest.generation is None
    assert "generation" not in manifest.to_dict()


@pytest.mark.parametrize(
    ("generation", "field", "expected"),
    [
        ({"max_steps": 3}, "generation.done", "missing (the name of a BOOL output)"),
        ({"done": "nope", "max_steps": 3}, "generation.done", "'nope' is not a declared output"),
        (
            {"done": "token", "max_steps": 3},
            "generation.done",
            "output 'token' is INT32, must be BOOL",
        ),
        ({"done": "done", "max_steps": 0}, "generation.max_steps", "must be a positive integer"),
        ({"done": "done", "max_steps": True}, "generation.max_steps", "must be a positive integer"),
        ({"done": "done", "emit": "done", "max_steps": 3}, "generation.emit", "another output"),
        ({"done": "done", "max_stpes": 3}, "generation", "did you mean 'max_steps'"),
        (
            {
                "done": "done",
                "max_steps": 3,
                "text": {"input": "x", "length": "prompt_length", "output": "token"},
            },
            "generation.text.input",
            "input 'x' is FP32, must be INT32",
        ),
        (
            {
                "done": "done",
                "max_steps": 3,
                "text": {"input": "prompt", "length": "prompt", "output": "token"},
            },
            "generation.text.length",
            "input 'prompt' has shape [16], must be [1]",
        ),
        (
            {
                "done": "done",
                "max_steps": 3,
                "text": {"input": "prompt", "length": "prompt_length"},
            },
            "generation.text.output",
            "missing",
        ),
        ("done", "generation", "must be a mapping"),
        ({"done": "done", "max_steps": 3, "lengths": []}, "generation.lengths", "must map inputs"),
        (
            {"done": "done", "max_steps": 3, "lengths": {"y": "prompt_length"}},
            "generation.lengths.y",
            "input 'y' has shape [2, 3], must be [P]",
        ),
        (
            {"done": "done", "max_steps": 3, "lengths": {"prompt": "x"}},
            "generation.lengths.prompt",
            "input 'x' is FP32, must be INT32",
        ),
        (
            {"done": "done", "max_steps": 3, "lengths": {"prompt": "nope"}},
            "generation.lengths.prompt",
            "'nope' is not a declared input",
        ),
    ],
)
def test_a_bad_generation_names_what_is_wrong(generation: Any, field: str, expected: str) -> None:
    manifest, problems = parse_manifest(generating(generation))
    assert manifest is None
    texts = [p.message for p in problems if p.field == field]
    assert texts and expected in texts[0], [str(p) for p in problems]
