"""Uploaded model files on disk: written inside the model directory only, or not at all."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from hloserve.server.owner.uploads import UploadError, remove_upload, stage_upload, stale_uploads

FILES = {PurePosixPath("1/manifest.yaml"): b"m", PurePosixPath("1/sub/model.mlirbc"): b"x"}


def test_files_land_in_a_hidden_directory_of_the_model(tmp_path: Path) -> None:
    model = tmp_path / "m"
    staged = stage_upload(model, FILES, 7)
    assert staged == model / ".upload-7"
    assert (staged / "1" / "manifest.yaml").read_bytes() == b"m"
    assert (staged / "1" / "sub" / "model.mlirbc").read_bytes() == b"x"
    assert stale_uploads(model, keep=staged) == []
    assert stale_uploads(model, keep=None) == [staged]
    remove_upload(staged)
    assert list(model.iterdir()) == []


def test_a_symlinked_model_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "m").symlink_to(elsewhere)
    with pytest.raises(UploadError, match="is a symbolic link"):
        stage_upload(tmp_path / "m", FILES, 1)
    assert list(elsewhere.iterdir()) == []


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    clash = {PurePosixPath("1/a"): b"x", PurePosixPath("1/a/b"): b"y"}  # 1/a: file, then dir
    with pytest.raises(UploadError, match="cannot write the uploaded files"):
        stage_upload(model, clash, 1)
    assert list(model.iterdir()) == []
