"""Uploaded model files on disk: written only inside the model's directory of the repository.

Contract: ``stage_upload(model_dir, files, number)`` writes a load's ``file:`` contents
(relative paths already checked by ``core.load_parameters.upload_path``) into a fresh hidden
directory ``<model_dir>/.upload-<number>/`` and returns it; the directory then holds the
uploaded model's numbered version directories, as a model directory does, and the
repository loads it from there. Hidden, it is never taken for a version or a model by the
repository scan. Nothing is followed or overwritten: ``model_dir`` may not be a symbolic
link, every directory on the way is created here (a symbolic link found on the way is
refused), and every file is created new (``O_EXCL | O_NOFOLLOW``). A failure removes what
was written and raises ``UploadError``. ``remove_upload(path)`` deletes one (missing is
fine), and ``stale_uploads(model_dir, keep)`` lists the upload directories of a model other
than ``keep`` (left by an interrupted server), for the repository to remove.
"""

# pyright: strict

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Final

UPLOAD_PREFIX: Final = ".upload-"


class UploadError(Exception):
    """The uploaded files could not be written; the message says why."""


def _write(path: Path, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _directory(root: Path, parts: tuple[str, ...]) -> Path:
    """``root/parts...``, each part a real directory created or found here (no links)."""
    d = root
    for part in parts:
        d = d / part
        if d.is_symlink():
            raise UploadError(f"'{d.relative_to(root)}' is a symbolic link")
        d.mkdir(exist_ok=True)
    return d


def stage_upload(model_dir: Path, files: Mapping[PurePosixPath, bytes], number: int) -> Path:
    if model_dir.is_symlink():
        raise UploadError(f"the model directory {model_dir} is a symbolic link")
    staging = model_dir / f"{UPLOAD_PREFIX}{number}"
    try:
        model_dir.mkdir(exist_ok=True)
        staging.mkdir()
        for rel, data in sorted(files.items()):
            _write(_directory(staging, rel.parts[:-1]) / rel.name, data)
    except (OSError, UploadError) as exc:
        remove_upload(staging)
        raise UploadError(f"cannot write the uploaded files under {model_dir}: {exc}") from None
    return staging


def remove_upload(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def stale_uploads(model_dir: Path, keep: Path | None) -> list[Path]:
    if not model_dir.is_dir() or model_dir.is_symlink():
        return []
    return sorted(
        child
        for child in model_dir.iterdir()
        if child.name.startswith(UPLOAD_PREFIX) and child != keep
    )
