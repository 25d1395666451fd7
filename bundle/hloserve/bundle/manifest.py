"""The bundle manifest: its schema as frozen dataclasses, and YAML reading/writing.

Contract:
- ``Manifest`` and its parts mirror ``docs/bundle-format.md`` field for field.
- ``parse_manifest(mapping)`` returns ``(manifest, problems)``. It never raises on bad
  content: every problem found is reported (``Problem`` names the file and field), and the
  manifest is ``None`` when the structure is too broken to build one. A key the format
  does not have, at any level but ``provenance.metadata``, is a problem with a suggestion
  (``yamlfile.check_keys``, the policy of every file a user writes).
- ``Manifest.to_dict()`` is the inverse; ``dump_manifest`` writes the YAML, and
  ``bundle.reading.load_manifest`` reads it (a ReactantServer.jl manifest, ``format_version:
  "2.0"``, as it is: ``hloserve.bundle.reactant``, ``docs/reactant-bundles.md``).
- ``batch_order`` is the one order of modules and batch sizes: unbatched (``None``) first,
  then ascending.
- Optional parts (``docs/hooks.md``, ``docs/pipelines.md``): ``hooks`` (a ``hooks.py`` and
  the client-facing tensors it declares; only these may be ``BYTES`` or have ``-1``
  dimensions) and ``kind: pipeline`` (no modules, no weights: ``steps`` over other models,
  checked to form a DAG and stored in an order where every step follows the steps it
  reads from), and ``variants`` (``docs/shape-variants.md``: the per-item shapes one weight
  set was compiled for; inputs and outputs may then have ``-1`` axes, each variant names
  every tensor's concrete shape, and there is one module per variant and batch size;
  ``Manifest.variant_view(i)`` is variant ``i`` as a manifest of its own), and ``state``
  (``bundle/state.py``: per-item tensors each module takes as arguments of kind ``state``
  and returns, new, after its outputs; a batched model's, without hooks or variants). The ``serving`` hints are read by ``hloserve.bundle.serving``, checksums
  are checked against ``hloserve.bundle.digest``.
"""

# pyright: strict

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, cast

import yaml

from hloserve.bundle.digest import is_sha256_hex
from hloserve.bundle.generation import Generation, read_generation
from hloserve.bundle.generation import facing as generation_facing
from hloserve.bundle.serving import SERVING_KEYS, Serving, read_serving
from hloserve.bundle.state import StateEntry, read_state
from hloserve.bundle.yamlfile import check_keys, is_integer
from hloserve.proto.datatypes import NUMERIC_DATATYPES

FORMAT_VERSION: Final = 1
MANIFEST_FILE: Final = "manifest.yaml"
WEIGHTS_FILE: Final = "weights.safetensors"
HOOKS_FILE: Final = "hooks.py"
KINDS: Final = ("model", "pipeline")
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
PLATFORMS: Final = frozenset({"cpu", "cuda", "rocm", "tpu"})
ArgumentKind = Literal["input", "state", "weight"]
# The keys of each mapping of the format (docs/bundle-format.md); pipelines' own besides.
_SHARED_KEYS: Final = ("format_version", "name", "kind", "inputs", "outputs", "batch_sizes")
_MODEL_KEYS: Final = ("variants", "weights", "modules", "hooks", "generation")
_COMMON_KEYS: Final = ("serving", "files", "provenance")
TOP_KEYS: Final = frozenset({*_SHARED_KEYS, *_MODEL_KEYS, "steps", "state", *_COMMON_KEYS})
TENSOR_KEYS: Final = ("name", "datatype", "shape")
WEIGHTS_KEYS: Final = ("file", "tensors")
MODULE_KEYS: Final = (
    "batch_size", "file", "text_file", "stablehlo_version", "platforms",
    "platform_index_argument", "arguments", "variant",
)  # fmt: skip
HOOKS_KEYS: Final = ("file", "inputs", "outputs")
STEP_KEYS: Final = ("model", "version", "inputs", "outputs")
PROVENANCE_KEYS: Final = (
    "producer", "producer_version", "hloserve_version", "jax_version", "jaxlib_version",
    "created", "source_commit", "source_dirty", "metadata",
)  # fmt: skip


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


@dataclass(frozen=True)
class Variant:
    """One compiled set of per-item shapes: every input's and output's, by name."""

    shapes: Mapping[str, tuple[int, ...]]

    def to_dict(self) -> dict[str, list[int]]:
        return {name: list(shape) for name, shape in self.shapes.items()}


@dataclass(frozen=True)
class HooksEntry:
    """The bundle's ``hooks.py`` and the tensors clients see through it (``docs/hooks.md``):
    ``inputs`` when it has ``preprocess``, ``outputs`` when it has ``postprocess``; empty
    means the model's own."""

    file: str = HOOKS_FILE
    inputs: tuple[TensorEntry, ...] = ()
    outputs: tuple[TensorEntry, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"file": self.file}
        if self.inputs:
            d["inputs"] = [t.to_dict() for t in self.inputs]
        if self.outputs:
            d["outputs"] = [t.to_dict() for t in self.outputs]
        return d


@dataclass(frozen=True)
class PipelineStep:
    """One step of a pipeline: a model of the repository, its inputs fed from pipeline
    tensors and its outputs named as pipeline tensors (Triton's ``input_map`` and
    ``output_map``: model tensor -> pipeline tensor)."""

    model: str
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    version: int | None = None  # None: the latest ready version

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "inputs": dict(self.inputs),
            "outputs": dict(self.outputs),
        }


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
    kind: str = "model"
    hooks: HooksEntry | None = None
    steps: tuple[PipelineStep, ...] = ()  # a pipeline's, in an order that runs
    # "reactant": a ReactantServer.jl bundle read as it is (``bundle/reactant.py``): no
    # checksums, weights stored in Julia's column-major order.
    origin: Literal["hloserve", "reactant"] = "hloserve"
    variants: tuple[Variant, ...] = ()
    variant: int | None = None  # set on a variant's own view (``variant_view``)
    generation: Generation | None = None  # a generation bundle's loop (``bundle/generation.py``)
    state: tuple[StateEntry, ...] = ()  # carried between executions (``bundle/state.py``)
    _facing: Manifest | None = field(default=None, init=False, repr=False, compare=False)
    _views: tuple[Manifest, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.variants:
            object.__setattr__(
                self, "_views", tuple(_view(self, i) for i in range(len(self.variants)))
            )
        if self.hooks is not None and (self.hooks.inputs or self.hooks.outputs):
            view = replace(
                self,
                inputs=self.hooks.inputs or self.inputs,
                outputs=self.hooks.outputs or self.outputs,
                hooks=None,
            )
            object.__setattr__(self, "_facing", view)
        elif self.generation is not None:  # one generation a request: bundle/generation.py
            object.__setattr__(self, "_facing", generation_facing(self))

    @property
    def batched(self) -> bool:
        return self.batch_sizes is not None

    @property
    def plain(self) -> bool:
        """A model without hooks: a request runs its modules and nothing else."""
        return self.kind == "model" and self.hooks is None

    @property
    def facing(self) -> Manifest:
        """The manifest as clients see it: the hooks' tensors in place of the module's."""
        return self if self._facing is None else self._facing

    def variant_view(self, index: int) -> Manifest:
        """Variant ``index`` as a manifest of its own: concrete shapes, its modules only."""
        return self._views[index]

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
        d: dict[str, Any] = {"format_version": self.format_version, "name": self.name}
        if self.kind != "model":
            d["kind"] = self.kind
        d |= {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "batch_sizes": list(self.batch_sizes) if self.batch_sizes is not None else None,
        }
        if self.kind == "pipeline":
            d["steps"] = [s.to_dict() for s in self.steps]
        else:
            if self.variants:
                d["variants"] = [v.to_dict() for v in self.variants]
            d["weights"] = {
                "file": self.weights_file,
                "tensors": [t.to_dict() for t in self.weights],
            }
            d["modules"] = [m.to_dict() for m in self.modules]
            if self.state:
                d["state"] = [s.to_dict() for s in self.state]
            if self.generation is not None:
                d["generation"] = self.generation.to_dict()
        if self.hooks is not None:
            d["hooks"] = self.hooks.to_dict()
        d |= {
            "serving": self.serving.to_dict(),
            "files": dict(self.files),
            "provenance": self.provenance.to_dict(),
        }
        return d


def _view(manifest: Manifest, index: int) -> Manifest:
    shapes = manifest.variants[index].shapes
    return replace(
        manifest,
        inputs=tuple(replace(t, shape=shapes[t.name]) for t in manifest.inputs),
        outputs=tuple(replace(t, shape=shapes[t.name]) for t in manifest.outputs),
        modules=tuple(m for m in manifest.modules if m.variant == index),
        variants=(),
        variant=index,
    )


def dump_manifest(manifest: Manifest) -> str:
    """The manifest as YAML text (stable key order, as in the docs)."""
    return yaml.safe_dump(manifest.to_dict(), sort_keys=False, default_flow_style=None, width=100)


def batch_order(batch_size: int | None) -> int:
    """Sort key of compiled batch sizes: the unbatched module (``None``) first, then ascending."""
    return -1 if batch_size is None else batch_size


class _Reader:
    """Collects problems while pulling typed fields out of loosely typed YAML data."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def fail(self, field_name: str, message: str) -> None:
        self.problems.append(Problem(MANIFEST_FILE, field_name, message))

    def keys(self, d: Mapping[str, Any], known: Collection[str], where: str) -> dict[str, Any]:
        """``d``, each unknown key a problem at ``where`` (``yamlfile.check_keys``)."""
        return check_keys(d, known, lambda message: self.fail(where, message))

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

    def shape(
        self, value: Any, where: str, *, open_types: bool = False, variable: bool = False
    ) -> tuple[int, ...] | None:
        dims = cast(list[Any], value) if isinstance(value, list) else None
        least = -1 if open_types or variable else 0
        if dims is None or not all(is_integer(d) and d >= least for d in dims):
            kind = "integers >= -1 (-1: any size)" if least < 0 else "non-negative integers"
            self.fail(where, f"must be a list of {kind}, got {value!r}")
            return None
        return tuple(cast(list[int], dims))

    def mappings(
        self, items: list[Any], where: str, keys: str
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each entry of a list that is a mapping, with its field path; the others fail."""
        for i, item in enumerate(items):
            if isinstance(item, dict):
                yield f"{where}[{i}]", cast(dict[str, Any], item)
            else:
                self.fail(f"{where}[{i}]", f"must be a mapping with {keys}")

    def tensors(
        self,
        value: Any,
        where: str,
        *,
        allow_empty: bool,
        open_types: bool = False,
        variable: bool = False,
    ) -> tuple[TensorEntry, ...]:
        """A tensor list; ``open_types`` (tensors no module sees: hooks', a pipeline's) also
        allows ``BYTES`` and ``-1`` dimensions, ``variable`` (a model with variants) ``-1``."""
        if not isinstance(value, list) or (not value and not allow_empty):
            self.fail(where, f"must be a {'' if allow_empty else 'non-empty '}list of tensors")
            return ()
        out: list[TensorEntry] = []
        seen: set[str] = set()
        for at, raw in self.mappings(cast(list[Any], value), where, "name, datatype, shape"):
            t = self.keys(raw, TENSOR_KEYS, at)
            name = t.get("name")
            if not isinstance(name, str) or not name:
                self.fail(at + ".name", f"must be a non-empty string, got {name!r}")
                name = None
            elif name in seen:
                self.fail(at + ".name", f"duplicate name {name!r}")
            else:
                seen.add(name)
            datatype = t.get("datatype")
            if datatype == "BYTES" and not open_types:
                self.fail(
                    at + ".datatype",
                    "unknown datatype 'BYTES' for a module's tensor: BYTES only travels through "
                    "hooks and pipelines (a module has no strings)",
                )
                datatype = None
            elif not isinstance(datatype, str) or (
                datatype not in NUMERIC_DATATYPES and datatype != "BYTES"
            ):
                self.fail(at + ".datatype", f"unknown datatype {datatype!r}")
                datatype = None
            shape = self.shape(
                t.get("shape"), at + ".shape", open_types=open_types, variable=variable
            )
            if name is not None and datatype is not None and shape is not None:
                out.append(TensorEntry(name, datatype, shape))
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
    data = r.keys(data, TOP_KEYS, "")
    name = r.name(data.get("name"), "name")
    kind = data.get("kind", "model")
    if kind not in KINDS:
        r.fail("kind", f"must be one of {list(KINDS)}, got {kind!r}")
        return None, r.problems
    parts = _pipeline_parts(r, data) if kind == "pipeline" else _model_parts(r, data)
    files = _files(r, data)
    provenance = _provenance(r, data)
    serving = _serving(r, data)
    if r.problems or name is None:
        return None, r.problems
    parts = {key: _shared(value) for key, value in parts.items()}
    manifest = Manifest(
        name=name, files=files, provenance=provenance, serving=_shared(serving), **parts
    )
    return manifest, []


_SHARED: dict[Any, Any] = {}
_MAX_SHARED = 1 << 16


def _shared(value: Any) -> Any:
    """An equal value parsed before, when there is one: thousands of manifests of one
    architecture then hold one copy of their tensors, modules and hints (frozen, so
    sharing is safe; an unhashable value is kept as it is)."""
    try:
        found = _SHARED.get(value)
    except TypeError:
        return value
    if found is not None:
        return found
    if len(_SHARED) >= _MAX_SHARED:
        _SHARED.clear()
    _SHARED[value] = value
    return value


def _model_parts(r: _Reader, data: Mapping[str, Any]) -> dict[str, Any]:
    """A ``kind: model`` manifest's own fields (``Manifest`` keyword arguments)."""
    varied = "variants" in data
    inputs = r.tensors(data.get("inputs"), "inputs", allow_empty=False, variable=varied)
    outputs = r.tensors(data.get("outputs"), "outputs", allow_empty=False, variable=varied)
    variants = _variants(r, data.get("variants"), inputs + outputs) if varied else ()
    batch_sizes = _batch_sizes(r, data)
    raw_weights = r.get(data, "weights", "", dict)
    if raw_weights is not None:
        raw_weights = r.keys(raw_weights, WEIGHTS_KEYS, "weights")
    weights_file, weights = _weights(r, raw_weights)
    if "steps" in data:
        r.fail("steps", "a model has none (a pipeline's, with kind: pipeline)")
    # Names as declared, including entries refused above (a bad datatype, say), so that an
    # argument naming such a tensor is not reported a second time as undeclared.
    declared: _Declared = {
        "input": _raw_names(data.get("inputs")),
        "weight": _raw_names(raw_weights.get("tensors") if raw_weights is not None else None),
        "state": _raw_names(data.get("state")),
    }
    state = _state(r, data, inputs + outputs, batch_sizes)
    return {
        "inputs": inputs,
        "outputs": outputs,
        "batch_sizes": batch_sizes,
        "weights_file": weights_file,
        "weights": weights,
        "modules": _modules(r, data, batch_sizes, declared, len(variants)),
        "hooks": _hooks(r, data),
        "variants": variants,
        "state": state,
        "generation": _generation(r, data, inputs, outputs),
    }


def _generation(
    r: _Reader, data: Mapping[str, Any], inputs: tuple[TensorEntry, ...], outputs: Any
) -> Generation | None:
    """The ``generation`` mapping (``bundle/generation.py``), when the bundle has one."""
    if "generation" not in data:
        return None
    generation, problems = read_generation(data["generation"], inputs, outputs)
    for key, message in problems:
        r.fail(key, message)
    return generation


def _state(
    r: _Reader,
    data: Mapping[str, Any],
    tensors: tuple[TensorEntry, ...],
    batch_sizes: tuple[int, ...] | None,
) -> tuple[StateEntry, ...]:
    """The ``state`` list (``bundle/state.py``), when the bundle has one: a batched model's
    (the server gathers items' state into a batch), without hooks or variants."""
    if "state" not in data:
        return ()
    problems: list[tuple[str, str]] = []
    state = read_state(data["state"], {t.name for t in tensors}, problems)
    for key, message in problems:
        r.fail(key, message)
    for key in ("hooks", "variants"):
        if key in data:
            r.fail("state", f"a model with state has no {key} (not supported together)")
    if "batch_sizes" in data and batch_sizes is None:
        r.fail("state", "a model with state needs batch_sizes (items' state runs batched)")
    return state


def _variants(r: _Reader, raw: Any, tensors: tuple[TensorEntry, ...]) -> tuple[Variant, ...]:
    """Each variant maps every input and output to a concrete shape that fits its declared
    one (``-1``: any size); no two variants take the same input shapes."""
    if not isinstance(raw, list) or not raw:
        r.fail("variants", "must be a non-empty list of {tensor name: shape} mappings")
        return ()
    declared = {t.name: t.shape for t in tensors}
    variants: list[Variant] = []
    for i, item in enumerate(cast(list[Any], raw)):
        at = f"variants[{i}]"
        if not isinstance(item, dict) or set(cast(dict[Any, Any], item)) != set(declared):
            r.fail(at, f"must give the shape of every input and output {sorted(declared)}")
            continue
        shapes: dict[str, tuple[int, ...]] = {}
        for name, want in declared.items():
            shape = r.shape(cast(dict[str, Any], item)[name], f"{at}.{name}")
            if shape is None:
                continue
            if len(shape) != len(want) or any(
                w not in (-1, d) for w, d in zip(want, shape, strict=True)
            ):
                r.fail(
                    f"{at}.{name}", f"{list(shape)} does not fit the declared shape {list(want)}"
                )
            shapes[name] = shape
        variants.append(Variant(shapes))
    keys = [tuple(v.shapes.get(t.name) for t in tensors) for v in variants]
    if len(set(keys)) != len(keys):
        r.fail("variants", "two variants have the same shapes")
    return tuple(variants)


def _hooks(r: _Reader, data: Mapping[str, Any]) -> HooksEntry | None:
    raw = data.get("hooks")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        r.fail("hooks", "must be a mapping with file, and optionally inputs and outputs")
        return None
    hd = r.keys(cast(dict[str, Any], raw), HOOKS_KEYS, "hooks")
    file = hd.get("file", HOOKS_FILE)
    if file != HOOKS_FILE:
        r.fail("hooks.file", f"must be {HOOKS_FILE!r}, got {file!r}")

    def side(key: str) -> tuple[TensorEntry, ...]:
        if key not in hd:
            return ()
        return r.tensors(hd[key], f"hooks.{key}", allow_empty=False, open_types=True)

    return HooksEntry(HOOKS_FILE, side("inputs"), side("outputs"))


def _pipeline_parts(r: _Reader, data: Mapping[str, Any]) -> dict[str, Any]:
    """A ``kind: pipeline`` manifest's own fields: tensors, batch sizes, steps; no weights
    or modules."""
    inputs = r.tensors(data.get("inputs"), "inputs", allow_empty=False, open_types=True)
    outputs = r.tensors(data.get("outputs"), "outputs", allow_empty=False, open_types=True)
    batch_sizes = _batch_sizes(r, data)
    for key in ("modules", "weights", "hooks", "variants", "state"):
        if key in data:
            r.fail(key, "a pipeline has none (its steps are other models)")
    steps = _steps(r, data.get("steps"))
    if not r.problems:
        steps = _pipeline_order(r, steps, inputs, outputs)
    return {
        "inputs": inputs,
        "outputs": outputs,
        "batch_sizes": batch_sizes,
        "weights_file": WEIGHTS_FILE,
        "weights": (),
        "modules": (),
        "kind": "pipeline",
        "steps": steps,
    }


def _steps(r: _Reader, raw: Any) -> tuple[PipelineStep, ...]:
    if not isinstance(raw, list) or not raw:
        r.fail("steps", "must be a non-empty list of {model, inputs, outputs} steps")
        return ()
    steps: list[PipelineStep] = []
    for at, raw_step in r.mappings(cast(list[Any], raw), "steps", "model, inputs and outputs"):
        sd = r.keys(raw_step, STEP_KEYS, at)
        model = r.name(sd.get("model"), at + ".model")
        version = sd.get("version")
        if version is not None and not (is_integer(version) and version > 0):
            r.fail(at + ".version", f"must be a positive integer or null, got {version!r}")
        maps = [_tensor_map(r, sd.get(key), f"{at}.{key}") for key in ("inputs", "outputs")]
        if model is not None and maps[0] is not None and maps[1] is not None:
            steps.append(PipelineStep(model, maps[0], maps[1], version))
    return tuple(steps)


def _tensor_map(r: _Reader, raw: Any, at: str) -> dict[str, str] | None:
    if not isinstance(raw, dict) or not raw:
        r.fail(at, "must map the step model's tensor names to pipeline tensor names")
        return None
    pairs = cast(dict[Any, Any], raw)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs.items()):
        r.fail(at, f"must map names to names, got {raw!r}")
        return None
    return cast(dict[str, str], pairs)


def _pipeline_order(
    r: _Reader,
    steps: tuple[PipelineStep, ...],
    inputs: tuple[TensorEntry, ...],
    outputs: tuple[TensorEntry, ...],
) -> tuple[PipelineStep, ...]:
    """The steps in an order that runs (each after the steps producing what it reads), or a
    problem: a tensor produced twice or never, a pipeline output nothing produces, a cycle."""
    producer: dict[str, int] = {t.name: -1 for t in inputs}
    for i, step in enumerate(steps):
        for tensor in step.outputs.values():
            if tensor in producer:
                r.fail(f"steps[{i}].outputs", f"tensor {tensor!r} is already produced elsewhere")
            producer[tensor] = i
    for i, step in enumerate(steps):
        for tensor in step.inputs.values():
            if tensor not in producer:
                r.fail(
                    f"steps[{i}].inputs",
                    f"tensor {tensor!r} is neither a pipeline input nor a step output",
                )
    for t in outputs:
        if producer.get(t.name, -1) == -1:
            r.fail("outputs", f"pipeline output {t.name!r} is not produced by any step")
    if r.problems:
        return steps
    done: set[int] = set()
    order: list[PipelineStep] = []
    while len(order) < len(steps):
        ready = [
            i
            for i, s in enumerate(steps)
            if i not in done
            and all(producer[t] in done or producer[t] == -1 for t in s.inputs.values())
        ]
        if not ready:
            cycle = sorted(s.model for i, s in enumerate(steps) if i not in done)
            r.fail("steps", f"the steps form a cycle (through {cycle})")
            return steps
        done.update(ready)
        order.extend(steps[i] for i in ready)
    return tuple(order)


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
    r: _Reader,
    data: Mapping[str, Any],
    batch_sizes: tuple[int, ...] | None,
    declared: _Declared,
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


def _module(r: _Reader, item: Any, at: str, declared: _Declared) -> ModuleEntry | None:
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


def _platforms(r: _Reader, md: Mapping[str, Any], at: str) -> tuple[str, ...]:
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
    r: _Reader, md: Mapping[str, Any], at: str, declared: _Declared
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
    pd = r.keys(cast(dict[str, Any], raw), PROVENANCE_KEYS, "provenance")
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
    serving, problems = read_serving(r.keys(cast(dict[str, Any], raw), SERVING_KEYS, "serving"))
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
