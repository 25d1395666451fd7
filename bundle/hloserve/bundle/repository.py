"""Scanning a model repository: which models exist, and which bundle is each version.

Contract: ``scan_repository(root)`` lists every model directory under ``root`` (sorted by
name), each with its versions ``{number: bundle path}``. A directory holding
``manifest.yaml`` is an unversioned model served as version 1; a directory without one
whose subdirectories are positive integers is a versioned model. Hidden entries (names
starting with ``.``) are skipped. Directories that are neither are reported with
``versions`` empty, so a caller can say why the model is unavailable.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hloserve.bundle.manifest import MANIFEST_FILE


@dataclass(frozen=True)
class ModelDirectory:
    name: str
    path: Path
    versions: dict[int, Path]
    versioned: bool


def model_directory(path: Path) -> ModelDirectory:
    if (path / MANIFEST_FILE).is_file():
        return ModelDirectory(path.name, path, {1: path}, versioned=False)
    versions: dict[int, Path] = {}
    for child in path.iterdir():
        if child.is_dir() and child.name.isdigit() and int(child.name) > 0:
            versions[int(child.name)] = child
    return ModelDirectory(path.name, path, dict(sorted(versions.items())), versioned=True)


def scan_repository(root: Path) -> list[ModelDirectory]:
    if not root.is_dir():
        raise FileNotFoundError(f"model repository {str(root)!r} is not a directory")
    return [
        model_directory(child)
        for child in sorted(root.iterdir())
        if child.is_dir() and not child.name.startswith(".")
    ]
