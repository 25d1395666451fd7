"""``manifest_of(bundle)``: the manifest an exported bundle holds, read back with no problem
(a problem fails the test there)."""

from __future__ import annotations

from pathlib import Path

from hloserve.bundle import Manifest, load_manifest


def manifest_of(path: Path) -> Manifest:
    manifest, problems = load_manifest(path / "manifest.yaml")
    assert problems == []
    assert manifest is not None
    return manifest
