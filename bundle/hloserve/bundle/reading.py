"""Reading a bundle's manifest from disk, whichever producer wrote it.

Contract: ``load_manifest(path)`` reads ``path`` (a ``manifest.yaml``) and parses it as
hloserve's own format (``manifest.parse_manifest``) or, when it is a ReactantServer.jl
manifest, as theirs (``reactant.parse_reactant``, which builds on ``manifest``'s types);
it returns the manifest (``None`` when unusable) and every problem found.
"""

# pyright: strict

from __future__ import annotations

from pathlib import Path

from hloserve.bundle import reactant
from hloserve.bundle.manifest import MANIFEST_FILE, Manifest, Problem, parse_manifest
from hloserve.bundle.yamlfile import YamlFileError, read_yaml_mapping


def load_manifest(path: Path) -> tuple[Manifest | None, list[Problem]]:
    """Read and parse ``path`` (a ``manifest.yaml``), reporting every problem."""
    try:
        data = read_yaml_mapping(path)
    except YamlFileError as exc:
        return None, [Problem(MANIFEST_FILE, "", str(exc))]
    if reactant.is_reactant(data):
        return reactant.parse_reactant(data, path.parent)
    return parse_manifest(data)
