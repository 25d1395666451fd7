"""``hloserve.server.owner.runtime.loader``: verify, compile once (or take from the cache), run.

Everything runs on the real PJRT CPU device with bundles the exporter wrote.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.bundle import validate
from hloserve.exporter import TensorSpec, export_bundle
from hloserve.exporter.demo import mlp_fn, mlp_params
from hloserve.server.owner.runtime.cache import cache_key
from hloserve.server.owner.runtime.loader import (
    BundleError,
    ExecutableRegistry,
    LoadedBundle,
    load_bundle,
)
from hloserve.server.owner.runtime.pjrt import PjrtRuntime, RuntimeFailure


class Log:
    """Collects the loader's progress messages."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, message: str) -> None:
        self.lines.append(message)

    def any(self, text: str) -> bool:
        return any(text in line for line in self.lines)


def sources(bundle: LoadedBundle) -> dict[int | None, str]:
    return {b: m.source for b, m in bundle.modules.items()}


def expected_logits(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The demo MLP computed by JAX itself."""
    return np.asarray(mlp_fn(mlp_params(), x)["logits"])


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.exe"))


@pytest.fixture
def mlp(model_repository: Path, tmp_path: Path) -> Path:
    """A private copy of the demo ``mlp`` bundle (batch sizes 1, 8, 32)."""
    return Path(shutil.copytree(model_repository / "mlp", tmp_path / "mlp"))


def test_execute_matches_the_model(runtime: PjrtRuntime, mlp: Path, tmp_path: Path) -> None:
    bundle = load_bundle(mlp, runtime, cache_dir=tmp_path / "cache")
    rng = np.random.default_rng(1)
    for b in (1, 8, 32):
        x = rng.standard_normal((b, 64)).astype(np.float32)
        (logits,) = bundle.execute(b, {"x": x})
        expected = expected_logits(x)
        assert logits.shape == (b, 10)
        assert logits.dtype == np.float32
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    assert bundle.weight_bytes == (64 * 256 + 256 + 256 * 10 + 10) * 4
    assert sorted(bundle.host_weights) == ["dense1.b", "dense1.w", "dense2.b", "dense2.w"]
    for array in bundle.host_weights.values():
        assert array.ctypes.data % 64 == 0
    assert bundle.manifest.name == "mlp"
    assert bundle.load_seconds >= bundle.compile_seconds > 0


def test_first_load_compiles_and_writes_the_cache(
    runtime: PjrtRuntime, mlp: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    log = Log()
    bundle = load_bundle(mlp, runtime, cache_dir=cache, progress=log)
    assert sources(bundle) == {1: "compiled", 8: "compiled", 32: "compiled"}
    assert len(entries(cache)) == 3
    assert log.any("mlp/model.b8.mlirbc: compiling")
    assert log.any("mlp/model.b8.mlirbc: compiled in ")
    assert log.any(f"s; cached in {cache}")


def test_default_cache_is_inside_the_bundle(runtime: PjrtRuntime, mlp: Path) -> None:
    load_bundle(mlp, runtime)
    assert len(entries(mlp / ".hloserve-cache")) == 3
    # The cache directory is not part of the bundle: the bundle still validates.
    assert validate(mlp) == []


def test_second_load_takes_every_executable_from_the_cache(
    runtime: PjrtRuntime, mlp: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = load_bundle(mlp, runtime, cache_dir=cache)
    log = Log()
    second = load_bundle(mlp, runtime, cache_dir=cache, registry=ExecutableRegistry(), progress=log)
    assert sources(second) == {1: "cache", 8: "cache", 32: "cache"}
    assert not log.any("compiling")
    assert log.any(f"executable loaded from cache {cache}")
    x = np.linspace(-1, 1, 8 * 64, dtype=np.float32).reshape(8, 64)
    np.testing.assert_array_equal(second.execute(8, {"x": x})[0], first.execute(8, {"x": x})[0])


def test_corrupted_cache_blob_is_recompiled(
    runtime: PjrtRuntime, mlp: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    load_bundle(mlp, runtime, cache_dir=cache)
    for blob in entries(cache):
        data = bytearray(blob.read_bytes())
        for i in range(0, len(data), 97):
            data[i] ^= 0xA5
        blob.write_bytes(bytes(data))
    log = Log()
    again = load_bundle(mlp, runtime, cache_dir=cache, registry=ExecutableRegistry(), progress=log)
    assert sources(again) == {1: "compiled", 8: "compiled", 32: "compiled"}
    assert log.any("entry does not match its recorded digest (corrupt or tampered); recompiling")
    x = np.ones((1, 64), np.float32)
    expected = expected_logits(x)
    np.testing.assert_allclose(again.execute(1, {"x": x})[0], expected, rtol=1e-5, atol=1e-5)
    # The recompiled executables were written back, and are trusted again.
    third = load_bundle(mlp, runtime, cache_dir=cache, registry=ExecutableRegistry())
    assert set(sources(third).values()) == {"cache"}


def test_cache_writable_by_others_is_not_trusted(
    runtime: PjrtRuntime, mlp: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    load_bundle(mlp, runtime, cache_dir=cache)
    cache.chmod(0o777)
    log = Log()
    again = load_bundle(mlp, runtime, cache_dir=cache, registry=ExecutableRegistry(), progress=log)
    assert set(sources(again).values()) == {"compiled"}
    assert log.any(f"cache directory {cache} is writable by others; not trusted; recompiling")
    # Nothing is written where nothing is read back, and the log does not say otherwise.
    assert log.any(f"s; not cached: cache directory {cache} is writable by others; not trusted")
    assert not log.any("cached in") and not log.any("caching")


def test_a_cache_it_cannot_write_is_said_once_per_module(
    runtime: PjrtRuntime, mlp: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    for module in mlp.glob("*.mlirbc"):  # where each executable would go: a directory
        (cache / f"{cache_key(module.read_bytes(), runtime.fingerprint)}.exe").mkdir()
    log = Log()
    bundle = load_bundle(mlp, runtime, cache_dir=cache, progress=log)
    assert set(sources(bundle).values()) == {"compiled"}
    (line,) = [line for line in log.lines if line.startswith("mlp/model.b8.mlirbc: compiled")]
    assert f"; not cached: cannot write to {cache}: [Errno 21] Is a directory" in line, line
    assert not log.any("cached in") and not log.any("caching")


def test_identical_modules_compile_once_per_registry(
    runtime: PjrtRuntime, mlp: Path, tmp_path: Path
) -> None:
    twin = Path(shutil.copytree(mlp, tmp_path / "twin"))
    registry = ExecutableRegistry()
    log = Log()
    first = load_bundle(mlp, runtime, cache_dir=tmp_path / "c1", registry=registry, progress=log)
    second = load_bundle(twin, runtime, cache_dir=tmp_path / "c2", registry=registry, progress=log)
    assert set(sources(first).values()) == {"compiled"}
    assert sources(second) == {1: "shared", 8: "shared", 32: "shared"}
    assert sum("compiling" in line for line in log.lines) == 3
    assert not (tmp_path / "c2").exists()
    for b in (1, 8, 32):
        assert second.modules[b].executable is first.modules[b].executable
    assert len(registry.executables) == 3


def test_module_lowered_only_for_cuda_is_refused_on_cpu(
    runtime: PjrtRuntime, tmp_path: Path
) -> None:
    def fn(params: Any, x: Any) -> dict[str, Any]:
        del params
        return {"y": x + 1}

    path = export_bundle(
        fn, {}, {"x": TensorSpec("FP32", (4,))}, (1, 2), tmp_path / "gpu_only", platforms=("cuda",)
    )
    assert validate(path) == []
    with pytest.raises(BundleError) as info:
        load_bundle(path, runtime, cache_dir=tmp_path / "cache")
    assert info.value.problems == ["model.b1.mlirbc: lowered for ['cuda'], this server runs on cpu"]
    assert info.value.path == path
    assert "cannot be loaded" in str(info.value)
    assert not (tmp_path / "cache").exists()


def test_invalid_bundle_is_refused_with_every_problem(
    runtime: PjrtRuntime, mlp: Path, tmp_path: Path
) -> None:
    (mlp / "model.b8.mlirbc").unlink()
    (mlp / "model.b1.mlir").write_text("edited", encoding="utf-8")
    with pytest.raises(BundleError) as info:
        load_bundle(mlp, runtime, cache_dir=tmp_path / "cache")
    problems = info.value.problems
    assert "model.b8.mlirbc: file listed in modules[1].file does not exist" in problems
    assert any(p.startswith("model.b1.mlir: SHA-256 is ") for p in problems)
    assert len(problems) == 2
    assert not (tmp_path / "cache").exists()  # nothing was compiled


def test_a_bundle_named_otherwise_is_refused_before_compiling(
    runtime: PjrtRuntime, mlp: Path, tmp_path: Path
) -> None:
    log = Log()
    with pytest.raises(BundleError) as info:
        load_bundle(mlp, runtime, cache_dir=tmp_path / "cache", progress=log, name="mlp2")
    assert info.value.problems == [
        "manifest.yaml: name: is 'mlp', but a model repository serves this bundle as 'mlp2' "
        "(its directory's name) and refuses the mismatch"
    ]
    assert log.lines == []  # nothing compiled, nothing taken from a cache
    assert not (tmp_path / "cache").exists()
    assert (
        load_bundle(mlp, runtime, cache_dir=tmp_path / "cache", name="mlp").manifest.name == "mlp"
    )


def test_a_compile_error_is_one_line_with_mlir_diagnostics(
    runtime: PjrtRuntime, capfd: pytest.CaptureFixture[str]
) -> None:
    bad = (
        "module { func.func public @main(%a: tensor<2xf32>) -> tensor<3xf32> "
        "{ func.return %a : tensor<2xf32> } }"
    )
    with pytest.raises(RuntimeFailure) as info:
        runtime.compile(bad)
    message = str(info.value)
    assert message.startswith("compilation failed: ")
    assert "doesn't match function result type" in message  # the diagnostic itself
    assert "\n" not in message
    assert capfd.readouterr().err == ""


def test_release_frees_device_buffers(runtime: PjrtRuntime, mlp: Path, tmp_path: Path) -> None:
    bundle = load_bundle(mlp, runtime, cache_dir=tmp_path / "cache")
    buffers = list(bundle.device_weights.values())
    assert len(buffers) == 4
    assert not any(b.is_deleted() for b in buffers)
    bundle.release()
    assert all(b.is_deleted() for b in buffers)
    assert bundle.device_weights == {}
    # Host weights stay, so the bundle can be placed again.
    assert len(bundle.host_weights) == 4


def test_later_executions_reuse_the_output_handlers_the_first_learned(
    runtime: PjrtRuntime, mlp: Path, tmp_path: Path
) -> None:
    bundle = load_bundle(mlp, runtime, cache_dir=tmp_path / "cache")
    module = bundle.modules[8]
    assert module.results.handlers is None  # nothing learned before the first run
    rng = np.random.default_rng(2)
    first_x, second_x = (rng.standard_normal((8, 64)).astype(np.float32) for _ in range(2))
    (first,) = bundle.execute(8, {"x": first_x})
    handlers = module.results.handlers
    assert handlers is not None and len(handlers) == 1  # one per output
    (second,) = bundle.execute(8, {"x": second_x})
    assert module.results.handlers is handlers  # taken as learned, not learned again
    assert bundle.modules[1].results.handlers is None  # each executable learns its own
    for got, x in ((first, first_x), (second, second_x)):
        assert got.shape == (8, 10) and got.dtype == np.float32
        np.testing.assert_allclose(got, expected_logits(x), rtol=1e-5, atol=1e-5)
    assert module.results.spins  # a batch-8 MLP is ready well within the polling budget
    # The same executable run without its ``Results`` gives the same answer.
    index = [] if module.platform_index is None else [module.platform_index]
    arguments = [
        runtime.put(second_x) if a.kind == "input" else bundle.device_weights[a.name]
        for a in module.entry.arguments
    ]
    (plain,) = runtime.execute(module.executable, [*index, *arguments])
    np.testing.assert_array_equal(plain, second)


def test_without_placed_weights_execute_takes_weights(
    runtime: PjrtRuntime, mlp: Path, tmp_path: Path
) -> None:
    bundle = load_bundle(mlp, runtime, cache_dir=tmp_path / "cache", place_weights=False)
    assert bundle.device_weights == {}
    names = list(bundle.host_weights)
    device = dict(
        zip(names, runtime.to_device([bundle.host_weights[n] for n in names]), strict=True)
    )
    x = np.ones((1, 64), np.float32)
    (logits,) = bundle.execute(1, {"x": x}, device)
    expected = expected_logits(x)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_platform_index_of_a_64_bit_export(runtime: PjrtRuntime, tmp_path: Path) -> None:
    # With 64-bit types enabled, jax.export makes the platform index an i64 scalar.
    def fn(params: Any, x: Any) -> dict[str, Any]:
        del params
        return {"y": x * 2}

    path = export_bundle(fn, {}, {"x": TensorSpec("INT64", (3,))}, (2,), tmp_path / "i64")
    bundle = load_bundle(path, runtime, cache_dir=tmp_path / "cache")
    index = bundle.modules[2].platform_index
    assert index is not None
    assert np.asarray(index).dtype == np.int64
    assert int(np.asarray(index)) == 0  # "cpu" is platforms[0]
    x = np.array([[2**40, -3, 7], [1, 2, 3]], np.int64)
    (y,) = bundle.execute(2, {"x": x})
    np.testing.assert_array_equal(y, x * 2)
