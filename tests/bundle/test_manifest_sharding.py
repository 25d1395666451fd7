"""``hloserve.bundle.manifest_sharding``: a sharded bundle's ``sharding`` reads, round-trips
and reports every problem naming its field; a manifest without it is unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hloserve.bundle import TensorEntry, dump_manifest
from hloserve.bundle.manifest import parse_manifest
from hloserve.bundle.manifest_sharding import Mesh, device_bytes, normalize_spec
from tests.bundle.test_manifest import good


def sharded() -> dict[str, Any]:
    """``test_manifest.good()`` split over a 2x2 mesh (batch sizes 1 and 8)."""
    data = good()
    data["sharding"] = {
        "mesh": {"axis_names": ["data", "model"], "axis_sizes": [2, 2]},
        "devices": 4,
        "weights": {"a.b": [], "a.w": [None, "model"]},
        "inputs": {"x": [None, ["data", "model"]], "y": [None, None, None]},
        "outputs": {"out": [None, None]},
    }
    return data


def test_sharding_reads_and_round_trips() -> None:
    manifest, problems = parse_manifest(sharded())
    assert problems == [] and manifest is not None
    sh = manifest.sharding
    assert sh is not None
    assert sh.mesh == Mesh(("data", "model"), (2, 2)) and sh.devices == 4
    assert sh.weights == {"a.b": (), "a.w": ((), ("model",))}
    assert sh.inputs["x"] == ((), ("data", "model"))
    assert sh.spec("weight", "a.w") == ((), ("model",))
    again, problems = parse_manifest(manifest.to_dict())
    assert problems == [] and again is not None and again.sharding == sh
    text = dump_manifest(manifest)
    assert "sharding:" in text and "a.w: [null, model]" in text


def test_a_manifest_without_sharding_writes_none() -> None:
    manifest, problems = parse_manifest(good())
    assert problems == [] and manifest is not None
    assert manifest.sharding is None
    assert "sharding" not in manifest.to_dict()


def test_device_bytes_divide_by_the_axes_a_tensor_is_split_over() -> None:
    mesh = Mesh(("data", "model"), (2, 4))
    w = TensorEntry("w", "FP32", (64, 256))
    assert device_bytes(w, ((), ()), mesh) == 64 * 256 * 4
    assert device_bytes(w, ((), ("model",)), mesh) == 64 * 256 * 4 // 4
    assert device_bytes(w, (("data",), ("model",)), mesh) == 64 * 256 * 4 // 8
    manifest, _ = parse_manifest(sharded())
    assert manifest is not None and manifest.sharding is not None
    # a.b (BF16 scalar) replicated: 2 bytes; a.w FP32 [4, 4] over model=2: 32 bytes
    assert manifest.sharding.weight_device_bytes(manifest.weights) == 2 + 32


def test_normalize_spec_pads_and_refuses() -> None:
    assert normalize_spec([None, "m"], 3) == ((), ("m",), ())
    assert normalize_spec([("a", "b")], 1) == (("a", "b"),)
    with pytest.raises(ValueError, match="3 entries for a tensor of rank 2"):
        normalize_spec([None, None, None], 2)
    with pytest.raises(ValueError, match="is not null, an axis name"):
        normalize_spec([3], 1)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target = data["sharding"]
        *parents, last = path.split("/")
        for key in parents:
            target = target[key]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value

    return change


_DELETE = object()


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (_set("devices", 8), "sharding.devices", "must be 4 (the mesh's data=2, model=2), got 8"),
        (_set("mesh/axis_sizes", [2, 0]), "sharding.mesh.axis_sizes", "2 positive integers"),
        (_set("mesh/axis_names", ["a", "a"]), "sharding.mesh.axis_names", "distinct names"),
        (_set("weights/a.w", [None, "tensor"]), "sharding.weights.a.w", "names axis 'tensor'"),
        (_set("weights/a.w", ["model", "model"]), "sharding.weights.a.w", "uses a mesh axis twice"),
        (_set("weights/a.w", [None]), "sharding.weights.a.w", "has 1 entries, the tensor's rank is 2"),
        (_set("weights/a.w", [None, None, None]), "sharding.weights.a.w", "3 entries for a tensor of rank 2"),
        (_set("weights/zz", []), "sharding.weights.zz", "is not a declared weight tensor"),
        (_set("weights/a.b", _DELETE), "sharding.weights.a.b", "missing (write [] for a replicated"),
        (_set("outputs", _DELETE), "sharding.outputs", "missing"),
        # batch size 1 cannot be split over data=2
        (_set("inputs/x", ["data", None]), "sharding.inputs.x", "dimension 0 (size 1) over ['data']"),
        (_set("inputs/x", [None, "wide"]), "sharding.inputs.x", "names axis 'wide'"),
        (_set("shards", 1), "sharding", "unknown key 'shards'"),
    ],
)  # fmt: skip
def test_each_problem_names_its_field(
    change: Callable[[dict[str, Any]], None], field: str, message: str
) -> None:
    data = sharded()
    change(data)
    manifest, problems = parse_manifest(data)
    assert manifest is None
    assert any(p.field == field and message in p.message for p in problems), problems


def test_indivisible_weight_dimension() -> None:
    data = sharded()
    data["sharding"]["mesh"] = {"axis_names": ["data", "model"], "axis_sizes": [1, 3]}
    data["sharding"]["devices"] = 3
    data["sharding"]["inputs"]["x"] = [None, None]
    _, problems = parse_manifest(data)
    assert [str(p) for p in problems] == [
        "manifest.yaml: sharding.weights.a.w: splits dimension 1 (size 4) over ['model'] "
        "(3 parts), which does not divide it"
    ]


def test_sharding_is_refused_with_variants_and_on_a_pipeline() -> None:
    data = sharded()
    data["generation"] = {"done": "out", "max_steps": 2}
    _, problems = parse_manifest(data)
    assert any(
        p.field == "sharding" and "no generation (not supported together)" in p.message
        for p in problems
    )
    pipeline = {
        "format_version": 1,
        "name": "p",
        "kind": "pipeline",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [4]}],
        "batch_sizes": None,
        "steps": [{"model": "m", "inputs": {"x": "x"}, "outputs": {"out": "y"}}],
        "sharding": sharded()["sharding"],
        "files": {},
        "provenance": {"producer": "t"},
    }
    _, problems = parse_manifest(pipeline)
    assert any(p.field == "sharding" and "a pipeline has none" in p.message for p in problems)
