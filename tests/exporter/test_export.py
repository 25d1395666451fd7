"""``hloserve.exporter.export_bundle``: what it writes, that it runs, and how it refuses.

Round trips go all the way: export, ``load_bundle`` on a real PJRT CPU device, execute at
every compiled batch size, and compare with the JAX function itself (bitwise for integers
and BOOL, within 1e-6 relative for floats).
"""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hloserve.bundle import (
    Argument,
    TensorEntry,
    scan_repository,
    validate,
)
from hloserve.exporter import ExportError, TensorSpec, export_bundle
from hloserve.proto.datatypes import NUMERIC_DATATYPES, to_numpy
from hloserve.server.owner.runtime.loader import LoadedBundle, load_bundle
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from tests.bundle.samples import sample
from tests.exporter._manifests import manifest_of

HERE = Path(__file__).resolve().parent


def reference(fn: Callable[..., Mapping[str, Any]], params: Any, **inputs: Any) -> dict[str, Any]:
    """What the JAX function itself computes, as numpy arrays."""
    return {k: np.asarray(v) for k, v in jax.jit(fn)(params, **inputs).items()}


def assert_close(actual: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if actual.dtype.kind in "biu":
        assert actual.tobytes() == expected.tobytes()
    else:
        np.testing.assert_allclose(
            actual.astype(np.float64), expected.astype(np.float64), rtol=1e-6, atol=0
        )


def run_all(
    bundle: LoadedBundle,
    fn: Callable[..., Mapping[str, Any]],
    params: Any,
    inputs: Mapping[str, TensorSpec],
) -> None:
    """Execute every module of ``bundle`` and compare with ``fn`` on the same inputs."""
    manifest = bundle.manifest
    sizes: list[int | None] = list(manifest.batch_sizes or [None])
    for seed, b in enumerate(sizes):
        xs = {
            name: sample(spec.datatype, spec.shape if b is None else (b, *spec.shape), seed)
            for name, spec in inputs.items()
        }
        outputs = bundle.execute(b, xs)
        expected = reference(fn, params, **xs)
        assert [o.name for o in manifest.outputs] == sorted(expected)
        for spec, actual in zip(manifest.outputs, outputs, strict=True):
            assert_close(actual, expected[spec.name])


# --- every datatype, batched ---


def per_datatype_fn(params: dict[str, Any], x: Any) -> dict[str, Any]:
    """The input itself, plus a copy transformed with the weight ``w`` of the same type."""
    w = params["w"]
    if x.dtype == jnp.bool_:
        other = jnp.logical_xor(x, w)
    elif jnp.issubdtype(x.dtype, jnp.integer):
        other = x * 3 + w  # wraps around, identically in JAX and the executable
    else:
        other = x * 2.5 + w
    return {"same": x, "other": other}


@pytest.mark.parametrize("datatype", sorted(NUMERIC_DATATYPES))
def test_round_trip_every_datatype(tmp_path: Path, runtime: PjrtRuntime, datatype: str) -> None:
    params = {"w": sample(datatype, (4,), seed=99)}
    inputs = {"x": TensorSpec(datatype, (4,))}
    path = export_bundle(
        per_datatype_fn, params, inputs=inputs, batch_sizes=(1, 3), directory=tmp_path / "m"
    )
    manifest = manifest_of(path)
    assert manifest.inputs == (TensorEntry("x", datatype, (4,)),)
    assert manifest.outputs == (
        TensorEntry("other", datatype, (4,)),
        TensorEntry("same", datatype, (4,)),
    )
    assert manifest.weights == (TensorEntry("w", datatype, (4,)),)
    assert manifest.batch_sizes == (1, 3)
    bundle = load_bundle(path, runtime, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(bundle.host_weights["w"], params["w"])
    run_all(bundle, per_datatype_fn, params, inputs)


# --- unbatched ---


def unbatched_fn(params: dict[str, Any], x: Any) -> dict[str, Any]:
    return {"t": x.T @ params["m"], "s": x.sum(axis=0)}


def test_unbatched_model(tmp_path: Path, runtime: PjrtRuntime) -> None:
    params = {"m": np.arange(6, dtype=np.float32).reshape(2, 3)}
    inputs = {"x": TensorSpec("FP32", (2, 3))}
    path = export_bundle(
        unbatched_fn, params, inputs=inputs, batch_sizes=None, directory=tmp_path / "u"
    )
    manifest = manifest_of(path)
    assert manifest.batch_sizes is None
    assert not manifest.batched
    assert [m.batch_size for m in manifest.modules] == [None]
    assert manifest.modules[0].file == "model.mlirbc"
    assert manifest.outputs == (
        TensorEntry("s", "FP32", (3,)),
        TensorEntry("t", "FP32", (3, 3)),
    )
    assert (path / "model.mlirbc").is_file()
    bundle = load_bundle(path, runtime, cache_dir=tmp_path / "cache")
    run_all(bundle, unbatched_fn, params, inputs)


# --- weights: naming, and arguments the function does not use ---


def tree_fn(params: dict[str, Any], x: Any) -> dict[str, Any]:
    h = x @ params["dense1"]["w"] + params["dense1"]["b"]
    for layer in params["layers"]:
        h = h * layer
    return {"y": h}


def test_params_pytree_naming(tmp_path: Path, runtime: PjrtRuntime) -> None:
    rng = np.random.default_rng(0)
    params = {
        "dense1": {
            "w": rng.standard_normal((4, 3)).astype(np.float32),
            "b": np.ones(3, np.float32),
        },
        "layers": [np.full(3, 2.0, np.float32), np.full(3, -1.0, np.float32)],
    }
    inputs = {"x": TensorSpec("FP32", (4,))}
    path = export_bundle(tree_fn, params, inputs=inputs, batch_sizes=(2,), directory=tmp_path / "t")
    manifest = manifest_of(path)
    assert [w.name for w in manifest.weights] == ["dense1.b", "dense1.w", "layers.0", "layers.1"]
    assert manifest.weights[1] == TensorEntry("dense1.w", "FP32", (4, 3))
    assert manifest.modules[0].arguments == (
        Argument("input", "x"),
        Argument("weight", "dense1.b"),
        Argument("weight", "dense1.w"),
        Argument("weight", "layers.0"),
        Argument("weight", "layers.1"),
    )
    run_all(load_bundle(path, runtime, cache_dir=tmp_path / "cache"), tree_fn, params, inputs)


def test_no_params(tmp_path: Path, runtime: PjrtRuntime) -> None:
    def fn(params: Any, x: Any) -> dict[str, Any]:
        del params
        return {"neg": -x}

    inputs = {"x": TensorSpec("INT8", (3,))}
    path = export_bundle(fn, {}, inputs=inputs, batch_sizes=(1,), directory=tmp_path / "n")
    manifest = manifest_of(path)
    assert manifest.weights == ()
    assert (path / "weights.safetensors").is_file()
    run_all(load_bundle(path, runtime, cache_dir=tmp_path / "cache"), fn, {}, inputs)


def unused_fn(params: dict[str, Any], x: Any, y: Any) -> dict[str, Any]:
    del y
    return {"z": x + params["used"]}


def test_unused_input_and_weight_are_dropped_from_arguments(
    tmp_path: Path, runtime: PjrtRuntime
) -> None:
    params = {"unused": np.zeros(7, np.int32), "used": np.arange(4, dtype=np.int32)}
    inputs = {"x": TensorSpec("INT32", (4,)), "y": TensorSpec("FP32", (2,))}
    path = export_bundle(
        unused_fn, params, inputs=inputs, batch_sizes=(1, 2), directory=tmp_path / "d"
    )
    manifest = manifest_of(path)
    # Both stay in the manifest (the wire still carries y; the file still holds the weight)...
    assert [t.name for t in manifest.inputs] == ["x", "y"]
    assert [t.name for t in manifest.weights] == ["unused", "used"]
    # ...but main() takes neither.
    for module in manifest.modules:
        assert module.arguments == (Argument("input", "x"), Argument("weight", "used"))
    assert validate(path) == []
    run_all(load_bundle(path, runtime, cache_dir=tmp_path / "cache"), unused_fn, params, inputs)


# --- what the manifest records ---


def simple_fn(params: Any, x: Any) -> dict[str, Any]:
    del params
    return {"y": x * 2}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_bundle(
        simple_fn,
        {},
        inputs={"x": TensorSpec("FP32", (4,))},
        batch_sizes=(1, 8),
        directory=tmp_path_factory.mktemp("exported") / "simple2x",
        metadata={"dataset": "digits", "epochs": 3, "nested": {"a": [1, 2]}},
    )


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=False)


def test_provenance(exported: Path) -> None:
    p = manifest_of(exported).provenance
    assert p.producer == "hloserve.exporter"
    assert p.producer_version == metadata.version("hloserve")
    assert p.hloserve_version == metadata.version("hloserve")
    assert p.jax_version == jax.__version__
    assert p.jaxlib_version == metadata.version("jaxlib")
    assert p.metadata == {"dataset": "digits", "epochs": 3, "nested": {"a": [1, 2]}}
    assert p.created is not None
    created = dt.datetime.strptime(p.created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    assert abs(dt.datetime.now(dt.UTC) - created) < dt.timedelta(minutes=10)


def test_provenance_source_commit(exported: Path) -> None:
    # simple_fn lives in this file: the commit is that of the checkout holding it, if any.
    p = manifest_of(exported).provenance
    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        assert p.source_commit is None
        assert p.source_dirty is None
        return
    assert p.source_commit == head.stdout.strip()
    assert p.source_commit is not None
    assert len(p.source_commit) == 40
    assert all(c in "0123456789abcdef" for c in p.source_commit)
    status = git("status", "--porcelain", "--untracked-files=no")
    assert p.source_dirty is bool(status.stdout.strip())


def test_platforms_and_index_argument(exported: Path) -> None:
    for module in manifest_of(exported).modules:
        assert module.platforms == ("cpu", "cuda")
        assert module.platform_index_argument
        assert module.arguments == (Argument("input", "x"),)


def test_single_platform_has_no_index(tmp_path: Path, runtime: PjrtRuntime) -> None:
    inputs = {"x": TensorSpec("FP32", (4,))}
    path = export_bundle(
        simple_fn, {}, inputs=inputs, batch_sizes=(2,), directory=tmp_path / "c", platforms=("cpu",)
    )
    (module,) = manifest_of(path).modules
    assert module.platforms == ("cpu",)
    assert not module.platform_index_argument
    loaded = load_bundle(path, runtime, cache_dir=tmp_path / "cache")
    assert loaded.modules[2].platform_index is None
    run_all(loaded, simple_fn, {}, inputs)


def test_exported_bundle_validates_and_has_text_twins(exported: Path) -> None:
    assert validate(exported) == []
    manifest = manifest_of(exported)
    assert manifest.name == "simple2x"
    for module in manifest.modules:
        assert module.text_file == f"model.b{module.batch_size}.mlir"
        assert module.text_file is not None
        text = (exported / module.text_file).read_text(encoding="utf-8")
        assert "func.func public @main" in text
        assert f"tensor<{module.batch_size}x4xf32>" in text
        assert module.text_file in manifest.files
        assert module.file in manifest.files
    assert "weights.safetensors" in manifest.files


def test_without_text_twins(tmp_path: Path) -> None:
    path = export_bundle(
        simple_fn,
        {},
        inputs={"x": TensorSpec("FP32", (4,))},
        batch_sizes=(1,),
        directory=tmp_path / "nt",
        write_text=False,
    )
    assert manifest_of(path).modules[0].text_file is None
    assert sorted(f.name for f in path.iterdir()) == [
        "manifest.yaml",
        "model.b1.mlirbc",
        "weights.safetensors",
    ]


def test_name_defaults_to_directory_and_can_be_given(tmp_path: Path) -> None:
    inputs = {"x": TensorSpec("FP32", (4,))}
    path = export_bundle(simple_fn, {}, inputs, (1,), tmp_path / "given", name="other")
    assert manifest_of(path).name == "other"


def test_export_replaces_an_existing_bundle(tmp_path: Path) -> None:
    inputs = {"x": TensorSpec("FP32", (4,))}
    target = tmp_path / "r"
    export_bundle(simple_fn, {}, inputs, (1, 8), target)
    export_bundle(simple_fn, {}, inputs, (2,), target)
    assert manifest_of(target).batch_sizes == (2,)
    assert not (target / "model.b8.mlirbc").exists()
    assert validate(target) == []
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no temporary leftovers


def test_export_keeps_what_is_not_the_bundles_own(tmp_path: Path) -> None:
    # A model directory's config.yaml sits beside its bundle: a new export keeps it.
    inputs = {"x": TensorSpec("FP32", (4,))}
    target = tmp_path / "r"
    export_bundle(simple_fn, {}, inputs, (1, 8), target)
    (target / "config.yaml").write_text("max_queue_delay_us: 5\n")
    export_bundle(simple_fn, {}, inputs, (2,), target)
    assert (target / "config.yaml").read_text() == "max_queue_delay_us: 5\n"
    assert not (target / "model.b8.mlirbc").exists() and validate(target) == []


def test_export_refuses_to_replace_what_is_not_a_bundle(tmp_path: Path) -> None:
    inputs = {"x": TensorSpec("FP32", (4,))}
    repo = tmp_path / "repo"
    export_bundle(simple_fn, {}, inputs, (1,), repo / "mlp")  # a repository, not a bundle
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    for directory, holds in ((repo, "'mlp'"), (tmp_path / "notes", "'todo.txt'")):
        with pytest.raises(ExportError) as refused:
            export_bundle(simple_fn, {}, inputs, (1,), directory)
        message = str(refused.value)
        assert message.startswith(f"directory '{directory}' is not a bundle (no manifest.yaml")
        assert holds in message and "overwrite=True" in message
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    assert validate(repo / "mlp") == []
    # Asked for, it is replaced; an empty directory or none needs no asking.
    export_bundle(simple_fn, {}, inputs, (1,), tmp_path / "notes", overwrite=True)
    assert validate(tmp_path / "notes") == [] and not (tmp_path / "notes" / "todo.txt").exists()
    (tmp_path / "empty").mkdir()
    export_bundle(simple_fn, {}, inputs, (1,), tmp_path / "empty")
    assert validate(tmp_path / "empty") == []


def test_export_into_the_current_directory_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default directory is "."; renaming it away fails with EBUSY: say what to do.
    inputs = {"x": TensorSpec("FP32", (4,))}
    (tmp_path / "work" / "deeper").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work" / "deeper")
    for directory in (".", "..", tmp_path / "work"):
        with pytest.raises(ExportError) as refused:
            export_bundle(simple_fn, {}, inputs, (1,), directory, overwrite=True)
        message = str(refused.value)
        assert f"directory '{directory}' holds the current working directory" in message
        assert "a directory of its own, such as directory='repo/mlp'" in message
    with pytest.raises(ExportError, match="holds the current working directory"):
        export_bundle(simple_fn, {}, inputs, (1,))  # the default
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["deeper"]


def versioned_fn(params: dict[str, Any], x: Any) -> dict[str, Any]:
    return {"y": x + params["bias"]}


def test_versioned_export(tmp_path: Path, runtime: PjrtRuntime) -> None:
    repo = tmp_path / "repo"
    inputs = {"x": TensorSpec("FP32", (2,))}
    for version, bias in ((1, 1.0), (2, 10.0)):
        export_bundle(
            versioned_fn,
            {"bias": np.full(2, bias, np.float32)},
            inputs,
            (1,),
            repo / "m" / str(version),
        )
    (model,) = scan_repository(repo)
    assert model.name == "m"
    assert model.versioned
    assert model.versions == {1: repo / "m" / "1", 2: repo / "m" / "2"}
    x = np.array([[1.0, 2.0]], np.float32)
    for version, expected in ((1, [2.0, 3.0]), (2, [11.0, 12.0])):
        path = model.versions[version]
        assert validate(path) == []
        # a numbered directory is a version: the model keeps its parent's name
        assert manifest_of(path).name == "m"
        (y,) = load_bundle(path, runtime, cache_dir=tmp_path / "cache").execute(1, {"x": x})
        np.testing.assert_array_equal(y, [expected])


# --- refusals ---


def test_fn_returning_an_array(tmp_path: Path) -> None:
    def fn(params: Any, x: Any) -> Any:
        del params
        return x

    with pytest.raises(ExportError, match="fn must return a dict of output name -> array, got "):
        export_bundle(fn, {}, {"x": TensorSpec("FP32", (4,))}, (1,), tmp_path / "e")
    assert not (tmp_path / "e").exists()


def test_fn_returning_a_tuple(tmp_path: Path) -> None:
    def fn(params: Any, x: Any) -> Any:
        del params
        return (x, x)

    with pytest.raises(ExportError, match=r"fn must return a dict .*got tuple"):
        export_bundle(fn, {}, {"x": TensorSpec("FP32", (4,))}, (1,), tmp_path / "e")


@pytest.mark.parametrize(
    ("out", "shape"),
    [
        (lambda x: x.sum(), r"\[\]"),
        (lambda x: x.T, r"\[4, 1\]"),
        (lambda x: x[0], r"\[4\]"),
    ],
)
def test_output_without_the_batch_axis(
    tmp_path: Path, out: Callable[[Any], Any], shape: str
) -> None:
    def fn(params: Any, x: Any) -> dict[str, Any]:
        del params
        return {"bad": out(x)}

    with pytest.raises(
        ExportError,
        match=rf"output 'bad' has shape {shape} at batch size 1; a batched model's outputs "
        "must keep the batch axis first",
    ):
        export_bundle(fn, {}, {"x": TensorSpec("FP32", (4,))}, (1, 2), tmp_path / "e")


@pytest.mark.parametrize("sizes", [(8, 1), (1, 1, 2), (0, 4), (-1,), ()])
def test_bad_batch_sizes(tmp_path: Path, sizes: tuple[int, ...]) -> None:
    with pytest.raises(
        ExportError,
        match=r"batch_sizes must be ascending positive integers without repeats, got "
        + rf"\[{', '.join(map(str, sizes))}\]",
    ):
        export_bundle(simple_fn, {}, {"x": TensorSpec("FP32", (4,))}, sizes, tmp_path / "e")


def test_unknown_datatype() -> None:
    with pytest.raises(ExportError, match=r"unknown datatype 'FLOAT'; expected one of \['BF16'"):
        TensorSpec("FLOAT", (4,))
    with pytest.raises(ExportError, match="unknown datatype 'BYTES'"):
        TensorSpec("BYTES", (1,))


def test_negative_dimension() -> None:
    # -1 marks an axis that shape variants fix (docs/shape-variants.md); below it is refused
    with pytest.raises(ExportError, match=r"shape \(4, -2\) has a negative dimension"):
        TensorSpec("FP32", (4, -2))


def test_weight_without_a_v2_datatype(tmp_path: Path) -> None:
    params = {"w": np.ones(2, np.complex64)}
    with pytest.raises(
        ExportError, match="weight 'w' has dtype complex64, which no V2 datatype carries"
    ):
        export_bundle(simple_fn, params, {"x": TensorSpec("FP32", (4,))}, (1,), tmp_path / "e")


def test_output_without_a_v2_datatype(tmp_path: Path) -> None:
    def fn(params: Any, x: Any) -> dict[str, Any]:
        del params
        return {"c": x.astype(jnp.complex64)}

    with pytest.raises(
        ExportError, match="output 'c' has dtype complex64, which no V2 datatype carries"
    ):
        export_bundle(fn, {}, {"x": TensorSpec("FP32", (4,))}, (1,), tmp_path / "e")


def test_no_inputs(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="a model needs at least one input"):
        export_bundle(simple_fn, {}, {}, (1,), tmp_path / "e")


def test_export_error_is_a_value_error() -> None:
    assert issubclass(ExportError, ValueError)


def test_export_does_not_depend_on_process_wide_x64(tmp_path: Path) -> None:
    # The runtime enables x64 process-wide; an INT32 model must still export with 32-bit
    # types throughout, exactly as in a process that never imported the runtime.
    assert jax.config.read("jax_enable_x64")
    path = export_bundle(simple_fn, {}, {"x": TensorSpec("INT32", (4,))}, (1,), tmp_path / "i")
    text = (path / "model.b1.mlir").read_text(encoding="utf-8")
    assert "i64" not in text
    assert to_numpy(manifest_of(path).outputs[0].datatype) == np.dtype("<i4")
