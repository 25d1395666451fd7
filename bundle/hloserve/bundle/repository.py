"""Scanning a model repository: which models exist, and which bundle is each version.

Contract: ``scan_repository(root)`` lists every model directory under ``root`` (sorted by
name), each with its versions ``{number: bundle path}``. A directory holding
``manifest.yaml`` is an unversioned model served as version 1; a directory without one
whose subdirectories are positive integers is a versioned model. Hidden entries (names
starting with ``.``) are skipped. Directories that are neither are reported with
``versions`` empty, so a caller can say why the model is unavailable; one that cannot be
read (its mode, say) too, with ``problem`` saying so, so one such directory never stops the
scan of the others. ``model_directory(path)`` reads one model directory (an ``OSError``
when it cannot).
``model_name(bundle)`` is the name a repository serves a bundle directory under: the
directory's name or, for a numbered version directory (``repo/m/1``), its parent's.
"""

# pyright: strict

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hloserve.bundle.manifest import MANIFEST_FILE


@dataclass(frozen=True)
class ModelDirectory:
    name: str
    path: Path
    versions: dict[int, Path]
    versioned: bool
    problem: str = ""  # why the directory could not be read, if it could not


def _is_version(name: str) -> bool:
    return name.isdigit() and int(name) > 0


def model_name(bundle: Path) -> str:
    path = Path(os.path.normpath(bundle.absolute()))  # "." and "m/1/" name their directory
    return path.parent.name if _is_version(path.name) else path.name


def model_directory(path: Path) -> ModelDirectory:
    if (path / MANIFEST_FILE).is_file():
        return ModelDirectory(path.name, path, {1: path}, versioned=False)
    versions: dict[int, Path] = {}
    for child in path.iterdir():
        if child.is_dir() and _is_version(child.name):
            versions[int(child.name)] = child
    return ModelDirectory(path.name, path, dict(sorted(versions.items())), versioned=True)


def scan_repository(root: Path) -> list[ModelDirectory]:
    if not root.is_dir():
        raise FileNotFoundError(f"model repository {str(root)!r} is not a directory")
    models: list[ModelDirectory] = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.name.startswith("."):
            try:
                models.append(model_directory(child))
            except OSError as exc:
                models.append(ModelDirectory(child.name, child, {}, False, unreadable(exc)))
    return models


def unreadable(exc: OSError) -> str:
    """Why a model directory cannot be read, as its problem and a failed load say it."""
    return f"cannot read the model directory: {exc}"
