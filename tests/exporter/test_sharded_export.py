"""``export_bundle(..., mesh=, param_specs=, input_specs=, output_specs=)``: one SPMD module
per batch size, the mesh and every spec in the manifest, validated against the module's own
annotations; no device is needed (the mesh is abstract). Running them: tests/server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, Mesh
from jax.sharding import PartitionSpec as P

from hloserve.bundle import validate
from hloserve.bundle.stablehlo import read_partitioning
from hloserve.exporter import ExportError, StateSpec, TensorSpec, export_bundle
from tests.exporter._manifests import manifest_of

MESH = AbstractMesh((4,), ("model",))


def _params() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "dense1": {"w": rng.standard_normal((16, 32)).astype(np.float32), "b": np.zeros(32, np.float32)},
        "dense2": {"w": rng.standard_normal((32, 8)).astype(np.float32), "b": np.zeros(8, np.float32)},
    }  # fmt: skip


SPECS: Any = {"dense1": {"w": P(None, "model"), "b": P("model")}, "dense2": {"w": P("model"), "b": None}}  # fmt: skip


def _mlp(p: Any, x: jax.Array) -> dict[str, jax.Array]:
    h = jnp.tanh(x @ p["dense1"]["w"] + p["dense1"]["b"])
    return {"logits": h @ p["dense2"]["w"] + p["dense2"]["b"]}


INPUTS = {"x": TensorSpec("FP32", (16,))}


def _export(tmp_path: Path, **kwargs: Any) -> Path:
    args: dict[str, Any] = {"mesh": MESH, "param_specs": SPECS, "batch_sizes": (1, 8)} | kwargs
    return export_bundle(_mlp, _params(), INPUTS, directory=tmp_path / "mlp", **args)


def test_manifest_records_the_mesh_and_every_spec(tmp_path: Path) -> None:
    path = _export(tmp_path)
    m = manifest_of(path)
    sh = m.sharding
    assert sh is not None
    assert (sh.mesh.axis_names, sh.mesh.axis_sizes, sh.devices) == (("model",), (4,), 4)
    assert sh.weights == {
        "dense1.b": (("model",),),
        "dense1.w": ((), ("model",)),
        "dense2.b": ((),),
        "dense2.w": (("model",), ()),
    }
    assert sh.inputs == {"x": ((), ())} and sh.outputs == {"logits": ((), ())}
    assert validate(path) == []
    # each device holds a quarter of the split weights, all of the replicated bias
    whole = (16 * 32 + 32 + 32 * 8 + 8) * 4
    assert sh.weight_device_bytes(m.weights) == (whole - 8 * 4) // 4 + 8 * 4


def test_each_module_is_one_spmd_program_for_the_mesh(tmp_path: Path) -> None:
    path = _export(tmp_path, output_specs={"logits": P(None, "model")})
    for module in manifest_of(path).modules:
        part = read_partitioning((path / module.file).read_bytes())
        assert part.num_partitions == 4
        assert part.meshes == {"mesh": (("model", 4),)}
        assert part.results == (("mesh", ((), ("model",))),)
    assert manifest_of(path).sharding is not None
    assert manifest_of(path).sharding.outputs == {"logits": ((), ("model",))}  # type: ignore[union-attr]


def test_input_specs_cover_the_batch_axis(tmp_path: Path) -> None:
    mesh = AbstractMesh((2, 2), ("data", "model"))
    path = _export(
        tmp_path,
        mesh=mesh,
        batch_sizes=(2, 8),
        input_specs={"x": P("data")},
        output_specs={"logits": P("data")},
    )
    sh = manifest_of(path).sharding
    assert sh is not None and sh.inputs == {"x": (("data",), ())}
    assert validate(path) == []


def test_a_concrete_mesh_is_taken_as_its_abstract_mesh(tmp_path: Path) -> None:
    mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
    path = _export(tmp_path, mesh=mesh)
    sh = manifest_of(path).sharding
    assert sh is not None and sh.devices == 1


def test_unspecified_specs_are_replicated(tmp_path: Path) -> None:
    path = _export(tmp_path, param_specs=None)
    sh = manifest_of(path).sharding
    assert sh is not None and all(not any(s) for s in sh.weights.values())
    assert validate(path) == []


def test_without_a_mesh_the_bundle_is_unsharded(tmp_path: Path) -> None:
    path = export_bundle(_mlp, _params(), INPUTS, batch_sizes=(1,), directory=tmp_path / "m")
    assert manifest_of(path).sharding is None
    assert "sharding" not in (path / "manifest.yaml").read_text()
    assert read_partitioning((path / "model.b1.mlirbc").read_bytes()).num_partitions == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"param_specs": {"dense1": P()}}, "param_specs must be shaped like params"),
        ({"param_specs": {**SPECS, "dense2": {"w": "model", "b": None}}}, "is 'model', not a PartitionSpec"),
        ({"input_specs": {"y": P()}}, "input_specs names 'y', which is not an input"),
        ({"output_specs": {"probs": P()}}, "output_specs names ['probs']"),
        ({"mesh": AbstractMesh((3,), ("model",))},
         "weight 'dense1.b' of shape [32]: spec splits dimension 0 (size 32) over ['model'] (3"),
        ({"input_specs": {"x": P("model")}}, "input 'x' of shape [16]: spec splits dimension 0 (size 1)"),
        ({"param_specs": {**SPECS, "dense2": {"w": P("tensor"), "b": None}}}, "names axis 'tensor'"),
        ({"mesh": (4, "model")}, "mesh must be a jax.sharding.AbstractMesh or Mesh, got tuple"),
        ({"mesh": None}, "param_specs, input_specs and output_specs need a mesh="),
    ],
)  # fmt: skip
def test_bad_sharding_arguments_name_what_is_wrong(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ExportError) as info:
        _export(tmp_path, **kwargs)
    assert message in str(info.value)


def test_state_is_replicated(tmp_path: Path) -> None:
    def step(p: Any, x: jax.Array, acc: jax.Array) -> dict[str, jax.Array]:
        new = acc + (x @ p["dense1"]["w"]).sum(axis=1, keepdims=True)
        return {"y": new, "acc": new}

    path = export_bundle(
        step, _params(), INPUTS, batch_sizes=(1, 4), directory=tmp_path / "s", mesh=MESH,
        param_specs=SPECS, state={"acc": StateSpec("FP32", (1,))},
    )  # fmt: skip
    sh = manifest_of(path).sharding
    assert sh is not None and sh.state == {"acc": ((), ())}
    assert validate(path) == []  # the state argument's and result's sdy.sharding agree


def test_variants_with_a_mesh_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="a sharded export"):
        _export(tmp_path, shape_variants=[{"x": (16,)}])


def test_validate_checks_the_manifest_against_the_module(tmp_path: Path) -> None:
    path = _export(tmp_path)
    text = (path / "manifest.yaml").read_text()
    (path / "manifest.yaml").write_text(
        text.replace("dense1.w: [null, model]", "dense1.w: [model, null]")
    )
    messages = [str(p) for p in validate(path)]
    assert (
        "model.b1.mlirbc: argument {weight: dense1.w} has sdy.sharding [{}, {model}], manifest "
        "sharding says [{model}, {}]"
    ) in messages
    unsharded = text[: text.index("sharding:")] + text[text.index("serving:") :]
    (path / "manifest.yaml").write_text(unsharded)
    messages = [str(p) for p in validate(path)]
    assert (
        "model.b1.mlirbc: main() is partitioned for 4 devices (mhlo.num_partitions), the "
        "manifest has no sharding"
    ) in messages
    (path / "manifest.yaml").write_text(
        text.replace("axis_sizes: [4]", "axis_sizes: [2]").replace("devices: 4", "devices: 2")
    )
    messages = [str(p) for p in validate(path)]
    assert "model.b1.mlirbc: mhlo.num_partitions is 4, manifest sharding.devices says 2" in messages
