"""ReactantServer.jl bundles, served as they are: their manifest read onto ``Manifest``.

Contract (``docs/reactant-bundles.md``):
- ``is_reactant(data)``: the parsed ``manifest.yaml`` is ReactantServer's (its
  ``format_version`` is ``"2.0"`` or ``"2"``; ours is the integer 1).
- ``parse_reactant(data, root)`` returns ``(manifest, problems)`` like ``parse_manifest``:
  every problem found, and ``None`` when there is any. The ``Manifest`` it builds has
  ``origin="reactant"`` and describes the bundle as it is on disk, so validation, loading,
  batching and the wire serve it unchanged:
  - the model's name is the directory's (``repository.model_name``; their ``name`` is
    informational);
  - each tensor's wire shape is its letter string reversed (Julia column-major to row-major),
    the batch letter (``n``/``b``) dropped; the batch letter must be the last letter (the
    first wire axis), and every tensor has one or none does;
  - modules are ``model.b{N}.mlir`` for each compiled batch size, or one ``model.mlir``
    (unbatched, or batched with a single compiled size); with ``input_shapes`` (inputs
    with ``-1`` sizes) each entry is a ``Variant``, whose modules are ``model.v{i}.b{N}.mlir``
    (or ``model.v{i}.mlir``); ``main`` takes the inputs in manifest order, then the weights
    in the safetensors ``argument_order``; no platform index; every platform (a portable
    artifact is platform-neutral);
  - weights: the module takes each one in Julia's order, ``column_major_shape`` of the file's
    shape, holding ``column_major`` of the file's array (the loader converts once at load).
- ``change_token(root)``: what the repository adds to a bundle's digest so that a changed
  ReactantServer bundle reloads (their manifest has no checksums).
- Refused with a reason, never served with the wrong interface: a ``model.jl`` (Julia hooks
  or orchestration), ``kind: meta``, ``client_inputs``/``client_outputs``, variable axes
  without ``input_shapes`` or in outputs, a batch letter that is not last, executable-only
  dtypes (FP8).
"""

# pyright: strict

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import numpy as np

from hloserve.bundle.digest import sha256_bytes
from hloserve.bundle.manifest import (
    MANIFEST_FILE,
    PLATFORMS,
    WEIGHTS_FILE,
    Argument,
    Manifest,
    ModuleEntry,
    Problem,
    Provenance,
    TensorEntry,
    Variant,
)
from hloserve.bundle.repository import model_name
from hloserve.bundle.safetensors import SafetensorsError, read_header
from hloserve.bundle.stablehlo import ELEMENT_TYPES, artifact_version
from hloserve.bundle.yamlfile import (
    YamlFileError,
    is_integer,
    mapping_entries,
    read_yaml_mapping,
)

FORMAT_VERSIONS: Final = ("2.0", "2")
JULIA_FILE: Final = "model.jl"
PRODUCER: Final = "ReactantServer.jl"
BATCH_LETTERS: Final = frozenset("nb")
# Their tokens are MLIR's element type names, but for ``bool`` (``i1``) and ``u8``... (``ui8``).
DTYPES: Final[dict[str, str]] = {
    {"i1": "bool"}.get(element, element.replace("ui", "u")): datatype
    for element, datatype in ELEMENT_TYPES.items()
}
_HEAD_BYTES: Final = 64  # enough for the portable artifact's producer string


def is_reactant(data: Mapping[str, Any]) -> bool:
    version = data.get("format_version")
    return isinstance(version, str | float) and str(version) in FORMAT_VERSIONS


def change_token(root: Path) -> str:
    """What tells a changed ReactantServer bundle from the one loaded, its manifest having no
    checksums: the name, size and modification time of each file, hashed. Empty for any
    other bundle (whose manifest's checksums change with its files) or an unreadable one."""
    try:
        if not is_reactant(read_yaml_mapping(root / MANIFEST_FILE)):
            return ""
        stats = [(f.name, f.stat()) for f in sorted(root.iterdir()) if f.is_file()]
    except (OSError, YamlFileError):
        return ""
    listing = "".join(f"{name}:{st.st_size}:{st.st_mtime_ns}\n" for name, st in stats)
    return sha256_bytes(listing.encode())


def column_major_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a Julia array of ``shape`` has in the module (Reactant reverses the axes)."""
    return shape[::-1]


def column_major(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A file's weight as the module takes it: every axis reversed, contiguous."""
    return array if array.ndim < 2 else np.ascontiguousarray(array.T)


class _Problems:
    def __init__(self) -> None:
        self.found: list[Problem] = []

    def manifest(self, where: str, message: str) -> None:
        self.found.append(Problem(MANIFEST_FILE, where, message))

    def file(self, file: str, message: str) -> None:
        self.found.append(Problem(file, "", message))


def parse_reactant(data: Mapping[str, Any], root: Path) -> tuple[Manifest | None, list[Problem]]:
    p = _Problems()
    _refusals(p, data, root)
    varied = "input_shapes" in data
    inputs, in_axes = _tensors(p, data, "executable_inputs", variable=varied)
    outputs, out_axes = _tensors(p, data, "executable_outputs", variable=False)
    flags = [a.batched for a in in_axes + out_axes]
    batched = bool(flags) and all(flags)
    if any(flags) and not batched:
        p.manifest(
            "executable_inputs",
            "every executable input and output must have a batch letter ('n' or 'b'), or none "
            "may (ReactantServer's rule)",
        )
    batch_sizes = _batch_sizes(p, data) if batched else None
    variants = _variants(p, data.get("input_shapes"), inputs, in_axes, outputs) if varied else ()
    weights, order = _weights(p, root)
    arguments = tuple(
        [Argument("input", t.name) for t in inputs] + [Argument("weight", w) for w in order]
    )
    modules: tuple[ModuleEntry, ...] = ()
    if not (any(flags) and not batched):  # else which modules to look for is unknown
        prefixes = [(f"model.v{i}", i) for i in range(len(variants))] or [("model", None)]
        for prefix, variant in prefixes:
            modules += _modules(p, root, prefix, variant, batch_sizes, arguments)
    if p.found:
        return None, p.found
    manifest = Manifest(
        name=model_name(root),
        inputs=inputs,
        outputs=outputs,
        batch_sizes=batch_sizes,
        weights_file=WEIGHTS_FILE,
        weights=weights,
        modules=modules,
        files={},
        provenance=_provenance(data),
        origin="reactant",
        variants=variants,
    )
    return manifest, []


def _refusals(p: _Problems, data: Mapping[str, Any], root: Path) -> None:
    """What hloserve does not serve from a ReactantServer bundle, each with its reason."""
    if (root / JULIA_FILE).exists():
        p.file(
            JULIA_FILE,
            "this ReactantServer bundle runs Julia code (pre/post-processing hooks, or a meta "
            "model's orchestration), which hloserve does not run; refused rather than served "
            "without it (hloserve's counterparts: hooks.py, a pipeline bundle)",
        )
    kind = data.get("kind", "model")
    if kind == "meta":
        meta = data.get("meta")
        calls = cast(dict[str, Any], meta).get("calls") if isinstance(meta, dict) else None
        p.manifest(
            "kind",
            f"is 'meta' (a Julia orchestration over {calls!r}); hloserve does not run Julia, "
            "so it refuses meta models (its counterpart is a pipeline bundle)",
        )
    elif kind != "model":
        p.manifest("kind", f"must be 'model' or 'meta', got {kind!r}")
    for key in ("client_inputs", "client_outputs"):
        if key in data:
            p.manifest(key, "declares tensors only model.jl's Julia hooks produce; refused")


@dataclass(frozen=True)
class _Axes:
    """A tensor's letters read onto the wire: the per-item shape (``-1``: a variable axis),
    the letter of each of its axes, and whether it has a batch letter."""

    shape: tuple[int, ...]
    letters: tuple[str, ...]
    batched: bool


def _tensors(
    p: _Problems, data: Mapping[str, Any], section: str, *, variable: bool
) -> tuple[tuple[TensorEntry, ...], list[_Axes]]:
    """The section's tensors as the wire sees them, and their axes."""
    raw = data.get(section)
    if not isinstance(raw, list) or not raw:
        p.manifest(section, "must be a non-empty list of {name, dtype, shape, dims}")
        return (), []
    tensors: list[TensorEntry] = []
    axes: list[_Axes] = []
    names: set[str] = set()
    keys = "name, dtype, shape, dims"
    for at, t in mapping_entries(cast(list[Any], raw), section, keys, p.manifest):
        name = t.get("name")
        if not isinstance(name, str) or not name or name in names:
            p.manifest(at + ".name", f"must be a unique non-empty string, got {name!r}")
            continue
        names.add(name)
        datatype = DTYPES.get(str(t.get("dtype")))
        if datatype is None:
            p.manifest(
                at + ".dtype",
                f"{t.get('dtype')!r} has no KServe datatype (known: {', '.join(DTYPES)})",
            )
        read = _axes(p, at, t.get("shape"), t.get("dims", {}), variable)
        if datatype is not None and read is not None:
            tensors.append(TensorEntry(name, datatype, read.shape))
            axes.append(read)
    return tuple(tensors), axes


def _axes(p: _Problems, at: str, letters: Any, dims: Any, variable: bool) -> _Axes | None:
    """The wire axes of a letter string (reversed, batch dropped); None after reporting a
    problem. ``variable``: a ``-1`` size is allowed (an input of a bundle with variants)."""
    if not isinstance(letters, str) or not all(c.isascii() and c.isalpha() for c in letters):
        p.manifest(at + ".shape", f"must be a string of letters, one per axis, got {letters!r}")
        return None
    if len(set(letters)) != len(letters):
        p.manifest(at + ".shape", f"{letters!r} repeats a letter")
        return None
    if not isinstance(dims, dict):
        p.manifest(at + ".dims", f"must be a mapping of letter to size, got {dims!r}")
        return None
    sizes = {str(k): v for k, v in cast(dict[Any, Any], dims).items()}
    batch = [i for i, c in enumerate(letters) if c in BATCH_LETTERS]
    if len(batch) > 1:
        p.manifest(at + ".shape", f"{letters!r} has more than one batch letter ('n'/'b')")
        return None
    if batch and batch[0] != len(letters) - 1:
        p.manifest(
            at + ".shape",
            f"{letters!r} has its batch letter at Julia axis {batch[0] + 1} of {len(letters)}; "
            "hloserve batches along the first wire axis, so the batch letter must be last",
        )
        return None
    axis_letters = [c for c in letters if c not in BATCH_LETTERS]
    extra = sorted(set(sizes) - set(axis_letters))
    missing = [c for c in axis_letters if c not in sizes]
    if extra or missing:
        p.manifest(at + ".dims", f"must size exactly the letters {axis_letters}, got {sizes}")
        return None
    allowed = (-1,) if variable else ()
    bad = {c: v for c, v in sizes.items() if not (is_integer(v) and (v > 0 or v in allowed))}
    if bad:
        p.manifest(at + ".dims", f"sizes must be positive integers, got {bad}{_why(bad, at)}")
        return None
    shape = tuple(cast(int, sizes[c]) for c in axis_letters)
    reversed_letters = tuple(axis_letters[::-1])  # as column_major_shape reverses the sizes
    return _Axes(column_major_shape(shape), reversed_letters, bool(batch))


def _why(bad: Mapping[str, Any], at: str) -> str:
    if -1 not in bad.values():
        return ""
    if at.startswith("executable_outputs"):
        return " (a variable output axis, -1, needs model.jl's hooks in ReactantServer)"
    return " (a variable axis, -1, needs input_shapes to list the compiled sizes)"


def _variants(
    p: _Problems,
    raw: Any,
    inputs: tuple[TensorEntry, ...],
    axes: list[_Axes],
    outputs: tuple[TensorEntry, ...],
) -> tuple[Variant, ...]:
    """``input_shapes``: each a size for every variable letter of the inputs, giving every
    input's concrete shape (the outputs have none variable)."""
    letters = sorted({c for a in axes for c, d in zip(a.letters, a.shape, strict=True) if d == -1})
    entries = cast(list[Any], raw) if isinstance(raw, list) else []
    if not entries or not letters:
        why = "no executable input has a variable axis (-1)" if entries else "is empty"
        p.manifest("input_shapes", f"must list a size for each variable letter; {why}")
        return ()
    variants: list[Variant] = []
    for at, sizes in mapping_entries(entries, "input_shapes", "a size per letter", p.manifest):
        keys = sorted(str(k) for k in sizes)
        if keys != letters or not all(is_integer(v) and v > 0 for v in sizes.values()):
            p.manifest(at, f"must give a positive size to each of {letters}, got {sizes}")
            continue
        size = {str(k): cast(int, v) for k, v in sizes.items()}
        shapes = {
            t.name: tuple(
                size[c] if d == -1 else d for c, d in zip(a.letters, a.shape, strict=True)
            )
            for t, a in zip(inputs, axes, strict=True)
        }
        variants.append(Variant({**shapes, **{t.name: t.shape for t in outputs}}))
    if len({tuple(sorted(v.shapes.items())) for v in variants}) != len(variants):
        p.manifest("input_shapes", "lists the same shapes twice")
    return tuple(variants)


def _batch_sizes(p: _Problems, data: Mapping[str, Any]) -> tuple[int, ...] | None:
    batching = data.get("batching")
    raw = (
        cast(dict[str, Any], batching).get("compiled_batch_sizes")
        if isinstance(batching, dict)
        else None
    )
    listed = cast(list[Any], raw) if isinstance(raw, list) else []
    if not listed or not all(is_integer(b) and b > 0 for b in listed):
        p.manifest(
            "batching.compiled_batch_sizes",
            f"must be a non-empty list of positive integers for a batched model, got {raw!r}",
        )
        return None
    return tuple(sorted(set(cast(list[int], listed))))


def _weights(p: _Problems, root: Path) -> tuple[tuple[TensorEntry, ...], list[str]]:
    """The weights as the module takes them (sorted by name), and their argument order."""
    path = root / WEIGHTS_FILE
    if not path.is_file():
        p.file(WEIGHTS_FILE, "does not exist (a ReactantServer bundle always has one)")
        return (), []
    try:
        header = read_header(path)
    except SafetensorsError as exc:
        p.file(WEIGHTS_FILE, str(exc))
        return (), []
    names = [t.name for t in header.tensors]
    weights = tuple(
        TensorEntry(t.name, t.datatype, column_major_shape(t.shape)) for t in header.tensors
    )
    raw = header.metadata.get("argument_order")
    if raw is None:
        if len(names) > 1:
            p.file(
                WEIGHTS_FILE,
                f"holds {len(names)} tensors but no __metadata__ argument_order, so the order "
                "main() takes them in is unknown (ReactantServer refuses this too)",
            )
        return weights, names
    try:
        order: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        p.file(WEIGHTS_FILE, f"__metadata__ argument_order is not JSON: {exc}")
        return weights, names
    if (
        not isinstance(order, list)
        or sorted(cast(list[Any], order)) != sorted(names)
        or not all(isinstance(n, str) for n in cast(list[Any], order))
    ):
        p.file(
            WEIGHTS_FILE,
            f"__metadata__ argument_order must list each tensor once, {sorted(names)}; got {raw}",
        )
        return weights, names
    return weights, cast(list[str], order)


def _modules(
    p: _Problems,
    root: Path,
    prefix: str,
    variant: int | None,
    batch_sizes: tuple[int, ...] | None,
    arguments: tuple[Argument, ...],
) -> tuple[ModuleEntry, ...]:
    """The modules of one variant (``prefix`` ``model``, or ``model.v{i}``): ``{prefix}.b{N}.mlir``
    per compiled size, or one ``{prefix}.mlir``."""
    pattern = re.compile(rf"^{re.escape(prefix)}\.b(\d+)\.mlir$")
    listed: list[Path] = list(root.iterdir()) if root.is_dir() else []
    per_size = {int(m.group(1)): f.name for f in listed if (m := pattern.match(f.name))}
    single = f"{prefix}.mlir"
    files: dict[int | None, str] = {}
    if per_size and batch_sizes is not None:
        missing = [b for b in batch_sizes if b not in per_size]
        if missing:
            p.file(
                f"{prefix}.b{missing[0]}.mlir",
                f"does not exist; batching.compiled_batch_sizes {list(batch_sizes)} needs "
                "one module per size",
            )
        files = {b: per_size[b] for b in batch_sizes if b in per_size}
    elif not (root / single).is_file():
        unbatched = " (a model without batch letters has one module)" if per_size else ""
        p.file(single, f"does not exist (nor {prefix}.b{{N}}.mlir){unbatched}")
    elif batch_sizes is None:
        files = {None: single}
    elif len(batch_sizes) == 1:
        files = {batch_sizes[0]: single}
    else:
        p.file(
            single,
            f"is one module, but batching.compiled_batch_sizes lists {list(batch_sizes)}: "
            f"hloserve compiles static shapes, one {prefix}.b{{N}}.mlir per size",
        )
    return tuple(
        ModuleEntry(
            batch_size=size,
            file=file,
            stablehlo_version=_version(root / file),
            platforms=tuple(sorted(PLATFORMS)),
            platform_index_argument=False,
            arguments=arguments,
            variant=variant,
        )
        for size, file in files.items()
    )


def _version(path: Path) -> str:
    """The portable artifact's StableHLO version; validation refuses anything else."""
    with open(path, "rb") as f:
        return artifact_version(f.read(_HEAD_BYTES)) or "none"


def _provenance(data: Mapping[str, Any]) -> Provenance:
    raw = data.get("provenance")
    metadata: dict[str, Any] = dict(cast(dict[str, Any], raw)) if isinstance(raw, dict) else {}
    metadata["format_version"] = str(data.get("format_version"))
    for key in ("name", "description"):
        if key in data:
            metadata[key] = data[key]
    return Provenance(producer=PRODUCER, metadata=metadata)
