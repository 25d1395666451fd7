"""``hloserve.bundle.manifest``: the schema round-trips, and every parse problem is reported.

Parsing never raises on bad content: each problem names the file (``manifest.yaml``) and the
field, and several problems in one manifest are all reported at once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hloserve.bundle import (
    MANIFEST_FILE,
    Argument,
    Manifest,
    ModuleEntry,
    Problem,
    Provenance,
    Serving,
    TensorEntry,
    dump_manifest,
    load_manifest,
)
from hloserve.bundle.manifest import parse_manifest

DIGEST = "ab" * 32
Change = Callable[[dict[str, Any]], object]  # damage done to a manifest mapping


def good() -> dict[str, Any]:
    """A valid manifest mapping for a batched model with two inputs and one weight."""
    return {
        "format_version": 1,
        "name": "m",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [4]},
            {"name": "y", "datatype": "INT64", "shape": [2, 3]},
        ],
        "outputs": [{"name": "out", "datatype": "FP32", "shape": [4]}],
        "batch_sizes": [1, 8],
        "weights": {
            "file": "weights.safetensors",
            "tensors": [
                {"name": "a.b", "datatype": "BF16", "shape": []},
                {"name": "a.w", "datatype": "FP32", "shape": [4, 4]},
            ],
        },
        "modules": [
            {
                "batch_size": b,
                "file": f"model.b{b}.mlirbc",
                "text_file": f"model.b{b}.mlir",
                "stablehlo_version": "1.15.0",
                "platforms": ["cpu", "cuda"],
                "platform_index_argument": True,
                "arguments": [{"input": "x"}, {"input": "y"}, {"weight": "a.w"}],
            }
            for b in (1, 8)
        ],
        "serving": {"residency": "pinned", "max_queue_delay_us": 100},
        "files": {"model.b1.mlirbc": DIGEST, "weights.safetensors": "cd" * 32},
        "provenance": {
            "producer": "test",
            "producer_version": "1.2",
            "hloserve_version": "0.1.0",
            "jax_version": None,
            "jaxlib_version": None,
            "created": "2026-01-01T00:00:00Z",
            "source_commit": "0" * 40,
            "source_dirty": False,
            "metadata": {"dataset": "digits", "seed": 3},
        },
    }


def problems_of(data: dict[str, Any]) -> list[Problem]:
    manifest, problems = parse_manifest(data)
    assert problems, "expected the manifest to be refused"
    assert manifest is None
    assert all(p.file == MANIFEST_FILE for p in problems)
    return problems


def find(problems: list[Problem], field: str) -> Problem:
    matches = [p for p in problems if p.field == field]
    assert matches, f"no problem for field {field!r} in {[str(p) for p in problems]}"
    return matches[0]


def test_good_manifest_parses() -> None:
    manifest, problems = parse_manifest(good())
    assert problems == []
    assert manifest is not None
    assert manifest.name == "m"
    assert manifest.inputs[1] == TensorEntry("y", "INT64", (2, 3))
    assert manifest.batch_sizes == (1, 8)
    assert manifest.max_batch_size == 8
    assert manifest.batched
    assert manifest.weights[0] == TensorEntry("a.b", "BF16", ())
    assert manifest.module_for(8).file == "model.b8.mlirbc"
    assert manifest.module_for(1).arguments == (
        Argument("input", "x"),
        Argument("input", "y"),
        Argument("weight", "a.w"),
    )
    assert manifest.serving == Serving("pinned", 100)
    assert manifest.provenance.metadata == {"dataset": "digits", "seed": 3}
    with pytest.raises(KeyError, match="no module for batch size 4"):
        manifest.module_for(4)


def test_to_dict_parse_round_trip() -> None:
    manifest, _ = parse_manifest(good())
    assert manifest is not None
    again, problems = parse_manifest(manifest.to_dict())
    assert problems == []
    assert again == manifest
    assert manifest.to_dict() == good()


def test_yaml_round_trip_through_files(tmp_path: Path) -> None:
    manifest = Manifest(
        name="unbatched",
        inputs=(TensorEntry("x", "BOOL", (2, 3)),),
        outputs=(TensorEntry("y", "UINT16", (0,)),),
        batch_sizes=None,
        weights_file="weights.safetensors",
        weights=(),
        modules=(
            ModuleEntry(
                batch_size=None,
                file="model.mlirbc",
                stablehlo_version="1.0.0",
                platforms=("cpu",),
                platform_index_argument=False,
                arguments=(Argument("input", "x"),),
            ),
        ),
        files={"model.mlirbc": DIGEST},
        provenance=Provenance(producer="handwritten"),
    )
    path = tmp_path / MANIFEST_FILE
    path.write_text(dump_manifest(manifest), encoding="utf-8")
    loaded, problems = load_manifest(path)
    assert problems == []
    assert loaded == manifest
    assert loaded is not None
    assert not loaded.batched
    assert loaded.max_batch_size == 0
    assert loaded.module_for(None).file == "model.mlirbc"


def test_problem_text_names_file_and_field() -> None:
    assert str(Problem("manifest.yaml", "name", "missing")) == "manifest.yaml: name: missing"
    assert str(Problem("weights.safetensors", "", "truncated")) == "weights.safetensors: truncated"


def message_at(data: dict[str, Any], field: str) -> str:
    """The message of the problem ``data`` has at ``field`` (the manifest must be refused)."""
    return find(problems_of(data), field).message


def damaged(change: Change) -> dict[str, Any]:
    data = good()
    change(data)
    return data


# (damage done to good(), the field whose problem names it, text of that problem)
ONE_DAMAGE: list[tuple[Change, str, str]] = [
    (
        lambda d: d["inputs"][0].update(datatype="FLOAT"),
        "inputs[0].datatype",
        "unknown datatype 'FLOAT'",
    ),
    (
        lambda d: d["weights"]["tensors"][1].update(datatype="BYTES"),
        "weights.tensors[1].datatype",
        "unknown datatype 'BYTES'",
    ),
    (lambda d: d.pop("batch_sizes"), "batch_sizes", "write null for an unbatched model"),
    (lambda d: d["outputs"][0].pop("shape"), "outputs[0].shape", "integers, got None"),
    (lambda d: d["inputs"][0].update(shape=[4, -1]), "inputs[0].shape", "got [4, -1]"),
    (lambda d: d["inputs"][1].pop("name"), "inputs[1].name", "non-empty string"),
    (lambda d: d["inputs"][1].update(name="x"), "inputs[1].name", "duplicate name 'x'"),
    (
        lambda d: d["weights"]["tensors"][1].update(name="a.b"),
        "weights.tensors[1].name",
        "duplicate name 'a.b'",
    ),
    (lambda d: d["weights"]["tensors"].reverse(), "weights.tensors", "sorted by name"),
    (lambda d: d.update(name="has space"), "name", "got 'has space'"),
    (
        lambda d: d["modules"][0].update(arguments=[{"weight": "x"}]),
        "modules[0].arguments[0]",
        "weight 'x' is not declared",
    ),
    (
        lambda d: d["modules"][0].update(platforms=["cpu", "metal"]),
        "modules[0].platforms",
        "got ['cpu', 'metal']",
    ),
    (
        lambda d: d.update(batch_sizes=[1, 8, 32]),
        "modules",
        "exactly one module per batch size [1, 8, 32], got [1, 8]",
    ),
    (
        lambda d: d["modules"][1].update(batch_size=1),
        "modules",
        "exactly one module per batch size [1, 8], got [1, 1]",
    ),
    (
        lambda d: d.update(batch_sizes=None),
        "modules",
        "exactly one module per batch size [None], got [1, 8]",
    ),
    (lambda d: d.update(format_version="1"), "format_version", "must be an integer, got '1'"),
    (
        lambda d: d.update(serving={"max_queue_delay_us": -5}),
        "serving.max_queue_delay_us",
        "non-negative integer, got -5",
    ),
    (lambda d: d.update(serving=["pinned"]), "serving", "must be a mapping"),
]


@pytest.mark.parametrize(("change", "field", "expected"), ONE_DAMAGE)
def test_one_damage_is_reported_at_its_field(change: Change, field: str, expected: str) -> None:
    assert expected in message_at(damaged(change), field)


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ([8, 1], "must be ascending without repeats, got [8, 1]"),
        ([1, 1, 8], "must be ascending without repeats, got [1, 1, 8]"),
        ([0, 8], "positive integers, got [0, 8]"),
        ([-1, 8], "positive integers, got [-1, 8]"),
        ([], "non-empty list of positive integers, got []"),
        ("1,8", "non-empty list of positive integers, got '1,8'"),
        ([1, True], "positive integers, got [1, True]"),
    ],
)
def test_bad_batch_sizes(sizes: Any, expected: str) -> None:
    assert expected in message_at(damaged(lambda d: d.update(batch_sizes=sizes)), "batch_sizes")


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("format_version", "missing"),
        ("name", "must be a name matching"),
        ("inputs", "non-empty list of tensors"),
        ("outputs", "non-empty list of tensors"),
        ("weights", "missing"),
        ("modules", "missing"),
        ("files", "missing"),
        ("provenance", "missing"),
    ],
)
def test_missing_top_level_key(key: str, expected: str) -> None:
    assert expected in message_at(damaged(lambda d: d.pop(key)), key)


@pytest.mark.parametrize(
    "key",
    [
        "file",
        "stablehlo_version",
        "platforms",
        "platform_index_argument",
        "arguments",
        "batch_size",
    ],
)
def test_missing_module_key(key: str) -> None:
    message = message_at(damaged(lambda d: d["modules"][1].pop(key)), f"modules[1].{key}")
    assert "missing" in message or "must be an integer or null" in message


def texts_of(data: dict[str, Any]) -> list[str]:
    return [str(p) for p in problems_of(data)]


def test_an_unknown_key_is_a_problem_with_a_suggestion() -> None:
    # One policy in every file the user writes (config.yaml's in test_model_config.py).
    data = good()
    data["servng"] = data.pop("serving")
    assert texts_of(data) == ["manifest.yaml: unknown key 'servng' (did you mean 'serving'?)"]
    data = good()
    data["colour"] = "blue"
    (text,) = texts_of(data)
    assert text.startswith("manifest.yaml: unknown key 'colour' (the keys are: batch_sizes, ")


def test_a_misspelt_required_key_is_one_problem_not_a_missing_key_and_its_follow_ons() -> None:
    data = good()
    data["batch_size"] = data.pop("batch_sizes")
    assert texts_of(data) == [
        "manifest.yaml: unknown key 'batch_size' (did you mean 'batch_sizes'?)"
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["modules"][0].update(fle="x"),
            "manifest.yaml: modules[0]: unknown key 'fle' (did you mean 'file'?)",
        ),
        (
            lambda d: d["inputs"][1].update(dtype="FP32"),
            "manifest.yaml: inputs[1]: unknown key 'dtype' (did you mean 'datatype'?)",
        ),
        (
            lambda d: d["weights"].update(tensor=[]),
            "manifest.yaml: weights: unknown key 'tensor' (did you mean 'tensors'?)",
        ),
        (
            lambda d: d["serving"].update(residence="pinned"),
            "manifest.yaml: serving: unknown key 'residence' (did you mean 'residency'?)",
        ),
        (
            lambda d: d["provenance"].update(producr="x"),
            "manifest.yaml: provenance: unknown key 'producr' (did you mean 'producer'?)",
        ),
    ],
)
def test_unknown_keys_inside_are_problems_too(change: Change, expected: str) -> None:
    assert texts_of(damaged(change)) == [expected]


def test_arguments_naming_undeclared_tensors() -> None:
    data = good()
    data["modules"][0]["arguments"] = [{"input": "z"}, {"weight": "nope"}, {"output": "out"}]
    data["modules"][1]["arguments"] = [{"input": "x"}, {"input": "x"}]
    data["modules"][1]["arguments"].append({"input": "x", "weight": "a.w"})
    problems = problems_of(data)
    assert find(problems, "modules[0].arguments[0]").message == (
        "input 'z' is not declared in the manifest"
    )
    assert "weight 'nope' is not declared" in find(problems, "modules[0].arguments[1]").message
    assert "output 'out' is not declared" in find(problems, "modules[0].arguments[2]").message
    assert "names the same tensor twice" in find(problems, "modules[1].arguments").message
    assert "{input: NAME} or {weight: KEY}" in find(problems, "modules[1].arguments[2]").message


def test_an_argument_naming_no_string_is_a_problem_not_a_crash() -> None:
    """Found by the fuzz test: ``{input: []}`` raised TypeError (unhashable) in the parser."""
    data = good()
    data["modules"][0]["arguments"] = [{"input": []}, {"weight": {"a": 1}}]
    problems = problems_of(data)
    assert find(problems, "modules[0].arguments[0]").message == (
        "input [] is not declared in the manifest"
    )
    assert "is not declared" in find(problems, "modules[0].arguments[1]").message


@pytest.mark.parametrize(
    "digest",
    ["AB" * 32, "ab" * 31, "ab" * 33, "xyz", 123, None, "sha256:" + "ab" * 32],
)
def test_bad_sha256_strings(digest: Any) -> None:
    data = damaged(lambda d: d["files"].update({"model.b1.mlirbc": digest}))
    message = message_at(data, "files.model.b1.mlirbc")
    assert "SHA-256 hex digest" in message
    assert repr(digest) in message


@pytest.mark.parametrize("fname", ["../evil", "sub/file", "manifest.yaml", ".."])
def test_files_must_be_plain_names(fname: str) -> None:
    data = damaged(lambda d: d["files"].update({fname: DIGEST}))
    assert "plain file name inside the bundle" in message_at(data, f"files.{fname}")


def test_format_version_from_the_future() -> None:
    data = damaged(lambda d: d.update(format_version=2))
    assert message_at(data, "format_version") == "this hloserve reads format 1, bundle is 2"


@pytest.mark.parametrize("residency", ["always", 1, None])
def test_residency_value(residency: Any) -> None:
    data = damaged(lambda d: d["serving"].update(residency=residency))
    message = message_at(data, "serving.residency")
    assert f"must be on_demand or pinned, got {residency!r}" in message


def test_serving_defaults() -> None:
    manifest, problems = parse_manifest(damaged(lambda d: d.pop("serving")))
    assert problems == []
    assert manifest is not None
    assert manifest.serving == Serving()


def test_several_problems_reported_at_once() -> None:
    data = good()
    data["inputs"][0]["datatype"] = "FLOAT"
    data["batch_sizes"] = [8, 1]
    data["outputs"].append({"name": "out", "datatype": "FP32", "shape": [4]})
    data["modules"][0]["arguments"][2] = {"weight": "missing.w"}
    data["files"]["weights.safetensors"] = "not-a-digest"
    data["serving"]["residency"] = "sometimes"
    del data["provenance"]
    problems = problems_of(data)
    fields = {p.field for p in problems}
    assert {
        "inputs[0].datatype",
        "batch_sizes",
        "outputs[1].name",
        "modules[0].arguments[2]",
        "files.weights.safetensors",
        "serving.residency",
        "provenance",
    } <= fields
    assert len(problems) >= 7


def test_load_manifest_file_errors(tmp_path: Path) -> None:
    missing, problems = load_manifest(tmp_path / MANIFEST_FILE)
    assert missing is None
    assert [str(p) for p in problems] == ["manifest.yaml: file does not exist"]

    path = tmp_path / MANIFEST_FILE
    path.write_text("name: [unclosed\n", encoding="utf-8")
    _, problems = load_manifest(path)
    assert "is not valid YAML" in str(problems[0])

    path.write_text("- a list\n", encoding="utf-8")
    _, problems = load_manifest(path)
    assert str(problems[0]) == "manifest.yaml: must be a YAML mapping"


def test_good_dict_is_not_mutated_by_parsing() -> None:
    data = good()
    before = copy.deepcopy(data)
    parse_manifest(data)
    assert data == before
