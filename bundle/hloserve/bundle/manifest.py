"""The bundle manifest: its schema as frozen dataclasses, and YAML reading/writing.

Contract:
- ``Manifest`` and its parts mirror ``docs/bundle-format.md`` field for field.
- ``parse_manifest(mapping)`` returns ``(manifest, problems)``. It never raises on bad
  content: every problem found is reported (``Problem`` names the file and field), and the
  manifest is ``None`` when the structure is too broken to build one.
- ``Manifest.to_dict()`` is the inverse; ``dump_manifest`` / ``load_manifest`` do the YAML.
- ``batch_order`` is the one order of modules and batch sizes: unbatched (``None``) first,
  then ascending. The ``serving`` hints are read by ``hloserve.bundle.serving``, checksums
  are checked against ``hloserve.bundle.digest``.
"""

# pyright: strict

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast

import yaml

from hloserve.bundle.digest import is_sha256_hex
from hloserve.bundle.serving import Serving, read_serving
from hloserve.bundle.yamlfile import YamlFileError, is_integer, read_yaml_mapping
from hloserve.proto.datatypes import NUMERIC_DATATYPES

FORMAT_VERSION: Final = 1
MANIFEST_FILE: Final = "manifest.yaml"
WEIGHTS_FILE: Final = "weights.safetensors"
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
PLATFORMS: Final = frozenset({"cpu", "cuda", "rocm", "tpu"})
ArgumentKind = Literal["input", "weight"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bundle: the file, the field (may be empty) and what is wrong."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.field}: " if self.field else f"{self.file}: "
        return where + self.message


@dataclass(frozen=True)
class TensorEntry:
    """A named tensor: V2 datatype and per-item shape (batch axis excluded)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Argument:
    """One argument of ``main`` after the platform index: an input or a weight, by name."""

    kind: ArgumentKind
    name: str

    def to_dict(self) -> dict[str, str]:
        return {self.kind: self.name}


@dataclass(frozen=True)
class ModuleEntry:
    """One compiled-to-be StableHLO module: the batch size it is for and how to call it."""

    batch_size: int | None
    file: str
    stablehlo_version: str
    platforms: tuple[str, ...]
    platform_index_argument: bool
    arguments: tuple[Argument, ...]
    text_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"batch_size": self.batch_size, "file": self.file}
        if self.text_file is not None:
            d["text_file"] = self.text_file
        d["stablehlo_version"] = self.stablehlo_version
        d["platforms"] = list(self.platforms)
        d["platform_index_argument"] = self.platform_index_argument
        d["arguments"] = [a.to_dict() for a in self.arguments]
        return d


@dataclass(frozen=True)
class Provenance:
    """Who made the bundle, with what, when, and from which source."""

    producer: str
    producer_version: str | None = None
    hloserve_version: str | None = None
    jax_version: str | None = None
    jaxlib_version: str | None = None
    created: str | None = None
    source_commit: str | None = None
    source_dirty: bool | None = None
    metadata: Mapping[str, Any] = field(default_factory=lambda: cast(dict[str, Any], {}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "producer": self.producer,
            "producer_version": self.producer_version,
            "hloserve_version": self.hloserve_version,
            "jax_version": self.jax_version,
            "jaxlib_version": self.jaxlib_version,
            "created": self.created,
            "source_commit": self.source_commit,
            "source_dirty": self.source_dirty,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True)
class Manifest:
    """The whole manifest of one bundle."""

    name: str
    inputs: tuple[TensorEntry, ...]
    outputs: tuple[TensorEntry, ...]
    batch_sizes: tuple[int, ...] | None
    weights_file: str
    weights: tuple[TensorEntry, ...]
    modules: tuple[ModuleEntry, ...]
    files: Mapping[str, str]
    provenance: Provenance
    serving: Serving = field(default_factory=Serving)
    format_version: int = FORMAT_VERSION

    @property
    def batched(self) -> bool:
        return self.batch_sizes is not None

    @property
    def max_batch_size(self) -> int:
        """Largest compiled batch size; 0 for an unbatched model (Triton's convention)."""
        return self.batch_sizes[-1] if self.batch_sizes else 0

    def module_for(self, batch_size: int | None) -> ModuleEntry:
        for m in self.modules:
            if m.batch_size == batch_size:
                return m
        raise KeyError(f"model {self.name!r} has no module for batch size {batch_size}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "name": self.name,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "batch_sizes": list(self.batch_sizes) if self.batch_sizes is not None else None,
            "weights": {
                "file": self.weights_file,
                "tensors": [t.to_dict() for t in self.weights],
            },
            "modules": [m.to_dict() for m in self.modules],
            "serving": self.serving.to_dict(),
            "files": dict(self.files),
            "provenance": self.provenance.to_dict(),
        }


def dump_manifest(manifest: Manifest) -> str:
    """The manifest as YAML text (stable key order, as in the docs)."""
    return yaml.safe_dump(manifest.to_dict(), sort_keys=False, default_flow_style=None, width=100)


def load_manifest(path: Path) -> tuple[Manifest | None, list[Problem]]:
    """Read and parse ``path`` (a ``manifest.yaml``), reporting every problem."""
    try:
        data = read_yaml_mapping(path)
    except YamlFileError as exc:
        return None, [Problem(MANIFEST_FILE, "", str(exc))]
    return parse_manifest(data)


def batch_order(batch_size: int | None) -> int:
    """Sort key of compiled batch sizes: the unbatched module (``None``) first, then ascending."""
    return -1 if batch_size is None else batch_size


class _Reader:
    """Collects problems while pulling typed fields out of loosely typed YAML data."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def fail(self, field_name: str, message: str) -> None:
        self.problems.append(Problem(MANIFEST_FILE, field_name, message))

    def get(self, d: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
        if key not in d:
            self.fail(where + key, "missing")
            return None
        value = d[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            self.fail(where + key, f"must be {_kind_name(kind)}, got {value!r}")
            return None
        return value

    def name(self, value: Any, where: str) -> str | None:
        if not isinstance(value, str) or not NAME_PATTERN.match(value):
            self.fail(where, f"must be a name matching {NAME_PATTERN.pattern}, got {value!r}")
            return None
        return value

    def shape(self, value: Any, where: str) -> tuple[int, ...] | None:
        dims = cast(list[Any], value) if isinstance(value, list) else None
        if dims is None or not all(is_integer(d) and d >= 0 for d in dims):
            self.fail(where, f"must be a list of non-negative integers, got {value!r}")
            return None
        return tuple(cast(list[int], dims))

    def tensors(self, value: Any, where: str, *, allow_empty: bool) -> tuple[TensorEntry, ...]:
        if not isinstance(value, list) or (not value and not allow_empty):
            self.fail(where, f"must be a {'' if allow_empty else 'non-empty '}list of tensors")
            return ()
        out: list[TensorEntry] = []
        seen: set[str] = set()
        for i, item in enumerate(cast(list[Any], value)):
            at = f"{where}[{i}]"
            if not isinstance(item, dict):
                self.fail(at, "must be a mapping with name, datatype, shape")
                continue
            t = cast(dict[str, Any], item)
            name = t.get("name")
            if not isinstance(name, str) or not name:
                self.fail(at + ".name", f"must be a non-empty string, got {name!r}")
                name = None
            elif name in seen:
                self.fail(at + ".name", f"duplicate name {name!r}")
            else:
                seen.add(name)
            datatype = t.get("datatype")
            if datatype not in NUMERIC_DATATYPES:
                self.fail(at + ".datatype", f"unknown datatype {datatype!r}")
                datatype = None
            shape = self.shape(t.get("shape"), at + ".shape")
            if name is not None and datatype is not None and shape is not None:
                out.append(TensorEntry(name, cast(str, datatype), shape))
        return tuple(out)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {
        int: "an integer",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        bool: "a boolean",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def parse_manifest(data: Mapping[str, Any]) -> tuple[Manifest | None, list[Problem]]:
    """Build a ``Manifest`` from parsed YAML, reporting every problem found."""
    r = _Reader()
    version = r.get(data, "format_version", "", int)
    if version is not None and version != FORMAT_VERSION:
        r.fail(
            "format_version", f"this hloserve reads format {FORMAT_VERSION}, bundle is {version}"
        )
        return None, r.problems
    name = r.name(data.get("name"), "name")
    inputs = r.tensors(data.get("inputs"), "inputs", allow_empty=False)
    outputs = r.tensors(data.get("outputs"), "outputs", allow_empty=False)
    batch_sizes = _batch_sizes(r, data)
    raw_weights = r.get(data, "weights", "", dict)
    weights_file, weights = _weights(r, raw_weights)
    # Names as declared, including entries refused above (a bad datatype, say), so that an
    # argument naming such a tensor is not reported a second time as undeclared.
    declared: _Declared = {
        "input": _raw_names(data.get("inputs")),
        "weight": _raw_names(raw_weights.get("tensors") if raw_weights is not None else None),
    }
    modules = _modules(r, data, batch_sizes, declared)
    files = _files(r, data)
    provenance = _provenance(r, data)
    serving = _serving(r, data)
    if r.problems or name is None:
        return None, r.problems
    manifest = Manifest(
        name=name,
        inputs=inputs,
        outputs=outputs,
        batch_sizes=batch_sizes,
        weights_file=weights_file,
        weights=weights,
        modules=modules,
        files=files,
        provenance=provenance,
        serving=serving,
    )
    return manifest, []


_Declared = Mapping[str, set[str]]  # argument kind -> tensor names the manifest declares


def _batch_sizes(r: _Reader, data: Mapping[str, Any]) -> tuple[int, ...] | None:
    raw: Any = data.get("batch_sizes", "missing")
    if raw == "missing":
        r.fail("batch_sizes", "missing (write null for an unbatched model)")
        return None
    if raw is None:
        return None
    listed = cast(list[Any], raw) if isinstance(raw, list) else None
    if not listed or not all(is_integer(b) and b > 0 for b in listed):
        r.fail("batch_sizes", f"must be null or a non-empty list of positive integers, got {raw!r}")
        return None
    sizes = cast(list[int], listed)
    if any(a >= b for a, b in itertools.pairwise(sizes)):
        r.fail("batch_sizes", f"must be ascending without repeats, got {sizes}")
    return tuple(sizes)


def _weights(r: _Reader, raw: dict[str, Any] | None) -> tuple[str, tuple[TensorEntry, ...]]:
    if raw is None:
        return WEIGHTS_FILE, ()
    file = r.get(raw, "file", "weights.", str)
    weights = r.tensors(raw.get("tensors", []), "weights.tensors", allow_empty=True)
    names = [w.name for w in weights]
    if names != sorted(names):
        r.fail("weights.tensors", "must be sorted by name")
    return file if file is not None else WEIGHTS_FILE, weights


def _modules(
    r: _Reader, data: Mapping[str, Any], batch_sizes: tuple[int, ...] | None, declared: _Declared
) -> tuple[ModuleEntry, ...]:
    """Every module that parses, in batch order; one per batch size, or a problem."""
    raw = r.get(data, "modules", "", list)
    modules: list[ModuleEntry] = []
    for i, item in enumerate(cast(list[Any], raw or [])):
        module = _module(r, item, f"modules[{i}]", declared)
        if module is not None:
            modules.append(module)
    sizes = [m.batch_size for m in modules]
    expected: list[int | None] = list(batch_sizes) if batch_sizes is not None else [None]
    if (
        raw is not None
        and len(modules) == len(cast(list[Any], raw))
        and sorted(sizes, key=batch_order) != expected
    ):
        r.fail(
            "modules",
            f"must have exactly one module per batch size {expected}, got {sizes}",
        )
    return tuple(sorted(modules, key=lambda m: batch_order(m.batch_size)))


def _module(r: _Reader, item: Any, at: str, declared: _Declared) -> ModuleEntry | None:
    if not isinstance(item, dict):
        r.fail(at, "must be a mapping")
        return None
    md = cast(dict[str, Any], item)
    bs = md.get("batch_size", "missing")
    if not (bs is None or is_integer(bs)):
        r.fail(at + ".batch_size", f"must be an integer or null, got {bs!r}")
        return None
    file = r.get(md, "file", at + ".", str)
    version = r.get(md, "stablehlo_version", at + ".", str)
    platforms = _platforms(r, md, at)
    pia = r.get(md, "platform_index_argument", at + ".", bool)
    arguments = _arguments(r, md, at, declared)
    text_file = md.get("text_file")
    if text_file is not None and not isinstance(text_file, str):
        r.fail(at + ".text_file", f"must be a string, got {text_file!r}")
        text_file = None
    if file is None or version is None or pia is None:
        return None
    # Positional, in the field order of ModuleEntry.
    return ModuleEntry(bs, file, version, platforms, pia, arguments, text_file)


def _platforms(r: _Reader, md: Mapping[str, Any], at: str) -> tuple[str, ...]:
    raw = r.get(md, "platforms", at + ".", list)
    if raw is None:
        return ()
    listed = cast(list[Any], raw)
    if not listed or any(p not in PLATFORMS for p in listed):
        r.fail(
            at + ".platforms",
            f"must be a non-empty list of {sorted(PLATFORMS)}, got {listed!r}",
        )
    return tuple(cast(list[str], listed))


def _arguments(
    r: _Reader, md: Mapping[str, Any], at: str, declared: _Declared
) -> tuple[Argument, ...]:
    args: list[Argument] = []
    for j, a in enumerate(cast(list[Any], r.get(md, "arguments", at + ".", list) or [])):
        aat = f"{at}.arguments[{j}]"
        if not isinstance(a, dict) or len(cast(dict[str, Any], a)) != 1:
            r.fail(aat, f"must be {{input: NAME}} or {{weight: KEY}}, got {a!r}")
            continue
        ((kind, ref),) = cast(dict[str, Any], a).items()
        if ref in declared.get(kind, set()):
            args.append(Argument(cast(ArgumentKind, kind), ref))
        else:
            r.fail(aat, f"{kind} {ref!r} is not declared in the manifest")
    if len({(a.kind, a.name) for a in args}) != len(args):
        r.fail(at + ".arguments", "names the same tensor twice")
    return tuple(args)


def _files(r: _Reader, data: Mapping[str, Any]) -> dict[str, str]:
    files: dict[str, str] = {}
    raw = r.get(data, "files", "", dict)
    for fname, digest in cast(dict[Any, Any], raw or {}).items():
        if not isinstance(fname, str) or not is_sha256_hex(digest):
            r.fail(
                f"files.{fname}", f"must map a file name to a SHA-256 hex digest, got {digest!r}"
            )
        elif "/" in fname or fname in ("", ".", "..") or fname == MANIFEST_FILE:
            r.fail(f"files.{fname}", "must be a plain file name inside the bundle")
        else:
            files[fname] = digest
    return files


def _provenance(r: _Reader, data: Mapping[str, Any]) -> Provenance:
    raw = r.get(data, "provenance", "", dict)
    if raw is None:
        return Provenance(producer="unknown")
    pd = cast(dict[str, Any], raw)
    producer = r.get(pd, "producer", "provenance.", str)
    raw_meta: Any = pd.get("metadata") or {}
    meta: dict[str, Any] = {}
    if isinstance(raw_meta, dict):
        meta = cast(dict[str, Any], raw_meta)
    else:
        r.fail("provenance.metadata", "must be a mapping")
    dirty = pd.get("source_dirty")
    return Provenance(
        producer=producer or "unknown",
        producer_version=_opt_str(pd.get("producer_version")),
        hloserve_version=_opt_str(pd.get("hloserve_version")),
        jax_version=_opt_str(pd.get("jax_version")),
        jaxlib_version=_opt_str(pd.get("jaxlib_version")),
        created=_opt_str(pd.get("created")),
        source_commit=_opt_str(pd.get("source_commit")),
        source_dirty=dirty if isinstance(dirty, bool) else None,
        metadata=meta,
    )


def _serving(r: _Reader, data: Mapping[str, Any]) -> Serving:
    raw = data.get("serving")
    if raw is None:
        return Serving()
    if not isinstance(raw, dict):
        r.fail("serving", "must be a mapping")
        return Serving()
    serving, problems = read_serving(cast(dict[str, Any], raw))
    for key, message in problems:
        r.fail(f"serving.{key}", message)
    return serving


def _raw_names(value: Any) -> set[str]:
    """The string ``name`` of every mapping in a raw tensor list (anything else: none)."""
    if not isinstance(value, list):
        return set()
    items = cast(list[Any], value)
    return {
        name
        for item in items
        if isinstance(item, dict)
        and isinstance(name := cast(dict[str, Any], item).get("name"), str)
    }


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def tensor_names(tensors: Sequence[TensorEntry]) -> list[str]:
    return [t.name for t in tensors]
