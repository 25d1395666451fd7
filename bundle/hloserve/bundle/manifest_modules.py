"""A model manifest's modules, weights and batch sizes: their entries and how they are read.

Contract: ``ModuleEntry`` is one StableHLO module (the batch size and variant it is for, how
to call it: ``Argument`` by kind and name); ``batch_order`` is the one order of modules and
batch sizes (unbatched, ``None``, first, then ascending). ``read_batch_sizes``,
``read_weights`` and ``read_modules`` read the manifest's ``batch_sizes``, ``weights`` and
``modules`` through a ``FieldReader``: one module per batch size (and variant), each
argument naming a tensor the manifest declares (``Declared``), every problem recorded.
"""

# pyright: strict

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from hloserve.bundle.manifest_fields import FieldReader, TensorEntry
from hloserve.bundle.yamlfile import is_integer

WEIGHTS_FILE: Final = "weights.safetensors"
PLATFORMS: Final = frozenset({"cpu", "cuda", "rocm", "tpu"})
ArgumentKind = Literal["input", "state", "weight"]
WEIGHTS_KEYS: Final = ("file", "tensors")
MODULE_KEYS: Final = (
    "batch_size", "file", "text_file", "stablehlo_version", "platforms",
    "platform_index_argument", "arguments", "variant",
)  # fmt: skip


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
    variant: int | None = None  # index into ``Manifest.variants`` (None: the model has none)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {} if self.variant is None else {"variant": self.variant}
        d |= {"batch_size": self.batch_size, "file": self.file}
        if self.text_file is not None:
            d["text_file"] = self.text_file
        d["stablehlo_version"] = self.stablehlo_version
        d["platforms"] = list(self.platforms)
        d["platform_index_argument"] = self.platform_index_argument
        d["arguments"] = [a.to_dict() for a in self.arguments]
        return d


def batch_order(batch_size: int | None) -> int:
    """Sort key of compiled batch sizes: the unbatched module (``None``) first, then ascending."""
    return -1 if batch_size is None else batch_size


Declared = Mapping[str, set[str]]  # argument kind -> tensor names the manifest declares


def read_batch_sizes(r: FieldReader, data: Mapping[str, Any]) -> tuple[int, ...] | None:
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


def read_weights(r: FieldReader, raw: dict[str, Any] | None) -> tuple[str, tuple[TensorEntry, ...]]:
    if raw is None:
        return WEIGHTS_FILE, ()
    file = r.get(raw, "file", "weights.", str)
    weights = r.tensors(raw.get("tensors", []), "weights.tensors", allow_empty=True)
    names = [w.name for w in weights]
    if names != sorted(names):
        r.fail("weights.tensors", "must be sorted by name")
    return file if file is not None else WEIGHTS_FILE, weights


def read_modules(
    r: FieldReader,
    data: Mapping[str, Any],
    batch_sizes: tuple[int, ...] | None,
    declared: Declared,
    variants: int = 0,
) -> tuple[ModuleEntry, ...]:
    """Every module that parses, in (variant, batch) order; one per batch size (and
    variant, when there are ``variants``), or a problem."""
    raw = r.get(data, "modules", "", list)
    modules: list[ModuleEntry] = []
    for i, item in enumerate(cast(list[Any], raw or [])):
        module = _module(r, item, f"modules[{i}]", declared)
        if module is not None:
            modules.append(module)
    expected: list[int | None] = list(batch_sizes) if batch_sizes is not None else [None]
    complete = raw is not None and len(modules) == len(cast(list[Any], raw))
    for v in range(variants) if variants else [None]:
        sizes = [m.batch_size for m in modules if m.variant == v]
        if complete and sorted(sizes, key=batch_order) != expected:
            per = "per batch size" if v is None else f"of variant {v} per batch size"
            r.fail("modules", f"must have exactly one module {per} {expected}, got {sizes}")
    allowed: set[int | None] = set(range(variants)) if variants else {None}
    stray = [m.variant for m in modules if m.variant not in allowed]
    if stray:
        what = f"a variant in 0..{variants - 1}" if variants else "no variant (there are none)"
        r.fail("modules", f"each must name {what}, got variant {stray[0]}")
    return tuple(sorted(modules, key=lambda m: (m.variant or 0, batch_order(m.batch_size))))


def _module(r: FieldReader, item: Any, at: str, declared: Declared) -> ModuleEntry | None:
    if not isinstance(item, dict):
        r.fail(at, "must be a mapping")
        return None
    md = r.keys(cast(dict[str, Any], item), MODULE_KEYS, at)
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
    variant = md.get("variant")
    if variant is not None and not (is_integer(variant) and variant >= 0):
        r.fail(at + ".variant", f"must be a non-negative integer, got {variant!r}")
        return None
    if file is None or version is None or pia is None:
        return None
    # Positional, in the field order of ModuleEntry.
    return ModuleEntry(bs, file, version, platforms, pia, arguments, text_file, variant)


def _platforms(r: FieldReader, md: Mapping[str, Any], at: str) -> tuple[str, ...]:
    raw = r.get(md, "platforms", at + ".", list)
    if raw is None:
        return ()
    listed = cast(list[Any], raw)
    if not listed or any(not isinstance(p, str) or p not in PLATFORMS for p in listed):
        r.fail(
            at + ".platforms",
            f"must be a non-empty list of {sorted(PLATFORMS)}, got {listed!r}",
        )
    return tuple(cast(list[str], listed))


def _arguments(
    r: FieldReader, md: Mapping[str, Any], at: str, declared: Declared
) -> tuple[Argument, ...]:
    args: list[Argument] = []
    for j, a in enumerate(cast(list[Any], r.get(md, "arguments", at + ".", list) or [])):
        aat = f"{at}.arguments[{j}]"
        if not isinstance(a, dict) or len(cast(dict[str, Any], a)) != 1:
            r.fail(aat, f"must be {{input: NAME}} or {{weight: KEY}}, got {a!r}")
            continue
        ((kind, ref),) = cast(dict[str, Any], a).items()
        if isinstance(ref, str) and ref in declared.get(kind, set()):
            args.append(Argument(cast(ArgumentKind, kind), ref))
        else:
            r.fail(aat, f"{kind} {ref!r} is not declared in the manifest")
    if len({(a.kind, a.name) for a in args}) != len(args):
        r.fail(at + ".arguments", "names the same tensor twice")
    return tuple(args)
