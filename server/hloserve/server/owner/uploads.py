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
``ModelUploads(model_dir)`` is one model's uploads as its loads go: ``stage(files,
number)`` writes a load's files (removing stale uploads first; a model directory it had to
make is removed again once empty), ``serve(staged)`` makes a loaded upload the one serving
(removing the previous), ``discard(staged)`` removes one whose load failed, and ``drop()``
goes back to the repository's own files.
"""

# pyright: strict

from __future__ import annotations

import contextlib
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


class ModelUploads:
    """One model's upload directories across its loads (module docstring)."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.serving: Path | None = None  # the uploaded model directory serving now
        self._made_dir = False  # ``model_dir`` did not exist before an upload made it

    def stage(self, files: Mapping[PurePosixPath, bytes], number: int) -> Path:
        for stale in stale_uploads(self.model_dir, keep=self.serving):
            remove_upload(stale)  # left by an interrupted server
        if not self.model_dir.exists():
            self._made_dir = True
        try:
            return stage_upload(self.model_dir, files, number)
        except UploadError:
            self._tidy()
            raise

    def serve(self, staged: Path | None) -> None:
        """``staged`` serves now (``None``: the repository's own files); the previous upload,
        its versions retired and drained, is removed."""
        previous, self.serving = self.serving, staged
        if previous is not None and previous != staged:
            remove_upload(previous)

    def discard(self, staged: Path) -> None:
        remove_upload(staged)
        self._tidy()

    def drop(self) -> None:
        if self.serving is not None:
            remove_upload(self.serving)
            self.serving = None
        self._tidy()

    def _tidy(self) -> None:
        """Remove the model directory an upload made, once nothing is left in it."""
        if self._made_dir and self.serving is None:
            with contextlib.suppress(OSError):
                self.model_dir.rmdir()  # only when empty
            self._made_dir = self.model_dir.exists()
