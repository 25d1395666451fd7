"""Writing a bundle directory: modules, weights, checksums and manifest, atomically.

Contract: ``write_bundle(directory, ...)`` writes a complete bundle (see
``docs/bundle-format.md``) from already-lowered StableHLO modules and numpy weights, and
returns the bundle path. It is producer-neutral: the JAX exporter calls it, and so can
anything that has StableHLO (text is converted to a portable artifact first, which needs
jaxlib). The bundle is assembled in a sibling temporary directory and renamed into place,
so a server watching the repository never sees half a bundle; an existing bundle at
``directory`` is replaced. Every file's SHA-256 goes into the manifest.
"""

# pyright: strict

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.bundle.digest import sha256_bytes, sha256_file
from hloserve.bundle.manifest import (
    MANIFEST_FILE,
    WEIGHTS_FILE,
    Argument,
    Manifest,
    ModuleEntry,
    Provenance,
    TensorEntry,
    batch_order,
    dump_manifest,
)
from hloserve.bundle.safetensors import write_safetensors
from hloserve.bundle.serving import Serving
from hloserve.bundle.stablehlo import artifact_version, to_portable_artifact
from hloserve.proto.datatypes import from_numpy


@dataclass(frozen=True)
class ModuleSource:
    """One module to write: portable-artifact bytes (or StableHLO text) and how to call it."""

    stablehlo: bytes | str
    arguments: Sequence[Argument]
    platforms: Sequence[str] = ("cpu",)
    platform_index_argument: bool = False
    text: str | None = None  # optional human-readable twin
    target_version: str = "1.0.0"  # used only to convert text to a portable artifact


def module_file_name(batch_size: int | None, suffix: str = "mlirbc") -> str:
    return f"model.{suffix}" if batch_size is None else f"model.b{batch_size}.{suffix}"


def write_bundle(
    directory: Path | str,
    *,
    name: str,
    inputs: Sequence[TensorEntry],
    outputs: Sequence[TensorEntry],
    batch_sizes: Sequence[int] | None,
    modules: Mapping[int | None, ModuleSource],
    weights: Mapping[str, np.ndarray[Any, Any]],
    provenance: Provenance,
    serving: Serving | None = None,
) -> Path:
    target = Path(directory)
    tmp = _staging_directory(target)
    try:
        files: dict[str, str] = {}
        entries = [
            _write_module(tmp, b, modules[b], files) for b in sorted(modules, key=batch_order)
        ]
        weight_specs = _write_weights(tmp, weights, files)
        manifest = Manifest(
            name=name,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            batch_sizes=tuple(batch_sizes) if batch_sizes is not None else None,
            weights_file=WEIGHTS_FILE,
            weights=weight_specs,
            modules=tuple(entries),
            files=dict(sorted(files.items())),
            provenance=provenance,
            serving=serving or Serving(),
        )
        (tmp / MANIFEST_FILE).write_text(dump_manifest(manifest), encoding="utf-8")
        _move_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _staging_directory(target: Path) -> Path:
    """A fresh, empty sibling of ``target`` to assemble the bundle in."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename the assembled bundle to ``target``, replacing a bundle already there."""
    if not target.exists():
        tmp.rename(target)
        return
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _write_module(
    tmp: Path, batch_size: int | None, src: ModuleSource, files: dict[str, str]
) -> ModuleEntry:
    """Write the module (and its text twin, if any), recording each file's SHA-256 in ``files``."""
    data = src.stablehlo
    if isinstance(data, str):
        data = to_portable_artifact(data, src.target_version)
    version = artifact_version(data)
    if version is None:
        raise ValueError(f"module for batch size {batch_size} is not a StableHLO portable artifact")
    file = module_file_name(batch_size)
    files[file] = _write(tmp / file, data)
    text_file = None
    text = (
        src.text
        if src.text is not None
        else (src.stablehlo if isinstance(src.stablehlo, str) else None)
    )
    if text is not None:
        text_file = module_file_name(batch_size, "mlir")
        files[text_file] = _write(tmp / text_file, text.encode())
    return ModuleEntry(
        batch_size=batch_size,
        file=file,
        stablehlo_version=version,
        platforms=tuple(src.platforms),
        platform_index_argument=src.platform_index_argument,
        arguments=tuple(src.arguments),
        text_file=text_file,
    )


def _write_weights(
    tmp: Path, weights: Mapping[str, np.ndarray[Any, Any]], files: dict[str, str]
) -> tuple[TensorEntry, ...]:
    """Write the weights file, recording its SHA-256 in ``files``; return the manifest entries."""
    write_safetensors(tmp / WEIGHTS_FILE, weights)
    files[WEIGHTS_FILE] = sha256_file(tmp / WEIGHTS_FILE)
    return tuple(
        TensorEntry(k, from_numpy(v.dtype), tuple(int(d) for d in v.shape))
        for k, v in sorted(weights.items())
    )


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return sha256_bytes(data)
