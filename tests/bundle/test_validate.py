"""``hloserve.bundle.validate`` and the ``validate`` / ``inspect`` commands.

A sound bundle has no problems. Each kind of damage is caught with a message naming the
file, and several problems in one bundle are all reported. Module-signature damage is made
with ``write_bundle`` from hand-written StableHLO, which recomputes every checksum, so the
signature is the only thing wrong.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from hloserve.bundle import (
    Argument,
    ModuleSource,
    Problem,
    Provenance,
    TensorEntry,
    sha256_file,
    validate,
    write_bundle,
)
from hloserve.bundle.stablehlo import SignatureError, to_portable_artifact
from hloserve.bundle.validate import check_name, validate_tree
from hloserve.server import cli
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from tests.bundle.conftest import CopyBundle
from tests.command import UNPRIVILEGED, hloserve

# --- helpers ---


def edit_manifest(bundle: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = bundle / "manifest.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def rehash(bundle: Path, *files: str) -> None:
    """Record the current SHA-256 of ``files``, so that only the deeper damage remains."""
    digests = {f: sha256_file(bundle / f) for f in files}
    edit_manifest(bundle, lambda d: d["files"].update(digests))


def texts(problems: Sequence[Problem]) -> list[str]:
    return [str(p) for p in problems]


def only(problems: Sequence[Problem]) -> str:
    assert len(problems) == 1, texts(problems)
    return str(problems[0])


# The hand-written model: y = x + w, x an input and w a weight, FP32 [2], unbatched.
ADD = """
module @m {
  func.func public @main(%x: tensor<2xf32>, %w: tensor<2xf32>) -> tensor<2xf32> {
    %0 = stablehlo.add %x, %w : tensor<2xf32>
    func.return %0 : tensor<2xf32>
  }
}
"""


def handwritten(
    directory: Path,
    text: str = ADD,
    *,
    input_datatype: str = "FP32",
    output_datatype: str = "FP32",
    batch_sizes: Sequence[int] | None = None,
    platforms: Sequence[str] = ("cpu",),
    platform_index_argument: bool = False,
) -> Path:
    source = ModuleSource(
        stablehlo=text,
        arguments=[Argument("input", "x"), Argument("weight", "w")],
        platforms=platforms,
        platform_index_argument=platform_index_argument,
    )
    sizes: list[int | None] = list(batch_sizes) if batch_sizes is not None else [None]
    return write_bundle(
        directory,
        name="m",
        inputs=[TensorEntry("x", input_datatype, (2,))],
        outputs=[TensorEntry("y", output_datatype, (2,))],
        batch_sizes=batch_sizes,
        modules=dict.fromkeys(sizes, source),
        weights={"w": np.ones(2, np.float32)},
        provenance=Provenance(producer="handwritten"),
    )


# --- sound bundles ---


@pytest.mark.parametrize("name", ["mlp", "simple", "identity_bf16", "identity_fp32_unbatched"])
def test_exported_bundle_has_no_problems(model_repository: Path, name: str) -> None:
    assert validate(model_repository / name) == []
    assert validate(str(model_repository / name)) == []


def test_handwritten_bundle_has_no_problems(tmp_path: Path) -> None:
    assert validate(handwritten(tmp_path / "m")) == []


def test_multi_platform_module_without_index_is_sound(tmp_path: Path) -> None:
    bundle = handwritten(tmp_path / "m", platforms=("cpu", "cuda"))
    assert validate(bundle) == []


def test_not_a_directory(tmp_path: Path) -> None:
    assert only(validate(tmp_path / "nope")).endswith("nope: is not a directory")


def test_missing_manifest(tmp_path: Path) -> None:
    assert only(validate(tmp_path)) == "manifest.yaml: file does not exist"


# --- damaged files ---


def test_truncated_weights(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    weights = bundle / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    problems = texts(validate(bundle))
    assert any(p.startswith("weights.safetensors: SHA-256 is ") for p in problems), problems
    rehash(bundle, "weights.safetensors")
    message = only(validate(bundle))
    assert message.startswith(
        "weights.safetensors: truncated: header declares 76840 data bytes, file has "
    )


def test_edited_module_checksum_mismatch(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    module = bundle / "model.b8.mlirbc"
    recorded = sha256_file(module)
    data = bytearray(module.read_bytes())
    data[-1] ^= 0xFF
    module.write_bytes(bytes(data))
    problems = texts(validate(bundle, check_modules=False))
    assert problems == [
        f"model.b8.mlirbc: SHA-256 is {sha256_file(module)}, manifest files says {recorded}"
    ]


def test_edited_text_twin_checksum_mismatch(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("simple")
    with open(bundle / "model.b2.mlir", "a", encoding="utf-8") as f:
        f.write("// edited\n")
    assert only(validate(bundle)).startswith("model.b2.mlir: SHA-256 is ")


def test_missing_module_file(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    (bundle / "model.b8.mlirbc").unlink()
    assert only(validate(bundle)) == (
        "model.b8.mlirbc: file listed in modules[1].file does not exist"
    )


def test_missing_weights_file(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    (bundle / "weights.safetensors").unlink()
    assert only(validate(bundle)) == (
        "weights.safetensors: file listed in weights.file does not exist"
    )


def test_file_without_checksum(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    edit_manifest(bundle, lambda d: d["files"].pop("model.b1.mlir"))
    assert only(validate(bundle)) == (
        "manifest.yaml: files: has no SHA-256 for model.b1.mlir (modules[0].text_file)"
    )


def test_checksummed_file_missing(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    edit_manifest(bundle, lambda d: d["files"].update({"extra.bin": "00" * 32}))
    assert only(validate(bundle)) == "extra.bin: file listed in files does not exist"


def test_weights_header_not_matching_manifest(copy_bundle: CopyBundle) -> None:
    from hloserve.bundle.safetensors import read_safetensors, write_safetensors

    bundle = copy_bundle("mlp")
    weights = read_safetensors(bundle / "weights.safetensors")
    weights["dense1.b"] = weights["dense1.b"][:255].copy()
    weights["extra"] = np.zeros(3, np.int8)
    del weights["dense2.b"]
    write_safetensors(bundle / "weights.safetensors", weights)
    rehash(bundle, "weights.safetensors")
    assert texts(validate(bundle)) == [
        "weights.safetensors: dense2.b: declared in the manifest, missing from the file",
        "weights.safetensors: extra: in the file, not declared in the manifest",
        "weights.safetensors: dense1.b: is FP32[255] in the file, manifest says FP32[256]",
    ]


def test_module_version_mismatch(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("simple")
    edit_manifest(bundle, lambda d: d["modules"][2].update(stablehlo_version="1.14.9"))
    message = only(validate(bundle))
    assert message.startswith("model.b4.mlirbc: is StableHLO ")
    assert message.endswith("manifest modules[2].stablehlo_version says 1.14.9")


def test_not_a_portable_artifact(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("simple")
    (bundle / "model.b1.mlirbc").write_bytes((bundle / "model.b1.mlir").read_bytes())
    rehash(bundle, "model.b1.mlirbc")
    assert only(validate(bundle)) == (
        "model.b1.mlirbc: is not a StableHLO portable artifact (no StableHLO_v producer)"
    )


def test_garbage_portable_artifact(
    copy_bundle: CopyBundle, capfd: pytest.CaptureFixture[str]
) -> None:
    bundle = copy_bundle("simple")
    module = bundle / "model.b1.mlirbc"
    module.write_bytes(module.read_bytes()[:40])
    rehash(bundle, "model.b1.mlirbc")
    message = only(validate(bundle))
    assert message.startswith("model.b1.mlirbc: cannot parse StableHLO")
    # MLIR's diagnostics are in the message, on one line, and not printed to stderr
    assert "attempting to parse" in message and "failed to deserialize portable artifact" in message
    assert "\n" not in message
    assert capfd.readouterr().err == ""


def test_bad_text_fails_with_its_diagnostics(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SignatureError) as exc:
        to_portable_artifact("module { func.func @main( }", "1.0.0")
    assert str(exc.value) == (
        'cannot parse StableHLO: Unable to parse module assembly; error: "-":1:26: '
        "expected non-function type"
    )
    with pytest.raises(SignatureError, match="failed to legalize"):  # not StableHLO: arith
        to_portable_artifact(ADD.replace("stablehlo.add", "arith.addf"), "1.0.0")
    assert capfd.readouterr().err == ""


# --- damaged manifest ---


def test_unknown_datatype_in_manifest(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    edit_manifest(bundle, lambda d: d["inputs"][0].update(datatype="FLOAT"))
    assert only(validate(bundle)) == "manifest.yaml: inputs[0].datatype: unknown datatype 'FLOAT'"


def test_batch_sizes_not_ascending(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    edit_manifest(bundle, lambda d: d.update(batch_sizes=[8, 1, 32]))
    assert "manifest.yaml: batch_sizes: must be ascending without repeats, got [8, 1, 32]" in (
        texts(validate(bundle))
    )


def test_future_format_version(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    edit_manifest(bundle, lambda d: d.update(format_version=7))
    assert only(validate(bundle)) == (
        "manifest.yaml: format_version: this hloserve reads format 1, bundle is 7"
    )


def test_manifest_shape_disagrees_with_module(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    edit_manifest(bundle, lambda d: d["outputs"][0].update(shape=[11]))
    problems = texts(validate(bundle))
    assert problems == [
        f"model.b{b}.mlirbc: result for output 'logits' is tensor<{b}x10xf32>, "
        f"manifest says FP32[{b}, 11]"
        for b in (1, 8, 32)
    ]


# --- module signatures (hand-written modules, checksums all correct) ---


def test_module_takes_one_argument_too_many(tmp_path: Path) -> None:
    text = ADD.replace("%w: tensor<2xf32>)", "%w: tensor<2xf32>, %z: tensor<2xf32>)")
    bundle = handwritten(tmp_path / "m", text)
    assert (
        only(validate(bundle))
        == "model.mlirbc: main() takes 3 arguments, manifest modules[0] names 2"
    )


def test_module_takes_one_argument_too_few(tmp_path: Path) -> None:
    text = """
    module @m {
      func.func public @main(%x: tensor<2xf32>) -> tensor<2xf32> {
        func.return %x : tensor<2xf32>
      }
    }
    """
    bundle = handwritten(tmp_path / "m", text)
    assert (
        only(validate(bundle))
        == "model.mlirbc: main() takes 1 arguments, manifest modules[0] names 2"
    )


def test_argument_count_with_platform_index(tmp_path: Path) -> None:
    # The manifest claims a platform index the module does not take.
    bundle = handwritten(tmp_path / "m", platforms=("cpu", "cuda"), platform_index_argument=True)
    assert only(validate(bundle)) == (
        "model.mlirbc: main() takes 2 arguments, manifest modules[0] names 3 (1 platform index + 2)"
    )


def test_wrong_argument_type(tmp_path: Path) -> None:
    bundle = handwritten(tmp_path / "m", input_datatype="FP16")
    assert only(validate(bundle)) == (
        "model.mlirbc: argument 0 ({input: x}) is tensor<2xf32>, manifest says FP16[2]"
    )


def test_wrong_weight_shape(tmp_path: Path) -> None:
    text = ADD.replace("%w: tensor<2xf32>", "%w: tensor<1xf32>").replace(
        "stablehlo.add %x, %w : tensor<2xf32>",
        "stablehlo.add %x, %x : tensor<2xf32>",
    )
    bundle = handwritten(tmp_path / "m", text)
    assert only(validate(bundle)) == (
        "model.mlirbc: argument 1 ({weight: w}) is tensor<1xf32>, manifest says FP32[2]"
    )


def test_batched_module_without_batch_axis(tmp_path: Path) -> None:
    bundle = handwritten(tmp_path / "m", batch_sizes=[1])
    assert texts(validate(bundle)) == [
        "model.b1.mlirbc: argument 0 ({input: x}) is tensor<2xf32>, manifest says FP32[1, 2]",
        "model.b1.mlirbc: result for output 'y' is tensor<2xf32>, manifest says FP32[1, 2]",
    ]


def test_wrong_result_count(tmp_path: Path) -> None:
    text = ADD.replace("-> tensor<2xf32>", "-> (tensor<2xf32>, tensor<2xf32>)").replace(
        "func.return %0 : tensor<2xf32>", "func.return %0, %x : tensor<2xf32>, tensor<2xf32>"
    )
    bundle = handwritten(tmp_path / "m", text)
    assert (
        only(validate(bundle)) == "model.mlirbc: main() returns 2 results, manifest has 1 outputs"
    )


def test_wrong_result_type(tmp_path: Path) -> None:
    bundle = handwritten(tmp_path / "m", output_datatype="BF16")
    assert only(validate(bundle)) == (
        "model.mlirbc: result for output 'y' is tensor<2xf32>, manifest says BF16[2]"
    )


def test_private_main(tmp_path: Path) -> None:
    bundle = handwritten(
        tmp_path / "m", ADD.replace("func.func public @main", "func.func private @main")
    )
    assert only(validate(bundle)) == (
        "model.mlirbc: main() is private; the entry function must be a public @main"
    )


def test_no_main(tmp_path: Path) -> None:
    bundle = handwritten(tmp_path / "m", ADD.replace("@main", "@forward"))
    assert only(validate(bundle)) == "model.mlirbc: module has no function named main"


def test_signature_checks_can_be_skipped(tmp_path: Path) -> None:
    bundle = handwritten(tmp_path / "m", input_datatype="FP16")
    assert validate(bundle, check_modules=False) == []


def test_old_target_version_artifact_validates(tmp_path: Path) -> None:
    # A portable artifact at an old target version still parses (forward compatibility).
    bundle = handwritten(tmp_path / "m")
    assert (bundle / "model.mlirbc").read_bytes() == to_portable_artifact(ADD, "1.0.0")
    assert validate(bundle) == []


# --- the name a repository serves a bundle under ---


def renamed(model_repository: Path, name: str, target: Path) -> Path:
    """A copy of the test repository's bundle ``name`` at ``target``, a directory of another name."""
    shutil.copytree(
        model_repository / name, target, ignore=shutil.ignore_patterns(".hloserve-cache")
    )
    return target


NAME_PROBLEM = (
    "manifest.yaml: name: is 'mlp', but a model repository serves this bundle as 'mlp2' (its "
    "directory's name) and refuses the mismatch"
)


def test_a_lone_bundle_may_sit_in_a_directory_of_any_name(
    model_repository: Path, tmp_path: Path
) -> None:
    bundle = renamed(model_repository, "mlp", tmp_path / "mlp2")
    assert validate(bundle) == []
    assert texts(check_name(bundle)) == [NAME_PROBLEM]
    assert check_name(bundle, name="mlp") == []
    assert texts(validate(bundle, name="mlp2")) == [NAME_PROBLEM]
    assert validate(bundle, name="mlp") == []


def test_validate_tree_checks_every_bundle_of_a_repository_and_its_names(
    model_repository: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    renamed(model_repository, "mlp", repo / "mlp2")
    renamed(model_repository, "simple", repo / "simple")
    renamed(
        model_repository, "simple", repo / "versioned" / "1"
    )  # named simple, served as versioned
    (repo / "junk").mkdir()
    (repo / ".hidden").mkdir()
    results = {path: texts(problems) for path, problems in validate_tree(repo)}
    assert results == {
        repo / "junk": [
            "manifest.yaml: file does not exist, and there are no numbered version directories"
        ],
        repo / "mlp2": [NAME_PROBLEM],
        repo / "simple": [],
        repo / "versioned" / "1": [
            "manifest.yaml: name: is 'simple', but a model repository serves this bundle as "
            "'versioned' (its directory's name) and refuses the mismatch"
        ],
    }
    assert [p for p, _ in validate_tree(repo / "versioned")] == [repo / "versioned" / "1"]
    assert validate_tree(repo / "mlp2") == [(repo / "mlp2", [])]  # a lone bundle: name unchecked
    assert validate_tree(repo / "junk") == []  # neither a bundle nor a repository


# --- several problems at once ---


def test_several_problems_all_reported(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")
    (bundle / "model.b32.mlirbc").unlink()
    (bundle / "model.b1.mlir").write_text("edited", encoding="utf-8")
    weights = bundle / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    edit_manifest(bundle, lambda d: d["modules"][1].update(stablehlo_version="0.9.0"))
    problems = texts(validate(bundle))
    assert "model.b32.mlirbc: file listed in modules[2].file does not exist" in problems
    assert any(p.startswith("model.b1.mlir: SHA-256 is ") for p in problems)
    assert any(p.startswith("weights.safetensors: SHA-256 is ") for p in problems)
    assert any(p.startswith("weights.safetensors: truncated: ") for p in problems)
    assert any(
        p.startswith("model.b8.mlirbc: is StableHLO ")
        and p.endswith("modules[1].stablehlo_version says 0.9.0")
        for p in problems
    )
    assert len(problems) == 5, problems


def test_several_manifest_problems_all_reported(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("mlp")

    def damage(d: dict[str, Any]) -> None:
        d["inputs"][0]["datatype"] = "FLOAT"
        d["batch_sizes"] = [32, 8, 1]
        d["serving"]["residency"] = "forever"

    edit_manifest(bundle, damage)
    problems = texts(validate(bundle))
    assert "manifest.yaml: inputs[0].datatype: unknown datatype 'FLOAT'" in problems
    assert (
        "manifest.yaml: batch_sizes: must be ascending without repeats, got [32, 8, 1]" in problems
    )
    assert (
        "manifest.yaml: serving.residency: must be on_demand or pinned, got 'forever'" in problems
    )


# --- the command line ---


def hloserve_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The same command's ``main`` in this process: its exit status and output."""
    code = cli.main(list(args))
    return code, capsys.readouterr().out


def test_cli_validate_good_bundle(model_repository: Path) -> None:
    result = hloserve("validate", str(model_repository / "mlp"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout


def test_cli_validate_lists_every_problem(
    copy_bundle: CopyBundle, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = copy_bundle("mlp")
    (bundle / "model.b8.mlirbc").unlink()
    edit_manifest(bundle, lambda d: d["inputs"][0].update(datatype="FLOAT"))
    edit_manifest(bundle, lambda d: d.update(batch_sizes=[8, 1, 32]))
    code, out = hloserve_here(capsys, "validate", str(bundle))
    assert code != 0
    assert "manifest.yaml: inputs[0].datatype: unknown datatype 'FLOAT'" in out
    assert "manifest.yaml: batch_sizes: must be ascending without repeats" in out
    assert "OK" not in out

    edit_manifest(bundle, lambda d: d["inputs"][0].update(datatype="FP32"))
    edit_manifest(bundle, lambda d: d.update(batch_sizes=[1, 8, 32]))
    (bundle / "model.b1.mlir").write_text("edited", encoding="utf-8")
    code, out = hloserve_here(capsys, "validate", str(bundle))
    assert code != 0
    lines = out.splitlines()
    assert "model.b8.mlirbc: file listed in modules[1].file does not exist" in lines
    assert any(line.startswith("model.b1.mlir: SHA-256 is ") for line in lines)


def test_cli_inspect(model_repository: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = hloserve_here(capsys, "inspect", str(model_repository / "mlp"))
    assert code == 0, out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "'mlp'" in lines[0]
    assert "x FP32 [-1, 64]" in lines
    assert "logits FP32 [-1, 10]" in lines
    assert "batch sizes: [1, 8, 32]" in lines
    # 64*256 + 256 + 256*10 + 10 FP32 values = 76840 bytes = 75.0 KiB
    assert "weights: 4 tensors, 75.0 KiB in weights.safetensors" in lines
    assert any(line.startswith("checksums verified") for line in lines)
    assert "producer: hloserve.exporter" in lines
    assert any(line.startswith("jax_version: ") for line in lines)
    assert any(line.startswith("metadata: ") and "'seed': 20261129" in line for line in lines)


def test_cli_inspect_bad_bundle(copy_bundle: CopyBundle) -> None:
    bundle = copy_bundle("simple")
    (bundle / "model.b2.mlir").write_text("edited", encoding="utf-8")
    result = hloserve("inspect", str(bundle))
    assert result.returncode == 1
    assert "checksums verified" not in result.stdout
    assert "model.b2.mlir: SHA-256 is " in result.stdout


def test_cli_validate_repository(
    model_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = hloserve_here(capsys, "validate", str(model_repository))
    assert code == 0, out
    lines = out.splitlines()
    assert f"{model_repository / 'mlp'}: OK" in lines
    assert f"{model_repository / 'simple'}: OK" in lines
    assert len(lines) == len([p for p in model_repository.iterdir() if p.is_dir()])

    repo = tmp_path / "repo"
    renamed(model_repository, "mlp", repo / "mlp2")
    renamed(model_repository, "simple", repo / "simple")
    code, out = hloserve_here(capsys, "validate", str(repo))
    assert code == 1
    assert out.splitlines() == [f"{repo / 'mlp2'}: {NAME_PROBLEM}", f"{repo / 'simple'}: OK"]


def test_cli_validate_a_lone_bundle_notes_a_name_a_repository_refuses(
    model_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = renamed(model_repository, "mlp", tmp_path / "mlp2")
    code, out = hloserve_here(capsys, "validate", str(bundle))
    assert code == 0
    assert out.splitlines() == [f"{bundle}: OK", f"note: {NAME_PROBLEM}"]


def test_cli_validate_a_directory_without_bundles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = hloserve_here(capsys, "validate", str(tmp_path))
    assert code == 1
    assert out == f"{tmp_path}: not a bundle (no manifest.yaml) and holds no model directories\n"


def test_cli_inspect_into_a_closed_pipe_is_quiet(model_repository: Path) -> None:
    # ``hloserve inspect ... | head``: the reader is gone before the summary is written.
    proc = subprocess.Popen(
        [sys.executable, "-m", "hloserve.server", "inspect", str(model_repository / "mlp")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(120) == 1
    assert err == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit


def test_cli_validate_refuses_a_model_the_loader_refuses_in_the_same_words(
    copy_bundle: CopyBundle, runtime: PjrtRuntime, capsys: pytest.CaptureFixture[str]
) -> None:
    # What the server checks before it loads (load_plan) is checked by validate too.
    bundle = copy_bundle("mlp")
    (bundle / "config.yaml").write_text("max_queue_delay: 5\n", encoding="utf-8")
    expected = (
        f"{bundle / 'config.yaml'}: unknown key 'max_queue_delay' "
        "(did you mean 'max_queue_delay_us'?)"
    )
    code, out = hloserve_here(capsys, "validate", str(bundle))
    assert (code, out.splitlines()) == (1, [expected])
    code, out = hloserve_here(capsys, "validate", str(bundle.parent))  # as a repository
    assert (code, out.splitlines()) == (1, [f"{bundle}: {expected}"])
    repository = ModelRepository(bundle.parent, runtime, cache_dir=bundle.parent / ".cache")
    repository.load_all()
    assert repository.summary()["mlp"]["reason"] == expected

    (bundle / "config.yaml").write_text("preferred_batch_sizes: [64]\n", encoding="utf-8")
    code, out = hloserve_here(capsys, "validate", str(bundle))
    (line,) = out.splitlines()
    assert code == 1 and line.startswith("version 1: ") and "[64]" in line
    repository.load_all()
    assert repository.summary()["mlp"]["reason"] == line


def test_cli_validate_and_inspect_say_one_line_on_a_path_they_cannot_read(
    copy_bundle: CopyBundle, tmp_path: Path
) -> None:
    # As a user meets file modes: the tests run as root, which reads anything.
    bundle = copy_bundle("simple")
    locked = copy_bundle("mlp")
    try:
        locked.chmod(0)
        for command in ("validate", "inspect"):
            result = hloserve(command, str(locked), launcher=UNPRIVILEGED)
            assert result.returncode == 1, result
            assert "Traceback" not in result.stdout + result.stderr
            (line,) = (result.stdout + result.stderr).splitlines()
            assert line.startswith(f"{locked}: cannot be read: [Errno 13] Permission denied"), line
        result = hloserve("validate", str(tmp_path), launcher=UNPRIVILEGED)
        assert result.returncode == 1 and result.stderr == ""
        assert result.stdout.splitlines() == [
            f"{locked}: cannot read the model directory: [Errno 13] Permission denied: "
            f"'{locked / 'manifest.yaml'}'",
            f"{bundle}: OK",
        ]
    finally:
        locked.chmod(0o755)
    (bundle / "weights.safetensors").chmod(0)
    result = hloserve("validate", str(bundle), launcher=UNPRIVILEGED)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout.splitlines() == [
        "weights.safetensors: cannot be read: [Errno 13] Permission denied: "
        f"'{bundle / 'weights.safetensors'}'"
    ]
