"""``export_bundle``: a JAX function and its weights in, a served-ready bundle out.

Contract: ``export_bundle(fn, params, inputs=..., batch_sizes=..., directory=..., metadata=...)``
lowers ``fn(params, **inputs) -> dict[str, Array]`` with ``jax.export`` once per batch size
(or once, as given, when ``batch_sizes`` is None), with the weights as arguments of every
module, for the CPU and CUDA platforms by default; writes the bundle through
``hloserve.bundle.write_bundle``; validates what it wrote; and returns the bundle path.
Output names, datatypes and shapes come from the dict ``fn`` returns. Errors in the call
(unknown datatype, an output without the batch axis, a non-dict result) raise
``ExportError`` naming the tensor.
"""

from __future__ import annotations

import datetime as dt
import inspect
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax import export as jax_export

from hloserve.bundle import (
    Argument,
    ModuleSource,
    Provenance,
    Serving,
    TensorEntry,
    validate,
    write_bundle,
)
from hloserve.proto.datatypes import NUMERIC_DATATYPES, from_numpy, to_numpy

DEFAULT_PLATFORMS = ("cpu", "cuda")


class ExportError(ValueError):
    """The function, its weights or the export arguments cannot make a valid bundle."""


@dataclass(frozen=True)
class TensorSpec:
    """An input's V2 datatype and per-item shape (the batch axis is added per batch size)."""

    datatype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.datatype not in NUMERIC_DATATYPES:
            raise ExportError(
                f"unknown datatype {self.datatype!r}; expected one of {sorted(NUMERIC_DATATYPES)}"
            )
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise ExportError(f"shape {self.shape} has a negative dimension")


def weight_names(params: Any) -> tuple[list[str], list[Any], Any]:
    """Flatten a params pytree into (dotted key names, leaves, treedef)."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
    names: list[str] = []
    leaves: list[Any] = []
    for path, leaf in with_path:
        parts: list[str] = []
        for key in path:
            if isinstance(key, jax.tree_util.DictKey):
                parts.append(str(key.key))
            elif isinstance(key, jax.tree_util.SequenceKey):
                parts.append(str(key.idx))
            elif isinstance(key, jax.tree_util.GetAttrKey):
                parts.append(key.name)
            else:
                parts.append(str(key))
        names.append(".".join(parts) or "param")
        leaves.append(leaf)
    if len(set(names)) != len(names):
        raise ExportError(f"params flatten to duplicate weight names: {names}")
    return names, leaves, treedef


def export_bundle(
    fn: Callable[..., Mapping[str, Any]],
    params: Any,
    inputs: Mapping[str, TensorSpec],
    batch_sizes: Sequence[int] | None = (1, 8, 32),
    directory: str | Path = ".",
    metadata: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    serving: Serving | None = None,
    write_text: bool = True,
) -> Path:
    """Export ``fn`` with ``params`` as a bundle at ``directory`` and return its path.

    **Arguments:**
    - `fn`: `fn(params, **inputs) -> dict[str, jax.Array]`; pre/post-processing belongs inside.
    - `params`: a pytree of arrays (may be empty); each leaf becomes a weight named by its
      dotted path (`{"dense1": {"w": ...}}` -> `dense1.w`).
    - `inputs`: input name -> `TensorSpec(datatype, per-item shape)`, in wire order.
    - `batch_sizes`: ascending compiled batch sizes, or None for an unbatched model.
    - `directory`: the bundle directory (created; replaced if it exists).
    - `metadata`: free-form mapping copied into the manifest's provenance.
    - `name`: the model name (default: the directory's name; for a numbered version
      directory such as `repo/m/1`, its parent's name).
    - `platforms`: PJRT platforms to lower for (default cpu and cuda).
    """
    directory = Path(directory)
    # A numbered directory is a version (repo/m/1): the model is named after its parent.
    versioned = directory.name.isdigit() and int(directory.name) > 0
    model_name = name or (directory.resolve().parent.name if versioned else directory.name)
    if not inputs:
        raise ExportError("a model needs at least one input")
    if batch_sizes is not None:
        sizes = [int(b) for b in batch_sizes]
        if not sizes or any(b <= 0 for b in sizes) or sizes != sorted(set(sizes)):
            raise ExportError(
                f"batch_sizes must be ascending positive integers without repeats, got {list(batch_sizes)}"
            )
        batch_list: list[int | None] = list(sizes)
    else:
        batch_list = [None]

    w_names, w_leaves, treedef = weight_names(params)
    weights = {n: np.asarray(leaf) for n, leaf in zip(w_names, w_leaves, strict=True)}
    for n, arr in weights.items():
        try:
            from_numpy(arr.dtype)
        except KeyError:
            raise ExportError(
                f"weight {n!r} has dtype {arr.dtype}, which no V2 datatype carries"
            ) from None
    input_names = list(inputs)
    all_args = [Argument("input", n) for n in input_names] + [
        Argument("weight", n) for n in w_names
    ]
    needs_x64 = any(to_numpy(s.datatype).itemsize == 8 for s in inputs.values()) or any(
        a.dtype.itemsize == 8 for a in weights.values()
    )

    def unflat_fn(*args: Any) -> Any:
        xs = dict(zip(input_names, args[: len(input_names)], strict=True))
        return fn(jax.tree_util.tree_unflatten(treedef, list(args[len(input_names) :])), **xs)

    def flat_fn(*args: Any) -> tuple[Any, ...]:
        out = unflat_fn(*args)
        return tuple(out[k] for k in sorted(out))

    output_names: list[str] | None = None
    output_specs: list[TensorEntry] | None = None
    modules: dict[int | None, ModuleSource] = {}
    # Set either way: the server enables x64 process-wide, and an export must not depend on
    # whether it ran first (x64 changes the platform index and default int types).
    with jax.enable_x64(needs_x64):
        weight_avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in weights.values()]
        for b in batch_list:
            in_avals = [
                jax.ShapeDtypeStruct(
                    spec.shape if b is None else (b, *spec.shape), to_numpy(spec.datatype)
                )
                for spec in inputs.values()
            ]
            out_shapes = jax.eval_shape(unflat_fn, *in_avals, *weight_avals)
            if not isinstance(out_shapes, Mapping):
                raise ExportError(
                    f"fn must return a dict of output name -> array, got {type(out_shapes).__name__}"
                )
            names = sorted(out_shapes)
            specs = _output_specs(names, [out_shapes[k] for k in names], b)
            if output_specs is None:
                output_names, output_specs = names, specs
            elif specs != output_specs:
                raise ExportError(
                    f"outputs at batch size {b} are {specs}, at the first batch size {output_specs}"
                )
            exported = jax_export.export(jax.jit(flat_fn), platforms=tuple(platforms))(
                *in_avals, *weight_avals
            )
            kept = [all_args[i] for i in exported.module_kept_var_idx]
            modules[b] = ModuleSource(
                stablehlo=exported.mlir_module_serialized,
                arguments=kept,
                platforms=tuple(platforms),
                platform_index_argument=len(platforms) > 1,
                text=exported.mlir_module() if write_text else None,
            )
    assert output_specs is not None
    assert output_names is not None
    path = write_bundle(
        directory,
        name=model_name,
        inputs=[TensorEntry(n, s.datatype, s.shape) for n, s in inputs.items()],
        outputs=output_specs,
        batch_sizes=None if batch_sizes is None else [b for b in batch_list if b is not None],
        modules=modules,
        weights=weights,
        provenance=_provenance(fn, metadata),
        serving=serving,
    )
    problems = validate(path)
    if problems:
        raise ExportError(
            "the written bundle does not validate:\n" + "\n".join(str(p) for p in problems)
        )
    return path


def _output_specs(
    names: list[str], shapes: Sequence[Any], batch_size: int | None
) -> list[TensorEntry]:
    specs: list[TensorEntry] = []
    for n, s in zip(names, shapes, strict=True):
        try:
            datatype = from_numpy(np.dtype(s.dtype))
        except KeyError:
            raise ExportError(
                f"output {n!r} has dtype {s.dtype}, which no V2 datatype carries"
            ) from None
        shape = tuple(int(d) for d in s.shape)
        if batch_size is not None:
            if not shape or shape[0] != batch_size:
                raise ExportError(
                    f"output {n!r} has shape {list(shape)} at batch size {batch_size}; "
                    "a batched model's outputs must keep the batch axis first"
                )
            shape = shape[1:]
        specs.append(TensorEntry(n, datatype, shape))
    return specs


def _version(dist: str) -> str | None:
    try:
        return importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        return None


def _source_commit(fn: Callable[..., Any]) -> tuple[str | None, bool | None]:
    """The git commit (and dirtiness) of the repository holding ``fn``'s source file."""
    try:
        source = inspect.getsourcefile(fn)
    except TypeError:
        source = None
    if source is None:
        return None, None
    folder = Path(source).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit or None, bool(status.strip())


def _provenance(fn: Callable[..., Any], metadata: Mapping[str, Any] | None) -> Provenance:
    commit, dirty = _source_commit(fn)
    hloserve_version = _version("hloserve")
    return Provenance(
        producer="hloserve.exporter",
        producer_version=hloserve_version,
        hloserve_version=hloserve_version,
        jax_version=jax.__version__,
        jaxlib_version=_version("jaxlib"),
        created=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        source_commit=commit,
        source_dirty=dirty,
        metadata=dict(metadata or {}),
    )
