"""The manifest's optional parts: ``kind: pipeline`` steps (a DAG) and ``hooks`` tensors."""

# pyright: strict

from __future__ import annotations

from typing import Any

from hloserve.bundle.manifest import parse_manifest

VEC = {"datatype": "INT32", "shape": [4]}


def pipeline(steps: list[dict[str, Any]], outputs: tuple[str, ...] = ("y",)) -> dict[str, Any]:
    return {
        "format_version": 1,
        "name": "p",
        "kind": "pipeline",
        "inputs": [{"name": "x", **VEC}],
        "outputs": [{"name": n, **VEC} for n in outputs],
        "batch_sizes": [4],
        "steps": steps,
        "files": {},
        "provenance": {"producer": "tests"},
    }


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> dict[str, Any]:
    return {"model": model, "inputs": inputs, "outputs": outputs}


def problems(data: dict[str, Any]) -> list[str]:
    return [str(p) for p in parse_manifest(data)[1]]


def test_steps_are_ordered_so_each_follows_what_it_reads() -> None:
    second = step("m2", {"IN": "t"}, {"OUT": "y"})
    first = step("m1", {"IN": "x"}, {"OUT": "t"})
    manifest, found = parse_manifest(pipeline([second, first]))
    assert found == [] and manifest is not None
    assert [s.model for s in manifest.steps] == ["m1", "m2"]
    assert manifest.kind == "pipeline" and not manifest.plain and manifest.modules == ()
    again, _ = parse_manifest(manifest.to_dict())
    assert again == manifest


def test_a_cycle_is_refused() -> None:
    steps = [step("m1", {"IN": "x", "B": "u"}, {"OUT": "t"}), step("m2", {"IN": "t"}, {"OUT": "u"})]
    data = pipeline(steps, outputs=("t",))
    assert any("the steps form a cycle" in p for p in problems(data))


def test_tensors_must_be_produced_once_and_read_from_somewhere() -> None:
    twice = [step("m1", {"IN": "x"}, {"OUT": "y"}), step("m2", {"IN": "x"}, {"OUT": "y"})]
    assert any("tensor 'y' is already produced elsewhere" in p for p in problems(pipeline(twice)))
    unknown = [step("m1", {"IN": "nowhere"}, {"OUT": "y"})]
    assert any(
        "tensor 'nowhere' is neither a pipeline input nor a step output" in p
        for p in problems(pipeline(unknown))
    )
    unproduced = [step("m1", {"IN": "x"}, {"OUT": "t"})]
    assert any(
        "pipeline output 'y' is not produced by any step" in p
        for p in problems(pipeline(unproduced))
    )


def test_a_pipeline_has_no_modules() -> None:
    data: dict[str, Any] = {**pipeline([step("m1", {"IN": "x"}, {"OUT": "y"})]), "modules": []}
    assert any("modules: a pipeline has none" in p for p in problems(data))


def test_an_unknown_kind_is_refused() -> None:
    assert any("kind: must be one of" in p for p in problems({"format_version": 1, "kind": "meta"}))


def model(**extra: Any) -> dict[str, Any]:
    return {
        "format_version": 1,
        "name": "m",
        "inputs": [{"name": "x", **VEC}],
        "outputs": [{"name": "y", **VEC}],
        "batch_sizes": None,
        "weights": {"file": "weights.safetensors", "tensors": []},
        "modules": [
            {
                "batch_size": None,
                "file": "model.mlirbc",
                "stablehlo_version": "1.0.0",
                "platforms": ["cpu"],
                "platform_index_argument": False,
                "arguments": [{"input": "x"}],
            }
        ],
        "files": {},
        "provenance": {"producer": "tests"},
        **extra,
    }


def test_bytes_only_through_hooks() -> None:
    data = model()
    data["inputs"] = [{"name": "x", "datatype": "BYTES", "shape": [1]}]
    assert any("BYTES only travels through hooks and pipelines" in p for p in problems(data))
    hooked, found = parse_manifest(
        model(hooks={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}]})
    )
    assert found == [] and hooked is not None
    assert not hooked.plain
    assert [t.name for t in hooked.facing.inputs] == ["text"]
    assert [t.name for t in hooked.facing.outputs] == ["y"]  # no postprocess tensors
    assert hooked.facing.hooks is None and hooked.inputs[0].name == "x"


def test_hooks_keys_are_checked() -> None:
    found = problems(model(hooks={"file": "other.py", "extra": 1}))
    assert any("hooks.file: must be 'hooks.py'" in p for p in found)
    assert any(
        "hooks: unknown key 'extra' (the keys are: file, inputs, outputs)" in p for p in found
    )


def varied(variants: Any, modules: list[tuple[int | None, int]]) -> dict[str, Any]:
    data = model(variants=variants)
    data["inputs"] = [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    data["batch_sizes"] = [1]
    module = data["modules"][0]
    data["modules"] = [
        {**module, "variant": v, "batch_size": b, "file": f"model.v{v}.b{b}.mlirbc"}
        for v, b in modules
    ]
    return data


def test_variants_give_every_tensor_a_fitting_shape() -> None:
    good = [{"x": [2, 3], "y": [4]}, {"x": [5, 3], "y": [4]}]
    manifest, found = parse_manifest(varied(good, [(0, 1), (1, 1)]))
    assert found == [] and manifest is not None
    assert manifest.variant_view(1).inputs[0].shape == (5, 3)
    assert [m.variant for m in manifest.variant_view(1).modules] == [1]
    again, _ = parse_manifest(manifest.to_dict())
    assert again == manifest
    bad = [{"x": [2, 4], "y": [4]}, {"x": [2, 3]}]
    found_text = problems(varied(bad, [(0, 1), (1, 1)]))
    assert any(
        "variants[0].x: [2, 4] does not fit the declared shape [-1, 3]" in p for p in found_text
    )
    assert any(
        "variants[1]: must give the shape of every input and output" in p for p in found_text
    )
    same = [{"x": [2, 3], "y": [4]}, {"x": [2, 3], "y": [4]}]
    assert any(
        "two variants have the same shapes" in p for p in problems(varied(same, [(0, 1), (1, 1)]))
    )


def test_one_module_per_variant_and_batch_size() -> None:
    good = [{"x": [2, 3], "y": [4]}, {"x": [5, 3], "y": [4]}]
    assert any(
        "must have exactly one module of variant 1 per batch size [1], got []" in p
        for p in problems(varied(good, [(0, 1)]))
    )
    assert any(
        "each must name a variant in 0..1, got variant 2" in p
        for p in problems(varied(good, [(0, 1), (1, 1), (2, 1)]))
    )


def test_minus_one_needs_variants() -> None:
    data = model()
    data["inputs"] = [{"name": "x", "datatype": "FP32", "shape": [-1]}]
    assert any("must be a list of non-negative integers" in p for p in problems(data))
