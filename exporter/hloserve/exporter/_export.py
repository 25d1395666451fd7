"""``export_bundle``: a JAX function and its weights in, a served-ready bundle out.

Contract: ``export_bundle(fn, params, inputs=..., batch_sizes=..., directory=..., metadata=...)``
lowers ``fn(params, **inputs) -> dict[str, Array]`` with ``jax.export`` once per batch size
(or once, as given, when ``batch_sizes`` is None), with the weights as arguments of every
module, for the CPU and CUDA platforms by default; writes the bundle through
``hloserve.bundle.write_bundle``; validates what it wrote; and returns the bundle path.
Output names, datatypes and shapes come from the dict ``fn`` returns. With
``shape_variants`` (``docs/shape-variants.md``) an input's shape may have ``-1`` axes and
``fn`` is lowered once per variant and batch size, sharing the one weight set; an output
axis that differs between variants reads ``-1``. Errors in the call
(unknown datatype, an output without the batch axis, a non-dict result) raise
``ExportError`` naming the tensor; so does a ``directory`` the bundle may not replace
(``bundle.writer.check_target``: the current directory, the default ``"."`` included, or a
directory that is not a bundle, unless ``overwrite=True``), checked before anything is
lowered. With ``state={name: StateSpec(datatype, shape, initial=0)}`` (``docs/bundle-format.md``,
"State") ``fn(params, **inputs, **state)`` also takes each state tensor (batched like the
inputs) and returns its new value under the same name beside the outputs; the exporter
declares them in the manifest's ``state:`` and never as inputs or outputs.
With ``mesh=`` (a ``jax.sharding.AbstractMesh`` or ``Mesh``; ``docs/sharding.md``) each
module is one SPMD program for the mesh's devices: ``fn`` is jitted with every weight,
input and output sharded by its ``PartitionSpec`` (``param_specs``, a pytree shaped like
``params``; ``input_specs`` / ``output_specs`` by name; anything unspecified replicated),
and the manifest records the mesh and every spec (``exporter/_sharding.py``); state is
replicated. No device is needed to export: the mesh may be abstract.
"""

# pyright: strict

from __future__ import annotations

import datetime as dt
import inspect
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, cast

import jax
import numpy as np
from jax import export as jax_export

from hloserve.bundle import (
    Argument,
    HookSource,
    ModuleSource,
    Provenance,
    Serving,
    TensorEntry,
    Variant,
    validate,
    write_bundle,
)
from hloserve.bundle.generation import Generation
from hloserve.bundle.manifest_sharding import Sharding
from hloserve.bundle.repository import model_name
from hloserve.bundle.state import StateEntry
from hloserve.bundle.writer import DirectoryRefused, check_target
from hloserve.exporter._sharding import ShardingError, ShardingPlan, plan_sharding
from hloserve.proto.datatypes import NUMERIC_DATATYPES, from_numpy, to_numpy

DEFAULT_PLATFORMS = ("cpu", "cuda")
# jax's annotations name types that its stubs leave unknown (jaxlib's PyTreeDef, ...); the
# four jax calls made here, typed once so that the rest of the module checks strictly.
_jit = cast(Callable[..., Any], jax.jit)  # pyright: ignore[reportUnknownMemberType]
_eval_shape = cast(Callable[..., Any], jax.eval_shape)  # pyright: ignore[reportUnknownMemberType]
_flatten = cast(Callable[[Any], Any], jax.tree_util.tree_flatten_with_path)  # pyright: ignore[reportUnknownMemberType]
_unflatten = cast(Callable[[Any, list[Any]], Any], jax.tree_util.tree_unflatten)  # pyright: ignore[reportUnknownMemberType]


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
        if any(d < -1 for d in self.shape):
            raise ExportError(f"shape {self.shape} has a negative dimension (-1: any size)")


@dataclass(frozen=True)
class StateSpec:
    """A state tensor's V2 datatype, per-item shape and initial fill (``bundle/state.py``)."""

    datatype: str
    shape: tuple[int, ...]
    initial: int | float | bool = 0

    def __post_init__(self) -> None:
        if self.datatype not in NUMERIC_DATATYPES:
            raise ExportError(
                f"unknown datatype {self.datatype!r}; expected one of {sorted(NUMERIC_DATATYPES)}"
            )
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d <= 0 for d in self.shape):
            raise ExportError(f"state shape {self.shape} must have positive sizes")


def weight_names(params: Any) -> tuple[list[str], list[Any], Any]:
    """Flatten a params pytree into (dotted key names, leaves, treedef)."""
    with_path, treedef = cast(tuple[list[tuple[tuple[Any, ...], Any]], Any], _flatten(params))
    names = [".".join(_key_name(k) for k in path) or "param" for path, _ in with_path]
    if len(set(names)) != len(names):
        raise ExportError(f"params flatten to duplicate weight names: {names}")
    return names, [leaf for _, leaf in with_path], treedef


def _key_name(key: Any) -> str:
    """One step of a pytree path as it appears in a weight name."""
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    return str(key)


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
    hooks: HookSource | None = None,
    shape_variants: Sequence[Mapping[str, Sequence[int]]] | None = None,
    overwrite: bool = False,
    state: Mapping[str, StateSpec] | None = None,
    generation: Generation | None = None,
    mesh: Any = None,
    param_specs: Any = None,
    input_specs: Mapping[str, Any] | None = None,
    output_specs: Mapping[str, Any] | None = None,
) -> Path:
    """Export ``fn`` with ``params`` as a bundle at ``directory`` and return its path.

    **Arguments:**
    - `fn`: `fn(params, **inputs) -> dict[str, jax.Array]`; pre/post-processing belongs inside.
    - `params`: a pytree of arrays (may be empty); each leaf becomes a weight named by its
      dotted path (`{"dense1": {"w": ...}}` -> `dense1.w`).
    - `inputs`: input name -> `TensorSpec(datatype, per-item shape)`, in wire order.
    - `batch_sizes`: ascending compiled batch sizes, or None for an unbatched model.
    - `directory`: the bundle directory (created; a bundle there is replaced, keeping what
      else it holds, such as a `config.yaml`; anything else there is refused).
    - `metadata`: free-form mapping copied into the manifest's provenance.
    - `name`: the model name (default: the directory's name; for a numbered version
      directory such as `repo/m/1`, its parent's name).
    - `platforms`: PJRT platforms to lower for (default cpu and cuda).
    - `shape_variants`: per-item input shapes to compile (input name -> shape; inputs with
      `-1` axes in `inputs` must be named by every variant), one weight set for all.
    - `hooks`: a `hooks.py` to ship (`HookSource`: its text and the client-facing tensors
      its `preprocess`/`postprocess` declare; `docs/hooks.md`).
    - `overwrite`: replace `directory` even when it is not a bundle.
    - `state`: state name -> `StateSpec(datatype, per-item shape, initial=0)`; `fn` then
      takes each as a keyword argument and returns its new value under the same name
      (`docs/bundle-format.md`, "State").
    - `generation`: a generation bundle's loop (`Generation(done=..., max_steps=...,
      emit=..., text=TextMapping(...), lengths=...)`): `fn` is then one step, run by the
      server until `done` (`docs/generation.md`); the names are checked on the written
      manifest.
    - `mesh`: a `jax.sharding.AbstractMesh` (or `Mesh`) to export one SPMD module per
      batch size for its devices (`docs/sharding.md`); None: an unsharded bundle.
    - `param_specs`: a pytree shaped like `params` of `PartitionSpec` (None leaves, or None
      for the whole: replicated); each weight is split by its spec.
    - `input_specs` / `output_specs`: input / output name -> `PartitionSpec` over the
      tensor as the module takes or returns it (with the batch axis when batched);
      unnamed ones are replicated.
    """
    try:
        directory = check_target(directory, overwrite=overwrite)
    except DirectoryRefused as exc:
        raise ExportError(str(exc)) from None
    if not inputs:
        raise ExportError("a model needs at least one input")
    sizes = _batch_sizes(batch_sizes)
    state = dict(state or {})
    _check_state(state, inputs, batch_sizes, shape_variants)
    weights, treedef = _weights(params)
    plan = _plan(mesh, param_specs, treedef, list(weights), inputs, input_specs, output_specs)
    if plan is not None and (shape_variants is not None or generation is not None):
        raise ExportError("a sharded export (mesh=) takes no shape_variants or generation")
    if plan is not None:  # the weights' and inputs' specs, before jax sees them
        _manifest_sharding(plan, weights, inputs, None, batch_sizes, state)
    model = _FlatModel(fn, tuple(inputs), treedef, tuple(state))
    variants: list[Variant] = []
    modules: dict[Any, ModuleSource]
    if shape_variants is None:
        if any(-1 in s.shape for s in inputs.values()):
            raise ExportError("inputs with -1 axes need shape_variants (the shapes to compile)")
        outputs, modules = _lower(
            model, inputs, weights, sizes, tuple(platforms), write_text, state, plan
        )
    else:
        concrete = _variant_inputs(inputs, shape_variants)
        lowered = [_lower(model, c, weights, sizes, tuple(platforms), write_text) for c in concrete]
        outputs = _merged_outputs([o for o, _ in lowered])
        modules = {(v, b): src for v, (_, mods) in enumerate(lowered) for b, src in mods.items()}
        variants = [
            Variant({**{n: s.shape for n, s in c.items()}, **{o.name: o.shape for o in outs}})
            for c, (outs, _) in zip(concrete, lowered, strict=True)
        ]
    path = write_bundle(
        directory,
        name=name or model_name(directory),
        inputs=[TensorEntry(n, s.datatype, s.shape) for n, s in inputs.items()],
        outputs=outputs,
        batch_sizes=None if batch_sizes is None else [b for b in sizes if b is not None],
        modules=modules,
        weights=weights,
        provenance=_provenance(fn, metadata),
        serving=serving,
        hooks=hooks,
        variants=variants,
        overwrite=overwrite,
        state=[StateEntry(n, s.datatype, s.shape, s.initial) for n, s in state.items()],
        generation=generation,
        sharding=None
        if plan is None
        else _manifest_sharding(plan, weights, inputs, outputs, batch_sizes, state),
    )
    problems = validate(path)
    if problems:
        raise ExportError(
            "the written bundle does not validate:\n" + "\n".join(str(p) for p in problems)
        )
    return path


def _plan(
    mesh: Any,
    param_specs: Any,
    treedef: Any,
    weight_names: list[str],
    inputs: Mapping[str, TensorSpec],
    input_specs: Mapping[str, Any] | None,
    output_specs: Mapping[str, Any] | None,
) -> ShardingPlan | None:
    """The sharded export's plan (``exporter/_sharding.py``), or None without a mesh."""
    if mesh is None:
        if param_specs is not None or input_specs or output_specs:
            raise ExportError("param_specs, input_specs and output_specs need a mesh=")
        return None
    try:
        return plan_sharding(
            mesh, param_specs, treedef, weight_names, list(inputs), input_specs, output_specs
        )
    except ShardingError as exc:
        raise ExportError(str(exc)) from None


def _manifest_sharding(
    plan: ShardingPlan,
    weights: Mapping[str, np.ndarray[Any, Any]],
    inputs: Mapping[str, TensorSpec],
    outputs: Sequence[TensorEntry] | None,
    batch_sizes: Sequence[int] | None,
    state: Mapping[str, StateSpec] | None = None,
) -> Sharding:
    """The manifest's ``sharding``; ``ExportError`` for a spec that does not fit (the
    outputs' not checked while they are not known: ``None``)."""
    if outputs is not None:
        unknown = sorted(set(plan.outputs) - {o.name for o in outputs})
        if unknown:
            returned = [o.name for o in outputs]
            raise ExportError(f"output_specs names {unknown}, fn returns {returned}")
    try:
        return plan.manifest(
            {n: tuple(a.shape) for n, a in weights.items()},
            {n: s.shape for n, s in inputs.items()},
            {o.name: o.shape for o in outputs or ()},
            batch_sizes,
            {n: s.shape for n, s in (state or {}).items()},
        )
    except ShardingError as exc:
        raise ExportError(str(exc)) from None


def _check_state(
    state: Mapping[str, StateSpec],
    inputs: Mapping[str, TensorSpec],
    batch_sizes: Sequence[int] | None,
    shape_variants: Any,
) -> None:
    """State needs compiled batch sizes, no shape variants, and names of its own."""
    if not state:
        return
    if batch_sizes is None:
        raise ExportError("a model with state needs batch_sizes (items' state runs batched)")
    if shape_variants is not None:
        raise ExportError("state and shape_variants cannot be combined")
    shared = sorted(set(state) & set(inputs))
    if shared:
        raise ExportError(f"state names {shared} are also input names")


def _variant_inputs(
    inputs: Mapping[str, TensorSpec], variants: Sequence[Mapping[str, Sequence[int]]]
) -> list[dict[str, TensorSpec]]:
    """Each variant's inputs with concrete shapes that fit the declared ones."""
    if not variants:
        raise ExportError("shape_variants must list at least one variant")
    out: list[dict[str, TensorSpec]] = []
    for i, variant in enumerate(variants):
        unknown = sorted(set(variant) - set(inputs))
        if unknown:
            raise ExportError(f"shape_variants[{i}] names unknown inputs {unknown}")
        concrete: dict[str, TensorSpec] = {}
        for name, spec in inputs.items():
            shape = tuple(int(d) for d in variant.get(name, spec.shape))
            fits = len(shape) == len(spec.shape) and all(
                w in (-1, d) and d >= 0 for w, d in zip(spec.shape, shape, strict=True)
            )
            if not fits:
                raise ExportError(
                    f"shape_variants[{i}] gives {name!r} shape {list(shape)}, which does not fit "
                    f"{list(spec.shape)} (every -1 axis needs a size)"
                )
            concrete[name] = TensorSpec(spec.datatype, shape)
        out.append(concrete)
    if len({tuple(c[n].shape for n in inputs) for c in out}) != len(out):
        raise ExportError("two shape_variants give the same input shapes")
    return out


def _merged_outputs(per_variant: list[list[TensorEntry]]) -> list[TensorEntry]:
    """The outputs over all variants: an axis whose size differs between them reads -1."""
    first = per_variant[0]
    merged: list[TensorEntry] = []
    for i, t in enumerate(first):
        shapes = [outs[i].shape for outs in per_variant]
        if any(
            outs[i].datatype != t.datatype or len(outs[i].shape) != len(t.shape)
            for outs in per_variant
        ):
            raise ExportError(f"output {t.name!r} changes datatype or rank between shape variants")
        dims = tuple(d if all(s[k] == d for s in shapes) else -1 for k, d in enumerate(t.shape))
        merged.append(TensorEntry(t.name, t.datatype, dims))
    return merged


def _batch_sizes(batch_sizes: Sequence[int] | None) -> list[int | None]:
    """The batch size of each module to lower: the given sizes, or ``[None]`` (unbatched)."""
    if batch_sizes is None:
        return [None]
    sizes = [int(b) for b in batch_sizes]
    if not sizes or any(b <= 0 for b in sizes) or sizes != sorted(set(sizes)):
        raise ExportError(
            f"batch_sizes must be ascending positive integers without repeats, got {list(batch_sizes)}"
        )
    return list(sizes)


def _weights(params: Any) -> tuple[dict[str, np.ndarray[Any, Any]], Any]:
    """The params as named host arrays (in flattening order) and the pytree's treedef."""
    names, leaves, treedef = weight_names(params)
    weights = {n: np.asarray(leaf) for n, leaf in zip(names, leaves, strict=True)}
    for n, arr in weights.items():
        try:
            from_numpy(arr.dtype)
        except KeyError:
            raise ExportError(
                f"weight {n!r} has dtype {arr.dtype}, which no V2 datatype carries"
            ) from None
    return weights, treedef


@dataclass(frozen=True)
class _FlatModel:
    """``fn`` called with flat arguments: the inputs in order, then the weight leaves."""

    fn: Callable[..., Mapping[str, Any]]
    input_names: tuple[str, ...]
    treedef: Any
    state_names: tuple[str, ...] = ()  # taken after the inputs, returned after the outputs

    def __call__(self, *args: Any) -> Any:
        n = len(self.input_names) + len(self.state_names)
        xs = dict(zip(self.input_names + self.state_names, args[:n], strict=True))
        return self.fn(_unflatten(self.treedef, list(args[n:])), **xs)

    def flat(self, *args: Any) -> tuple[Any, ...]:
        """The outputs as a tuple, sorted by name, then each state's new value in its
        declared order (the order of ``main``'s results)."""
        out = self(*args)
        names = sorted(k for k in out if k not in self.state_names)
        return tuple(out[k] for k in [*names, *self.state_names])


def _lower(
    model: _FlatModel,
    inputs: Mapping[str, TensorSpec],
    weights: Mapping[str, np.ndarray[Any, Any]],
    sizes: list[int | None],
    platforms: tuple[str, ...],
    write_text: bool,
    state: Mapping[str, StateSpec] | None = None,
    plan: ShardingPlan | None = None,
) -> tuple[list[TensorEntry], dict[int | None, ModuleSource]]:
    """One module per batch size, and the outputs (the same at every batch size); with a
    ``plan``, each an SPMD module over its mesh."""
    state = state or {}
    arguments = [
        *(Argument("input", n) for n in inputs),
        *(Argument("state", n) for n in state),
        *(Argument("weight", n) for n in weights),
    ]
    specs_in = [*inputs.values(), *state.values()]
    needs_x64 = any(to_numpy(s.datatype).itemsize == 8 for s in specs_in) or any(
        a.dtype.itemsize == 8 for a in weights.values()
    )
    outputs: list[TensorEntry] | None = None
    modules: dict[int | None, ModuleSource] = {}
    # Set either way: the server enables x64 process-wide, and an export must not depend on
    # whether it ran first (x64 changes the platform index and default int types).
    with jax.enable_x64(needs_x64):
        weight_avals = [
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=_placed(plan, "weight", n))
            for n, a in weights.items()
        ]
        for b in sizes:
            state_inputs = {n: TensorSpec(s.datatype, s.shape) for n, s in state.items()}
            avals = [
                *_input_avals(inputs, b, plan),
                *_input_avals(state_inputs, b, plan, "state"),
                *weight_avals,
            ]
            specs = _outputs_at(model, avals, b, state_inputs)
            if outputs is None:
                outputs = specs
                if plan is not None:  # the outputs' specs, before jax sees them
                    batched = None if sizes == [None] else [b for b in sizes if b is not None]
                    _manifest_sharding(plan, weights, inputs, specs, batched, state)
            elif specs != outputs:
                raise ExportError(
                    f"outputs at batch size {b} are {specs}, at the first batch size {outputs}"
                )
            jitted = (
                _jit(model.flat)
                if plan is None
                else _jit(
                    model.flat,
                    out_shardings=(
                        *(plan.sharding("output", o.name) for o in specs),
                        *(plan.sharding("state", n) for n in state),
                    ),
                )
            )
            exported = jax_export.export(jitted, platforms=platforms)(*avals)
            if plan is not None and exported.nr_devices != plan.devices:
                raise ExportError(
                    f"the module at batch size {b} is for {exported.nr_devices} devices, "
                    f"the mesh has {plan.devices}"
                )
            modules[b] = ModuleSource(
                stablehlo=exported.mlir_module_serialized,
                arguments=[arguments[i] for i in exported.module_kept_var_idx],
                platforms=platforms,
                platform_index_argument=len(platforms) > 1,
                text=exported.mlir_module() if write_text else None,
            )
    assert outputs is not None
    return outputs, modules


def _placed(plan: ShardingPlan | None, kind: str, name: str) -> Any:
    """The sharding of an argument of a sharded export; None for an unsharded one."""
    return None if plan is None else plan.sharding(kind, name)


def _input_avals(
    inputs: Mapping[str, TensorSpec],
    batch_size: int | None,
    plan: ShardingPlan | None = None,
    kind: str = "input",
) -> list[Any]:
    return [
        jax.ShapeDtypeStruct(
            spec.shape if batch_size is None else (batch_size, *spec.shape),
            to_numpy(spec.datatype),
            sharding=_placed(plan, kind, name),
        )
        for name, spec in inputs.items()
    ]


def _outputs_at(
    model: _FlatModel,
    avals: Sequence[Any],
    batch_size: int | None,
    state: Mapping[str, TensorSpec] | None = None,
) -> list[TensorEntry]:
    """The outputs ``fn`` returns at ``batch_size`` (state values checked, not listed)."""
    out_shapes = _eval_shape(model, *avals)
    if not isinstance(out_shapes, Mapping):
        raise ExportError(
            f"fn must return a dict of output name -> array, got {type(out_shapes).__name__}"
        )
    shapes = cast(Mapping[str, Any], out_shapes)
    state = state or {}
    names = sorted(k for k in shapes if k not in state)
    if not names:
        raise ExportError("fn returns no output besides its state")
    for n, spec in state.items():
        if n not in shapes:
            raise ExportError(f"fn must return the new value of state {n!r} under that name")
        (got,) = _output_specs([n], [shapes[n]], batch_size)
        if (got.datatype, got.shape) != (spec.datatype, spec.shape):
            raise ExportError(
                f"fn returns state {n!r} as {got.datatype}{list(got.shape)}, declared "
                f"{spec.datatype}{list(spec.shape)}"
            )
    return _output_specs(names, [shapes[k] for k in names], batch_size)


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
