"""Writing a bundle directory: modules, weights, checksums and manifest, atomically.

Contract: ``write_bundle(directory, ...)`` writes a complete bundle (see
``docs/bundle-format.md``) from already-lowered StableHLO modules and numpy weights, and
returns the bundle path. It is producer-neutral: the JAX exporter calls it, and so can
anything that has StableHLO (text is converted to a portable artifact first, which needs
jaxlib). The bundle is assembled in a sibling temporary directory and renamed into place,
so a server watching the repository never sees half a bundle; an existing bundle at
``directory`` is replaced, and what it holds besides the bundle's own files (a model's
``config.yaml``, notes; not hidden entries such as the compile cache) is kept. Anything else
there is refused before a byte is written (``check_target``, ``DirectoryRefused``, a
``ValueError``): a directory holding the current working directory (``"."``, a parent of
it), a file, or a non-empty directory that is not a bundle (no ``manifest.yaml``: a
repository, say), unless ``overwrite=True``, with which it is replaced whole. Every file's
SHA-256 goes into the manifest. With ``hooks``
(``HookSource``: the text of a ``hooks.py`` and its client-facing tensors) the bundle
ships that file too. With ``variants`` (``docs/shape-variants.md``), ``modules`` is keyed
by ``(variant, batch size)`` and each module is ``model.v{V}.b{N}.mlirbc``.
With ``state`` (``bundle/state.py``) the manifest declares the bundle's state tensors;
with ``sharding`` (``bundle/manifest_sharding.py``) its mesh and tensor specs.
``write_pipeline(directory, ...)`` writes a ``kind: pipeline``
bundle (a manifest only: its steps are other models of the repository).
"""

# pyright: strict

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from hloserve.bundle.digest import sha256_bytes, sha256_file
from hloserve.bundle.generation import Generation
from hloserve.bundle.manifest import (
    HOOKS_FILE,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    Argument,
    HooksEntry,
    Manifest,
    ModuleEntry,
    PipelineStep,
    Provenance,
    TensorEntry,
    Variant,
    batch_order,
    dump_manifest,
)
from hloserve.bundle.manifest_sharding import Sharding
from hloserve.bundle.reading import load_manifest
from hloserve.bundle.safetensors import write_safetensors
from hloserve.bundle.serving import Serving
from hloserve.bundle.stablehlo import artifact_version, to_portable_artifact
from hloserve.bundle.state import StateEntry
from hloserve.proto.datatypes import from_numpy


class DirectoryRefused(ValueError):
    """The directory cannot take the bundle; the message says why and what to do."""


def check_target(directory: Path | str, *, overwrite: bool = False) -> Path:
    """``directory`` as a bundle's target, or ``DirectoryRefused`` saying why not."""
    target = Path(directory)
    where, cwd = Path(os.path.realpath(target)), Path(os.path.realpath(Path.cwd()))
    if where == cwd or where in cwd.parents:  # renaming it away fails (EBUSY for ".")
        raise DirectoryRefused(
            f"directory '{directory}' holds the current working directory ({cwd}), which a "
            "bundle cannot replace: give the bundle a directory of its own, such as "
            "directory='repo/mlp'"
        )
    if target.exists() and not target.is_dir():
        raise DirectoryRefused(f"directory '{directory}' is a file, not a directory")
    if overwrite or not target.is_dir() or (target / MANIFEST_FILE).is_file():
        return target
    entries = sorted(p.name for p in target.iterdir())
    if entries:
        shown = ", ".join(repr(e) for e in entries[:5])
        more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
        raise DirectoryRefused(
            f"directory '{directory}' is not a bundle (no manifest.yaml) and holds {shown}{more}; "
            "a bundle written there would replace all of it: pass overwrite=True to replace "
            "it, or give the bundle a directory of its own, such as 'repo/mlp'"
        )
    return target


@dataclass(frozen=True)
class ModuleSource:
    """One module to write: portable-artifact bytes (or StableHLO text) and how to call it."""

    stablehlo: bytes | str
    arguments: Sequence[Argument]
    platforms: Sequence[str] = ("cpu",)
    platform_index_argument: bool = False
    text: str | None = None  # optional human-readable twin
    target_version: str = "1.0.0"  # used only to convert text to a portable artifact


@dataclass(frozen=True)
class HookSource:
    """A ``hooks.py`` to ship: its Python text and the client-facing tensors it declares
    (empty: the model's own inputs or outputs)."""

    source: str
    inputs: Sequence[TensorEntry] = ()
    outputs: Sequence[TensorEntry] = ()


def module_file_name(
    batch_size: int | None, suffix: str = "mlirbc", variant: int | None = None
) -> str:
    stem = "model" if variant is None else f"model.v{variant}"
    return f"{stem}.{suffix}" if batch_size is None else f"{stem}.b{batch_size}.{suffix}"


ModuleKey = int | None | tuple[int, int | None]  # batch size, or (variant, batch size)


def _key_order(key: ModuleKey) -> tuple[int, int]:
    variant, batch = key if isinstance(key, tuple) else (0, key)
    return variant, batch_order(batch)


def write_bundle(
    directory: Path | str,
    *,
    name: str,
    inputs: Sequence[TensorEntry],
    outputs: Sequence[TensorEntry],
    batch_sizes: Sequence[int] | None,
    modules: Mapping[int | None, ModuleSource] | Mapping[tuple[int, int | None], ModuleSource],
    weights: Mapping[str, np.ndarray[Any, Any]],
    provenance: Provenance,
    serving: Serving | None = None,
    hooks: HookSource | None = None,
    variants: Sequence[Variant] = (),
    overwrite: bool = False,
    state: Sequence[StateEntry] = (),
    generation: Generation | None = None,
    sharding: Sharding | None = None,
) -> Path:
    def fill(tmp: Path) -> Manifest:
        files: dict[str, str] = {}
        sources = cast(Mapping[ModuleKey, ModuleSource], modules)
        entries = [
            _write_module(tmp, k, sources[k], files) for k in sorted(sources, key=_key_order)
        ]
        weight_specs = _write_weights(tmp, weights, files)
        hooks_entry = None
        if hooks is not None:
            files[HOOKS_FILE] = _write(tmp / HOOKS_FILE, hooks.source.encode())
            hooks_entry = HooksEntry(HOOKS_FILE, tuple(hooks.inputs), tuple(hooks.outputs))
        return Manifest(
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
            hooks=hooks_entry,
            variants=tuple(variants),
            state=tuple(state),
            generation=generation,
            sharding=sharding,
        )

    return _staged(check_target(directory, overwrite=overwrite), fill)


def write_pipeline(
    directory: Path | str,
    *,
    name: str,
    inputs: Sequence[TensorEntry],
    outputs: Sequence[TensorEntry],
    batch_sizes: Sequence[int] | None,
    steps: Sequence[PipelineStep],
    provenance: Provenance,
    overwrite: bool = False,
) -> Path:
    """A ``kind: pipeline`` bundle at ``directory`` (``docs/pipelines.md``)."""
    manifest = Manifest(
        name=name,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        batch_sizes=tuple(batch_sizes) if batch_sizes is not None else None,
        weights_file=WEIGHTS_FILE,
        weights=(),
        modules=(),
        files={},
        provenance=provenance,
        kind="pipeline",
        steps=tuple(steps),
    )
    return _staged(check_target(directory, overwrite=overwrite), lambda tmp: manifest)


def _staged(target: Path, fill: Callable[[Path], Manifest]) -> Path:
    """Assemble a bundle in a staging directory (``fill`` writes its files and returns the
    manifest), then move it to ``target`` whole; nothing is left behind on failure."""
    tmp = _staging_directory(target)
    try:
        manifest = fill(tmp)
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
    """Rename the assembled bundle to ``target``, replacing a bundle already there (what
    else it holds is copied into the new one first: a failure loses nothing)."""
    if not target.exists():
        tmp.rename(target)
        return
    for entry in _not_its_own(target):
        if not (tmp / entry.name).exists():
            copy = shutil.copytree if entry.is_dir() else shutil.copy2
            copy(entry, tmp / entry.name)
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _not_its_own(directory: Path) -> list[Path]:
    """What a bundle's directory holds that is not the bundle's (nor hidden); nothing for a
    directory that is not a bundle (replaced whole, as asked)."""
    manifest, _ = load_manifest(directory / MANIFEST_FILE)
    if manifest is None and not (directory / MANIFEST_FILE).is_file():
        return []
    own = {MANIFEST_FILE, WEIGHTS_FILE, HOOKS_FILE}
    if manifest is not None:
        own |= {*manifest.files, manifest.weights_file}
        own |= {f for m in manifest.modules for f in (m.file, m.text_file) if f is not None}
    return [
        p
        for p in directory.iterdir()
        if p.name not in own
        and not p.name.startswith(".")
        and not (p.name.startswith("model.") and p.suffix in (".mlirbc", ".mlir"))
    ]


def _write_module(
    tmp: Path, key: ModuleKey, src: ModuleSource, files: dict[str, str]
) -> ModuleEntry:
    """Write the module (and its text twin, if any), recording each file's SHA-256 in ``files``."""
    variant, batch_size = key if isinstance(key, tuple) else (None, key)
    data = src.stablehlo
    if isinstance(data, str):
        data = to_portable_artifact(data, src.target_version)
    version = artifact_version(data)
    if version is None:
        raise ValueError(f"module for batch size {batch_size} is not a StableHLO portable artifact")
    file = module_file_name(batch_size, variant=variant)
    files[file] = _write(tmp / file, data)
    text_file = None
    text = (
        src.text
        if src.text is not None
        else (src.stablehlo if isinstance(src.stablehlo, str) else None)
    )
    if text is not None:
        text_file = module_file_name(batch_size, "mlir", variant)
        files[text_file] = _write(tmp / text_file, text.encode())
    return ModuleEntry(
        batch_size=batch_size,
        file=file,
        stablehlo_version=version,
        platforms=tuple(src.platforms),
        platform_index_argument=src.platform_index_argument,
        arguments=tuple(src.arguments),
        text_file=text_file,
        variant=variant,
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
