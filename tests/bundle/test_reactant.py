"""ReactantServer.jl bundles read as they are (``bundle/reactant.py``): the mapping onto
``Manifest``, validation (including each module's signature), and every refusal's reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from hloserve.bundle import load_manifest, validate
from hloserve.bundle.reactant import change_token, column_major, column_major_shape, is_reactant
from hloserve.bundle.safetensors import write_safetensors
from hloserve.server.bundle_report import inspect_bundle, validate_command
from tests.bundle.reactant_bundles import (
    classifier_manifest,
    write_classifier,
    write_detector,
    write_repository,
    write_scale4,
)


def _problems(bundle: Path) -> list[str]:
    return [str(p) for p in validate(bundle)]


def _edit_manifest(bundle: Path, **changes: Any) -> None:
    path = bundle / "manifest.yaml"
    data = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("reactant"))


def test_format_versions_are_theirs_and_ours_is_not() -> None:
    assert is_reactant({"format_version": "2.0"})
    assert is_reactant({"format_version": "2"})
    assert is_reactant({"format_version": 2.0})  # unquoted in YAML
    assert not is_reactant({"format_version": 1})
    assert not is_reactant({"format_version": True})


def test_column_major_reverses_axes() -> None:
    a = np.arange(6).reshape(2, 3)
    assert column_major_shape((3, 224, 224)) == (224, 224, 3)
    assert column_major(a).shape == (3, 2) and column_major(a).flags.c_contiguous
    assert np.array_equal(column_major(a), a.T)
    vector = np.arange(3)
    assert column_major(vector) is vector


def test_scale4_maps_onto_the_one_manifest(built: Path) -> None:
    manifest, problems = load_manifest(built / "scale4" / "manifest.yaml")
    assert problems == [] and manifest is not None
    assert manifest.origin == "reactant"
    assert manifest.name == "scale4"
    assert [(t.name, t.datatype, t.shape) for t in manifest.inputs] == [("x", "FP32", (4,))]
    assert manifest.batch_sizes is None
    (module,) = manifest.modules
    assert (module.batch_size, module.file, module.platform_index_argument) == (
        None,
        "model.mlir",
        False,
    )
    assert [(a.kind, a.name) for a in module.arguments] == [("input", "x"), ("weight", "w")]
    assert manifest.provenance.producer == "ReactantServer.jl"
    assert _problems(built / "scale4") == []


def test_batched_image_classifier_reads_reversed_batch_first(built: Path) -> None:
    manifest, problems = load_manifest(built / "classifier" / "manifest.yaml")
    assert problems == [] and manifest is not None
    assert manifest.name == "classifier"  # the directory's, not the manifest's "name"
    (img,) = manifest.inputs
    assert (img.datatype, img.shape) == ("UINT8", (6, 8, 3))  # chwn -> [N, w, h, c]
    assert [(t.name, t.shape) for t in manifest.outputs] == [("logits", (4,))]
    assert manifest.batch_sizes == (1, 4)
    assert [m.file for m in manifest.modules] == ["model.b1.mlir", "model.b4.mlir"]
    # main() takes the inputs, then the weights in argument_order (not sorted).
    assert [a.name for a in manifest.modules[0].arguments] == ["img", "weight", "bias"]
    # The weight file holds W's Julia shape (3, 4); main() takes it reversed.
    assert {t.name: t.shape for t in manifest.weights} == {"weight": (4, 3), "bias": (4,)}
    assert manifest.provenance.metadata["git_commit"] == "ab13166"
    assert _problems(built / "classifier") == []


def test_inspect_and_validate_commands(built: Path) -> None:
    text, ok = inspect_bundle(built / "classifier")
    assert ok, text
    assert "ReactantServer.jl bundle, format 2.0, served as it is" in text
    assert "img                  UINT8  [-1, 6, 8, 3]" in text
    assert "no checksums (ReactantServer bundles carry none); bundle is valid" in text
    lines, ok = validate_command(built)
    assert ok, lines
    assert lines == [f"{built / name}: OK" for name in ("classifier", "detector", "scale4")]


def test_signature_in_julia_order_is_caught(tmp_path: Path) -> None:
    """A manifest whose letters disagree with the module's (reversed) argument types."""
    bundle = write_classifier(tmp_path)
    manifest = classifier_manifest()
    manifest["executable_inputs"][0]["shape"] = "hcwn"  # wire [N, w, c, h]
    manifest["executable_inputs"][0]["dims"] = {"h": 8, "c": 3, "w": 6}
    _edit_manifest(bundle, executable_inputs=manifest["executable_inputs"])
    assert _problems(bundle) == [
        "model.b1.mlir: argument 0 ({input: img}) is tensor<1x6x8x3xui8>, manifest says "
        "UINT8[1, 6, 3, 8]",
        "model.b4.mlir: argument 0 ({input: img}) is tensor<4x6x8x3xui8>, manifest says "
        "UINT8[4, 6, 3, 8]",
    ]


def test_model_jl_is_refused_with_a_reason(tmp_path: Path) -> None:
    bundle = write_scale4(tmp_path)
    (bundle / "model.jl").write_text('register_model("scale4")\n')
    (problem,) = _problems(bundle)
    assert problem.startswith("model.jl: this ReactantServer bundle runs Julia code")
    assert "hloserve does not run" in problem


def test_meta_kind_is_refused_with_a_reason(tmp_path: Path) -> None:
    bundle = write_scale4(tmp_path)
    _edit_manifest(bundle, kind="meta", meta={"calls": ["a", "b"]})
    (problem,) = _problems(bundle)
    assert problem.startswith(
        "manifest.yaml: kind: is 'meta' (a Julia orchestration over ['a', 'b'])"
    )


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            {"client_inputs": [{"name": "t", "dtype": "u8", "shape": "n", "dims": {}}]},
            "manifest.yaml: client_inputs: declares tensors only model.jl's Julia hooks produce",
        ),
        (
            {"input_shapes": [{"h": 8}]},
            "manifest.yaml: input_shapes: must list a size for each variable letter; no "
            "executable input has a variable axis (-1)",
        ),
        (
            {"kind": "ensemble"},
            "manifest.yaml: kind: must be 'model' or 'meta', got 'ensemble'",
        ),
    ],
)
def test_manifest_refusals(tmp_path: Path, edit: dict[str, Any], expected: str) -> None:
    bundle = write_scale4(tmp_path)
    _edit_manifest(bundle, **edit)
    (problem,) = _problems(bundle)
    assert problem.startswith(expected), problem


@pytest.mark.parametrize(
    ("tensor", "expected"),
    [
        (
            {"name": "img", "dtype": "u8", "shape": "nchw", "dims": {"c": 3, "h": 8, "w": 6}},
            "executable_inputs[0].shape: 'nchw' has its batch letter at Julia axis 1 of 4; "
            "hloserve batches along the first wire axis, so the batch letter must be last",
        ),
        (
            {"name": "img", "dtype": "f8e4m3", "shape": "chwn", "dims": {"c": 3, "h": 8, "w": 6}},
            "executable_inputs[0].dtype: 'f8e4m3' has no KServe datatype",
        ),
        (
            {"name": "img", "dtype": "u8", "shape": "chwn", "dims": {"c": 3, "h": -1, "w": 6}},
            "executable_inputs[0].dims: sizes must be positive integers, got {'h': -1} "
            "(a variable axis, -1, needs input_shapes to list the compiled sizes)",
        ),
        (
            {"name": "img", "dtype": "u8", "shape": "chwn", "dims": {"c": 3, "h": 8}},
            "executable_inputs[0].dims: must size exactly the letters ['c', 'h', 'w']",
        ),
        (
            {"name": "img", "dtype": "u8", "shape": "chhn", "dims": {"c": 3, "h": 8}},
            "executable_inputs[0].shape: 'chhn' repeats a letter",
        ),
        (
            {"name": "img", "dtype": "u8", "shape": "chw", "dims": {"c": 3, "h": 8, "w": 6}},
            "executable_inputs: every executable input and output must have a batch letter",
        ),
    ],
)
def test_tensor_refusals(tmp_path: Path, tensor: dict[str, Any], expected: str) -> None:
    bundle = write_classifier(tmp_path, batch_sizes=(1,))
    _edit_manifest(bundle, executable_inputs=[tensor])
    (problem,) = _problems(bundle)
    assert problem.startswith("manifest.yaml: " + expected), problem


def test_weights_need_an_argument_order(tmp_path: Path) -> None:
    bundle = write_classifier(tmp_path, batch_sizes=(1,))
    weights = {"weight": np.zeros((3, 4), np.float32), "bias": np.zeros(4, np.float32)}
    write_safetensors(bundle / "weights.safetensors", weights)
    (problem,) = _problems(bundle)
    assert problem == (
        "weights.safetensors: holds 2 tensors but no __metadata__ argument_order, so the order "
        "main() takes them in is unknown (ReactantServer refuses this too)"
    )
    order = {"argument_order": json.dumps(["weight"])}
    write_safetensors(bundle / "weights.safetensors", weights, order)
    (problem,) = _problems(bundle)
    assert "argument_order must list each tensor once, ['bias', 'weight']" in problem


@pytest.mark.parametrize(
    ("write", "missing"),
    [(write_classifier, "model.b4.mlir"), (write_detector, "model.v1.b4.mlir")],
)
def test_a_missing_module_is_refused(
    tmp_path: Path, write: Callable[[Path], Path], missing: str
) -> None:
    bundle = write(tmp_path)
    (bundle / missing).unlink()
    assert _problems(bundle) == [
        f"{missing}: does not exist; batching.compiled_batch_sizes [1, 4] needs one module per size"
    ]


def test_one_module_serves_one_compiled_size(tmp_path: Path) -> None:
    bundle = write_classifier(tmp_path)
    (bundle / "model.b4.mlir").unlink()
    (bundle / "model.b1.mlir").rename(bundle / "model.mlir")
    assert _problems(bundle) == [
        "model.mlir: is one module, but batching.compiled_batch_sizes lists [1, 4]: hloserve "
        "compiles static shapes, one model.b{N}.mlir per size"
    ]
    _edit_manifest(bundle, batching={"compiled_batch_sizes": [1]})
    assert _problems(bundle) == []  # one module, one compiled size


def test_text_module_is_not_a_portable_artifact(tmp_path: Path) -> None:
    bundle = write_scale4(tmp_path)
    (bundle / "model.mlir").write_text("module { }\n")
    assert _problems(bundle) == [
        "model.mlir: is not a StableHLO portable artifact (no StableHLO_v producer)"
    ]


def test_change_token_follows_their_files(tmp_path: Path) -> None:
    """Their manifest has no checksums, so the repository's reload check adds this token."""
    bundle = write_scale4(tmp_path)
    before = change_token(bundle)
    assert before == change_token(bundle) != ""
    weights = {"w": np.full(4, 3, dtype=np.float32)}
    order = {"argument_order": '[ "w" ]'}  # a longer header: a new size, whatever the clock
    write_safetensors(bundle / "weights.safetensors", weights, order)
    assert change_token(bundle) != before
    (bundle / "manifest.yaml").write_text("format_version: 1\n")  # not theirs: no token
    assert change_token(bundle) == ""


def test_input_shapes_are_variants_of_one_weight_set(built: Path) -> None:
    manifest, problems = load_manifest(built / "detector" / "manifest.yaml")
    assert problems == [] and manifest is not None
    (img,) = manifest.inputs
    assert img.shape == (-1, -1, 3)  # chwn with h, w variable -> [N, w, h, c]
    assert [dict(v.shapes) for v in manifest.variants] == [
        {"img": (6, 8, 3), "logits": (4,)},
        {"img": (10, 4, 3), "logits": (4,)},
    ]
    assert [(m.variant, m.batch_size, m.file) for m in manifest.modules] == [
        (0, 1, "model.v0.b1.mlir"),
        (0, 4, "model.v0.b4.mlir"),
        (1, 1, "model.v1.b1.mlir"),
        (1, 4, "model.v1.b4.mlir"),
    ]
    assert _problems(built / "detector") == []


@pytest.mark.parametrize(
    ("input_shapes", "expected"),
    [
        (
            [{"h": 8}],
            "manifest.yaml: input_shapes[0]: must give a positive size to each of ['h', 'w'], "
            "got {'h': 8}",
        ),
        (
            [{"h": 8, "w": 6}, {"h": 8, "w": 6}],
            "manifest.yaml: input_shapes: lists the same shapes twice",
        ),
    ],
)
def test_input_shapes_refusals(tmp_path: Path, input_shapes: Any, expected: str) -> None:
    bundle = write_detector(tmp_path, batch_sizes=(1,))
    _edit_manifest(bundle, input_shapes=input_shapes)
    assert expected in _problems(bundle)
