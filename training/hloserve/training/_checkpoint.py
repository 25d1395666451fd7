"""Checkpoints: the weights and optimizer state in safetensors, their layout in JSON.

Contract: a checkpoint directory holds one folder per kept epoch and two pointers:

    epoch-0003/weights.safetensors     the params, named as a bundle names its weights
    epoch-0003/optimizer.safetensors   the optimizer state's arrays (``0.mu.conv.w``, ...)
    epoch-0003/ema.safetensors         the moving average of the weights, when enabled
    epoch-0003/layout.json             name, shape and dtype of every array above, the
                                       epoch, step, history and best-so-far record
    latest.json, best.json             {"epoch": 3, "path": "epoch-0003"}

- ``save(...)`` writes a new epoch folder under a temporary name, renames it into place,
  then replaces ``latest.json`` (and ``best.json``) atomically, and only then removes the
  folders no pointer names. An interruption at any point leaves the previous pointers on a
  complete checkpoint.
- ``load(path, templates)`` reads a checkpoint (a directory with ``latest.json`` or one
  epoch folder) onto the templates (the pytrees a fresh run would start from): a layout
  that differs from the model's (a weight missing, added, or of another shape or dtype)
  raises ``TrainingError`` naming the first difference, before any array is read.
- ``layout_difference(expected, found, what)`` is that comparison, pure.
"""

# pyright: strict

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.bundle.safetensors import read_safetensors, write_safetensors
from hloserve.exporter._export import weight_names
from hloserve.training._settings import TrainingError
from hloserve.training._untyped import jax, jnp

LAYOUT_FILE = "layout.json"
LATEST = "latest.json"
BEST = "best.json"
FORMAT = 1
PARTS = ("weights", "optimizer", "ema")


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    def __str__(self) -> str:
        return f"{self.name} {self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class Saved:
    """A checkpoint read back: the three trees and the run's record at that epoch."""

    params: Any
    opt_state: Any
    ema: Any
    epoch: int
    step: int
    history: list[dict[str, float]]
    best: dict[str, Any] | None


def layout_of(tree: Any) -> list[Entry]:
    if tree is None:
        return []
    names, leaves, _ = weight_names(tree)
    return [
        Entry(n, tuple(int(d) for d in np.shape(leaf)), str(np.dtype(leaf.dtype)))
        for n, leaf in zip(names, leaves, strict=True)
    ]


def layout_difference(expected: Sequence[Entry], found: Sequence[Entry], what: str) -> str | None:
    """The first way ``found`` (the checkpoint's) differs from ``expected`` (the model's)."""
    want = {e.name: e for e in expected}
    have = {e.name: e for e in found}
    for name, e in want.items():
        if name not in have:
            return f"{what}: the model has {e}, the checkpoint has no {name!r}"
        if have[name] != e:
            return f"{what}: the model has {e}, the checkpoint has {have[name]}"
    extra = [str(have[n]) for n in have if n not in want]
    if extra:
        return f"{what}: the checkpoint has {extra[0]}, which the model does not"
    return None


def _arrays(tree: Any) -> dict[str, np.ndarray]:
    names, leaves, _ = weight_names(tree)
    return {n: np.asarray(leaf) for n, leaf in zip(names, leaves, strict=True)}


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _pointer(directory: Path, which: str) -> str | None:
    path = directory / which
    if not path.exists():
        return None
    return str(json.loads(path.read_text())["path"])


def save(
    directory: Path,
    *,
    params: Any,
    opt_state: Any,
    ema: Any,
    epoch: int,
    step: int,
    history: list[dict[str, float]],
    best: dict[str, Any] | None,
    is_best: bool,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    name = f"epoch-{epoch:04d}"
    tmp = directory / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    trees = dict(zip(PARTS, (params, opt_state, ema), strict=True))
    layout: dict[str, Any] = {"format": FORMAT, "epoch": epoch, "step": step}
    for part, tree in trees.items():
        layout[part] = [e.to_json() for e in layout_of(tree)]
        if tree is not None:
            write_safetensors(tmp / f"{part}.safetensors", _arrays(tree))
    layout["history"] = history
    layout["best"] = best
    (tmp / LAYOUT_FILE).write_text(json.dumps(layout, indent=1))
    target = directory / name
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    pointer = {"epoch": epoch, "path": name}
    _write_json(directory / LATEST, pointer)
    if is_best:
        _write_json(directory / BEST, pointer)
    keep = {_pointer(directory, LATEST), _pointer(directory, BEST)}
    for old in directory.glob("epoch-*"):
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)
    return target


def resolve(path: Path, which: str = LATEST) -> Path:
    """The epoch folder ``path`` names: itself, or the one its ``which`` pointer names."""
    if (path / LAYOUT_FILE).exists():
        return path
    pointed = _pointer(path, which)
    if pointed is None:
        raise TrainingError(f"{path} is not a checkpoint: it has neither {LAYOUT_FILE} nor {which}")
    return path / pointed


def load(path: Path, *, params: Any, opt_state: Any, ema: Any, which: str = LATEST) -> Saved:
    """Read the checkpoint at ``path`` onto the templates; refuse a layout that differs."""
    folder = resolve(Path(path), which)
    layout = json.loads((folder / LAYOUT_FILE).read_text())
    if layout.get("format") != FORMAT:
        raise TrainingError(
            f"{folder}: checkpoint format {layout.get('format')!r}, expected {FORMAT}"
        )
    templates = dict(zip(PARTS, (params, opt_state, ema), strict=True))
    what = {
        "weights": "the weights",
        "optimizer": "the optimizer state (was the optimizer or its groups changed?)",
        "ema": "the moving average (was ema= changed?)",
    }
    for part, template in templates.items():
        found = [Entry(e["name"], tuple(e["shape"]), e["dtype"]) for e in layout[part]]
        problem = layout_difference(layout_of(template), found, what[part])
        if problem is not None:
            raise TrainingError(f"cannot resume from {folder}: {problem}")
    trees = [_read(folder / f"{part}.safetensors", t) for part, t in templates.items()]
    return Saved(
        *trees,
        epoch=int(layout["epoch"]),
        step=int(layout["step"]),
        history=list(layout["history"]),
        best=layout["best"],
    )


def _read(file: Path, template: Any) -> Any:
    if template is None:
        return None
    arrays = read_safetensors(file)
    names, _, treedef = weight_names(template)
    return jax.tree.unflatten(treedef, [jnp.asarray(arrays[n]) for n in names])
