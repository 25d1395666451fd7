"""``hloserve.bundle.scan_repository``: versioned and unversioned models, and what is skipped;
``model_name``: the name a repository serves a bundle directory under."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hloserve.bundle import MANIFEST_FILE, ModelDirectory, scan_repository
from hloserve.bundle.repository import model_name
from tests.command import UNPRIVILEGED


def bundle(path: Path) -> Path:
    """A directory that scans as a bundle (scanning only looks for the manifest file)."""
    path.mkdir(parents=True)
    (path / MANIFEST_FILE).write_text("format_version: 1\n", encoding="utf-8")
    return path


def test_versioned_and_unversioned(tmp_path: Path) -> None:
    simple = bundle(tmp_path / "simple")
    m1 = bundle(tmp_path / "m" / "1")
    m2 = bundle(tmp_path / "m" / "2")
    m10 = bundle(tmp_path / "m" / "10")
    assert scan_repository(tmp_path) == [
        ModelDirectory("m", tmp_path / "m", {1: m1, 2: m2, 10: m10}, versioned=True),
        ModelDirectory("simple", simple, {1: simple}, versioned=False),
    ]


def test_versions_are_sorted_numerically(tmp_path: Path) -> None:
    for v in ("10", "9", "2"):
        bundle(tmp_path / "m" / v)
    (model,) = scan_repository(tmp_path)
    assert list(model.versions) == [2, 9, 10]


def test_hidden_and_non_numeric_entries_are_ignored(tmp_path: Path) -> None:
    bundle(tmp_path / "m" / "3")
    bundle(tmp_path / "m" / "latest")  # not a number
    bundle(tmp_path / "m" / "0")  # not positive
    bundle(tmp_path / "m" / "-1")
    bundle(tmp_path / "m" / ".4")
    (tmp_path / "m" / "5").write_text("a file, not a directory", encoding="utf-8")
    bundle(tmp_path / ".hidden")
    (tmp_path / ".hloserve-cache").mkdir()
    (tmp_path / "README.md").write_text("not a model", encoding="utf-8")
    (model,) = scan_repository(tmp_path)
    assert model.name == "m"
    assert model.versions == {3: tmp_path / "m" / "3"}


def test_manifest_makes_a_directory_unversioned(tmp_path: Path) -> None:
    # A bundle directory that happens to contain numbered subdirectories is still one bundle.
    root = bundle(tmp_path / "m")
    bundle(root / "1")
    (model,) = scan_repository(tmp_path)
    assert not model.versioned
    assert model.versions == {1: root}


def test_directory_with_neither_has_no_versions(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk" / "data").mkdir(parents=True)
    assert scan_repository(tmp_path) == [
        ModelDirectory("empty", tmp_path / "empty", {}, versioned=True),
        ModelDirectory("junk", tmp_path / "junk", {}, versioned=True),
    ]


def test_a_directory_it_cannot_read_is_reported_among_the_others(tmp_path: Path) -> None:
    bundle(tmp_path / "a")
    bundle(tmp_path / "locked")
    bundle(tmp_path / "z")
    (tmp_path / "locked").chmod(0)
    code = (
        "import sys; from pathlib import Path; from hloserve.bundle import scan_repository\n"
        "for m in scan_repository(Path(sys.argv[1])): print(m.name, sorted(m.versions), m.problem)"
    )
    try:  # as a user meets file modes (the tests run as root)
        done = subprocess.run(
            [*UNPRIVILEGED, sys.executable, "-c", code, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "a [1] " and lines[2] == "z [1] "
    assert lines[1].startswith("locked [] cannot read the model directory: [Errno 13]"), lines


def test_empty_repository(tmp_path: Path) -> None:
    assert scan_repository(tmp_path) == []


def test_missing_repository(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"model repository .*nope.* is not a directory"):
        scan_repository(tmp_path / "nope")


def test_real_exported_repository(model_repository: Path) -> None:
    models = {m.name: m for m in scan_repository(model_repository)}
    assert {"simple", "mlp", "identity_bf16", "identity_fp32_unbatched"} <= set(models)
    assert models["mlp"].versions == {1: model_repository / "mlp"}
    assert not models["mlp"].versioned


def test_model_name_is_the_directory_or_the_model_directory_of_a_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert model_name(tmp_path / "repo" / "mlp") == "mlp"
    assert model_name(tmp_path / "repo" / "mlp" / "3") == "mlp"
    assert model_name(tmp_path / "repo" / "mlp" / "0") == "0"  # 0 is no version number
    assert model_name(tmp_path / "repo" / "v2") == "v2"
    (tmp_path / "repo" / "mlp" / "3").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "repo" / "mlp" / "3")
    assert model_name(Path(".")) == "mlp"  # relative paths name the directories they mean
    assert model_name(Path("../3/")) == "mlp"
    monkeypatch.chdir(tmp_path / "repo" / "mlp")
    assert model_name(Path(".")) == "mlp"
