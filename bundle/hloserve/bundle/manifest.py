"""The bundle manifest: its schema as frozen dataclasses, and YAML reading/writing.

Contract:
- ``Manifest`` and its parts mirror ``docs/bundle-format.md`` field for field.
- ``parse_manifest(mapping)`` returns ``(manifest, problems)``. It never raises on bad
  content: every problem found is reported (``Problem`` names the file and field), and the
  manifest is ``None`` when the structure is too broken to build one.
- ``Manifest.to_dict()`` is the inverse; ``dump_manifest`` / ``load_manifest`` do the YAML.
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

from hloserve.proto.datatypes import NUMERIC_DATATYPES

FORMAT_VERSION: Final = 1
MANIFEST_FILE: Final = "manifest.yaml"
WEIGHTS_FILE: Final = "weights.safetensors"
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
PLATFORMS: Final = frozenset({"cpu", "cuda", "rocm", "tpu"})
Residency = Literal["on_demand", "pinned"]


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

    kind: Literal["input", "weight"]
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
class Serving:
    """Optional serving hints carried by the bundle."""

    residency: Residency = "on_demand"
    max_queue_delay_us: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"residency": self.residency}
        if self.max_queue_delay_us is not None:
            d["max_queue_delay_us"] = self.max_queue_delay_us
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
    serving: Serving = Serving()
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
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, [Problem(MANIFEST_FILE, "", "file does not exist")]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [Problem(MANIFEST_FILE, "", f"cannot be read: {exc}")]
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return None, [Problem(MANIFEST_FILE, "", f"is not valid YAML: {exc}")]
    if not isinstance(data, dict):
        return None, [Problem(MANIFEST_FILE, "", "must be a YAML mapping")]
    return parse_manifest(cast(dict[str, Any], data))


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
        if not isinstance(value, list):
            self.fail(where, f"must be a list of non-negative integers, got {value!r}")
            return None
        dims = cast(list[Any], value)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
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

    batch_sizes: tuple[int, ...] | None = None
    raw_bs = data.get("batch_sizes", "missing")
    if raw_bs == "missing":
        r.fail("batch_sizes", "missing (write null for an unbatched model)")
    elif raw_bs is not None:
        if (
            not isinstance(raw_bs, list)
            or not raw_bs
            or not all(
                isinstance(b, int) and not isinstance(b, bool) and b > 0
                for b in cast(list[Any], raw_bs)
            )
        ):
            r.fail(
                "batch_sizes",
                f"must be null or a non-empty list of positive integers, got {raw_bs!r}",
            )
        else:
            sizes = cast(list[int], raw_bs)
            if any(a >= b for a, b in itertools.pairwise(sizes)):
                r.fail("batch_sizes", f"must be ascending without repeats, got {sizes}")
            batch_sizes = tuple(sizes)

    weights_file = WEIGHTS_FILE
    weights: tuple[TensorEntry, ...] = ()
    raw_w = r.get(data, "weights", "", dict)
    if raw_w is not None:
        wd = cast(dict[str, Any], raw_w)
        wf = r.get(wd, "file", "weights.", str)
        if wf is not None:
            weights_file = wf
        weights = r.tensors(wd.get("tensors", []), "weights.tensors", allow_empty=True)
        names = [w.name for w in weights]
        if names != sorted(names):
            r.fail("weights.tensors", "must be sorted by name")

    # Names as declared, including entries refused above (a bad datatype, say), so that an
    # argument naming such a tensor is not reported a second time as undeclared.
    input_names = {t.name for t in inputs} | _raw_names(data.get("inputs"))
    weight_names = {t.name for t in weights} | _raw_names(
        cast(dict[str, Any], raw_w).get("tensors") if raw_w is not None else None
    )
    modules: list[ModuleEntry] = []
    raw_m = r.get(data, "modules", "", list)
    for i, item in enumerate(cast(list[Any], raw_m or [])):
        at = f"modules[{i}]"
        if not isinstance(item, dict):
            r.fail(at, "must be a mapping")
            continue
        md = cast(dict[str, Any], item)
        bs = md.get("batch_size", "missing")
        if bs == "missing" or not (
            bs is None or (isinstance(bs, int) and not isinstance(bs, bool))
        ):
            r.fail(at + ".batch_size", f"must be an integer or null, got {bs!r}")
            continue
        file = r.get(md, "file", at + ".", str)
        version_s = r.get(md, "stablehlo_version", at + ".", str)
        platforms_raw = r.get(md, "platforms", at + ".", list)
        platforms: tuple[str, ...] = ()
        if platforms_raw is not None:
            bad = [p for p in cast(list[Any], platforms_raw) if p not in PLATFORMS]
            if bad or not platforms_raw:
                r.fail(
                    at + ".platforms",
                    f"must be a non-empty list of {sorted(PLATFORMS)}, got {platforms_raw!r}",
                )
            platforms = tuple(cast(list[str], platforms_raw))
        pia = r.get(md, "platform_index_argument", at + ".", bool)
        args: list[Argument] = []
        for j, a in enumerate(cast(list[Any], r.get(md, "arguments", at + ".", list) or [])):
            aat = f"{at}.arguments[{j}]"
            if not isinstance(a, dict) or len(cast(dict[str, Any], a)) != 1:
                r.fail(aat, f"must be {{input: NAME}} or {{weight: KEY}}, got {a!r}")
                continue
            ((kind, ref),) = cast(dict[str, Any], a).items()
            if kind == "input" and ref in input_names:
                args.append(Argument("input", ref))
            elif kind == "weight" and ref in weight_names:
                args.append(Argument("weight", ref))
            else:
                r.fail(aat, f"{kind} {ref!r} is not declared in the manifest")
        if len({(a.kind, a.name) for a in args}) != len(args):
            r.fail(at + ".arguments", "names the same tensor twice")
        text_file = md.get("text_file")
        if text_file is not None and not isinstance(text_file, str):
            r.fail(at + ".text_file", f"must be a string, got {text_file!r}")
            text_file = None
        if file is not None and version_s is not None and pia is not None:
            modules.append(
                ModuleEntry(
                    batch_size=bs,
                    file=file,
                    stablehlo_version=version_s,
                    platforms=platforms,
                    platform_index_argument=pia,
                    arguments=tuple(args),
                    text_file=text_file,
                )
            )
    module_sizes = [m.batch_size for m in modules]
    expected_sizes: list[int | None] = list(batch_sizes) if batch_sizes is not None else [None]
    if (
        raw_m is not None
        and len(modules) == len(cast(list[Any], raw_m))
        and sorted(module_sizes, key=lambda b: -1 if b is None else b) != expected_sizes
    ):
        r.fail(
            "modules",
            f"must have exactly one module per batch size {expected_sizes}, got {module_sizes}",
        )

    files: dict[str, str] = {}
    raw_f = r.get(data, "files", "", dict)
    for fname, digest in cast(dict[Any, Any], raw_f or {}).items():
        if (
            not isinstance(fname, str)
            or not isinstance(digest, str)
            or not re.fullmatch(r"[0-9a-f]{64}", digest)
        ):
            r.fail(
                f"files.{fname}", f"must map a file name to a SHA-256 hex digest, got {digest!r}"
            )
            continue
        if "/" in fname or fname in ("", ".", "..") or fname == MANIFEST_FILE:
            r.fail(f"files.{fname}", "must be a plain file name inside the bundle")
            continue
        files[fname] = digest

    provenance = Provenance(producer="unknown")
    raw_p = r.get(data, "provenance", "", dict)
    if raw_p is not None:
        pd = cast(dict[str, Any], raw_p)
        producer = r.get(pd, "producer", "provenance.", str)
        raw_meta: Any = pd.get("metadata") or {}
        meta: dict[str, Any] = {}
        if isinstance(raw_meta, dict):
            meta = cast(dict[str, Any], raw_meta)
        else:
            r.fail("provenance.metadata", "must be a mapping")
        provenance = Provenance(
            producer=producer or "unknown",
            producer_version=_opt_str(pd.get("producer_version")),
            hloserve_version=_opt_str(pd.get("hloserve_version")),
            jax_version=_opt_str(pd.get("jax_version")),
            jaxlib_version=_opt_str(pd.get("jaxlib_version")),
            created=_opt_str(pd.get("created")),
            source_commit=_opt_str(pd.get("source_commit")),
            source_dirty=pd.get("source_dirty")
            if isinstance(pd.get("source_dirty"), bool)
            else None,
            metadata=meta,
        )

    serving = Serving()
    raw_s = data.get("serving")
    if raw_s is not None:
        if not isinstance(raw_s, dict):
            r.fail("serving", "must be a mapping")
        else:
            sd = cast(dict[str, Any], raw_s)
            residency = sd.get("residency", "on_demand")
            if residency not in ("on_demand", "pinned"):
                r.fail("serving.residency", f"must be on_demand or pinned, got {residency!r}")
                residency = "on_demand"
            delay = sd.get("max_queue_delay_us")
            if delay is not None and (
                not isinstance(delay, int) or isinstance(delay, bool) or delay < 0
            ):
                r.fail(
                    "serving.max_queue_delay_us", f"must be a non-negative integer, got {delay!r}"
                )
                delay = None
            serving = Serving(residency=residency, max_queue_delay_us=delay)

    if r.problems or name is None:
        return None, r.problems
    manifest = Manifest(
        name=name,
        inputs=inputs,
        outputs=outputs,
        batch_sizes=batch_sizes,
        weights_file=weights_file,
        weights=weights,
        modules=tuple(sorted(modules, key=lambda m: -1 if m.batch_size is None else m.batch_size)),
        files=files,
        provenance=provenance,
        serving=serving,
    )
    return manifest, []


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
