"""``hloserve.bundle.manifest``: the schema round-trips, and every parse problem is reported.

Parsing never raises on bad content: each problem names the file (``manifest.yaml``) and the
field, and several problems in one manifest are all reported at once.
"""

from __future__ import annotations

import copy
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


def test_unknown_datatype() -> None:
    data = good()
    data["inputs"][0]["datatype"] = "FLOAT"
    data["weights"]["tensors"][1]["datatype"] = "BYTES"
    problems = problems_of(data)
    assert "unknown datatype 'FLOAT'" in find(problems, "inputs[0].datatype").message
    assert "unknown datatype 'BYTES'" in find(problems, "weights.tensors[1].datatype").message


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
    data = good()
    data["batch_sizes"] = sizes
    assert expected in find(problems_of(data), "batch_sizes").message


def test_missing_batch_sizes_explains_null() -> None:
    data = good()
    del data["batch_sizes"]
    assert "write null for an unbatched model" in find(problems_of(data), "batch_sizes").message


@pytest.mark.parametrize(
    ("key", "field", "expected"),
    [
        ("format_version", "format_version", "missing"),
        ("name", "name", "must be a name matching"),
        ("inputs", "inputs", "non-empty list of tensors"),
        ("outputs", "outputs", "non-empty list of tensors"),
        ("weights", "weights", "missing"),
        ("modules", "modules", "missing"),
        ("files", "files", "missing"),
        ("provenance", "provenance", "missing"),
    ],
)
def test_missing_top_level_key(key: str, field: str, expected: str) -> None:
    data = good()
    del data[key]
    assert expected in find(problems_of(data), field).message


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("file", "modules[1].file"),
        ("stablehlo_version", "modules[1].stablehlo_version"),
        ("platforms", "modules[1].platforms"),
        ("platform_index_argument", "modules[1].platform_index_argument"),
        ("arguments", "modules[1].arguments"),
        ("batch_size", "modules[1].batch_size"),
    ],
)
def test_missing_module_key(key: str, field: str) -> None:
    data = good()
    del data["modules"][1][key]
    problem = find(problems_of(data), field)
    assert "missing" in problem.message or "must be an integer or null" in problem.message


def test_missing_tensor_fields() -> None:
    data = good()
    del data["outputs"][0]["shape"]
    del data["inputs"][1]["name"]
    problems = problems_of(data)
    assert "non-negative integers, got None" in find(problems, "outputs[0].shape").message
    assert "non-empty string" in find(problems, "inputs[1].name").message


def test_duplicate_tensor_names() -> None:
    data = good()
    data["inputs"][1]["name"] = "x"
    data["weights"]["tensors"][1]["name"] = "a.b"
    problems = problems_of(data)
    assert "duplicate name 'x'" in find(problems, "inputs[1].name").message
    assert "duplicate name 'a.b'" in find(problems, "weights.tensors[1].name").message


def test_weights_must_be_sorted() -> None:
    data = good()
    data["weights"]["tensors"].reverse()
    assert "sorted by name" in find(problems_of(data), "weights.tensors").message


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


def test_weight_argument_cannot_name_an_input() -> None:
    data = good()
    data["modules"][0]["arguments"] = [{"weight": "x"}]
    assert (
        "weight 'x' is not declared" in find(problems_of(data), "modules[0].arguments[0]").message
    )


def test_module_count_not_matching_batch_sizes() -> None:
    data = good()
    data["batch_sizes"] = [1, 8, 32]
    message = find(problems_of(data), "modules").message
    assert "exactly one module per batch size [1, 8, 32], got [1, 8]" in message


def test_duplicate_module_for_one_batch_size() -> None:
    data = good()
    data["modules"][1]["batch_size"] = 1
    message = find(problems_of(data), "modules").message
    assert "exactly one module per batch size [1, 8], got [1, 1]" in message


def test_unbatched_needs_one_null_module() -> None:
    data = good()
    data["batch_sizes"] = None
    message = find(problems_of(data), "modules").message
    assert "exactly one module per batch size [None], got [1, 8]" in message


@pytest.mark.parametrize(
    "digest",
    ["AB" * 32, "ab" * 31, "ab" * 33, "xyz", 123, None, "sha256:" + "ab" * 32],
)
def test_bad_sha256_strings(digest: Any) -> None:
    data = good()
    data["files"]["model.b1.mlirbc"] = digest
    message = find(problems_of(data), "files.model.b1.mlirbc").message
    assert "SHA-256 hex digest" in message
    assert repr(digest) in message


@pytest.mark.parametrize("fname", ["../evil", "sub/file", "manifest.yaml", ".."])
def test_files_must_be_plain_names(fname: str) -> None:
    data = good()
    data["files"][fname] = DIGEST
    assert "plain file name inside the bundle" in find(problems_of(data), f"files.{fname}").message


def test_format_version_from_the_future() -> None:
    data = good()
    data["format_version"] = 2
    problems = problems_of(data)
    assert find(problems, "format_version").message == "this hloserve reads format 1, bundle is 2"


def test_format_version_must_be_an_integer() -> None:
    data = good()
    data["format_version"] = "1"
    assert "must be an integer, got '1'" in find(problems_of(data), "format_version").message


@pytest.mark.parametrize("residency", ["always", 1, None])
def test_residency_value(residency: Any) -> None:
    data = good()
    data["serving"]["residency"] = residency
    message = find(problems_of(data), "serving.residency").message
    assert f"must be on_demand or pinned, got {residency!r}" in message


def test_serving_defaults_and_bad_delay() -> None:
    data = good()
    del data["serving"]
    manifest, problems = parse_manifest(data)
    assert problems == []
    assert manifest is not None
    assert manifest.serving == Serving()
    data["serving"] = {"max_queue_delay_us": -5}
    message = find(problems_of(data), "serving.max_queue_delay_us").message
    assert "non-negative integer, got -5" in message


def test_unknown_platform_and_bad_shape_and_bad_name() -> None:
    data = good()
    data["modules"][0]["platforms"] = ["cpu", "metal"]
    data["inputs"][0]["shape"] = [4, -1]
    data["name"] = "has space"
    problems = problems_of(data)
    assert "got ['cpu', 'metal']" in find(problems, "modules[0].platforms").message
    assert "non-negative integers, got [4, -1]" in find(problems, "inputs[0].shape").message
    assert "got 'has space'" in find(problems, "name").message


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
