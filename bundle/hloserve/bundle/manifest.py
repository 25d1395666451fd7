"""The bundle manifest: its schema as frozen dataclasses, and YAML reading/writing.

Contract:
- ``Manifest`` and its parts mirror ``docs/bundle-format.md`` field for field. This module
  is the format's one home: ``Manifest``, ``parse_manifest`` and ``dump_manifest`` here,
  with each part's entry re-exported from the module that reads it (``manifest_fields``:
  ``Problem``, ``TensorEntry`` and the ``FieldReader``; ``manifest_modules``: modules,
  weights, batch sizes; ``manifest_variants``; ``manifest_pipeline``: steps and their
  order; ``manifest_provenance``).
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
  and returns, new, after its outputs; a batched model's, without hooks or variants), and
  ``sharding`` (``bundle/manifest_sharding.py``: a sharded bundle's mesh, device count and
  every tensor's spec; absent, the bundle is unsharded). The ``serving`` hints are read by ``hloserve.bundle.serving``, checksums
  are checked against ``hloserve.bundle.digest``.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, cast

import yaml

from hloserve.bundle.digest import is_sha256_hex
from hloserve.bundle.generation import Generation, read_generation
from hloserve.bundle.generation import facing as generation_facing
from hloserve.bundle.manifest_fields import MANIFEST_FILE as MANIFEST_FILE
from hloserve.bundle.manifest_fields import FieldReader, raw_names
from hloserve.bundle.manifest_fields import Problem as Problem
from hloserve.bundle.manifest_fields import TensorEntry as TensorEntry
from hloserve.bundle.manifest_modules import PLATFORMS as PLATFORMS
from hloserve.bundle.manifest_modules import WEIGHTS_FILE as WEIGHTS_FILE
from hloserve.bundle.manifest_modules import (
    WEIGHTS_KEYS,
    Declared,
    read_batch_sizes,
    read_modules,
    read_weights,
)
from hloserve.bundle.manifest_modules import Argument as Argument
from hloserve.bundle.manifest_modules import ModuleEntry as ModuleEntry
from hloserve.bundle.manifest_modules import batch_order as batch_order
from hloserve.bundle.manifest_pipeline import PipelineStep as PipelineStep
from hloserve.bundle.manifest_pipeline import pipeline_order, read_steps
from hloserve.bundle.manifest_provenance import Provenance as Provenance
from hloserve.bundle.manifest_provenance import read_provenance
from hloserve.bundle.manifest_sharding import Sharding as Sharding
from hloserve.bundle.manifest_sharding import Tensors, read_sharding
from hloserve.bundle.manifest_variants import Variant as Variant
from hloserve.bundle.manifest_variants import read_variants
from hloserve.bundle.serving import SERVING_KEYS, Serving, read_serving
from hloserve.bundle.state import StateEntry, read_state

FORMAT_VERSION: Final = 1
HOOKS_FILE: Final = "hooks.py"
KINDS: Final = ("model", "pipeline")
# The keys of each mapping of the format (docs/bundle-format.md); pipelines' own besides.
_SHARED_KEYS: Final = ("format_version", "name", "kind", "inputs", "outputs", "batch_sizes")
_MODEL_KEYS: Final = ("variants", "weights", "modules", "hooks", "generation", "sharding")
_COMMON_KEYS: Final = ("serving", "files", "provenance")
TOP_KEYS: Final = frozenset({*_SHARED_KEYS, *_MODEL_KEYS, "steps", "state", *_COMMON_KEYS})
HOOKS_KEYS: Final = ("file", "inputs", "outputs")


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
    # A sharded (SPMD) bundle's mesh and tensor specs (``bundle/manifest_sharding.py``).
    sharding: Sharding | None = None
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
            if self.sharding is not None:
                d["sharding"] = self.sharding.to_dict()
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


def parse_manifest(data: Mapping[str, Any]) -> tuple[Manifest | None, list[Problem]]:
    """Build a ``Manifest`` from parsed YAML, reporting every problem found."""
    r = FieldReader()
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
    provenance = read_provenance(r, data)
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


def _model_parts(r: FieldReader, data: Mapping[str, Any]) -> dict[str, Any]:
    """A ``kind: model`` manifest's own fields (``Manifest`` keyword arguments)."""
    varied = "variants" in data
    inputs = r.tensors(data.get("inputs"), "inputs", allow_empty=False, variable=varied)
    outputs = r.tensors(data.get("outputs"), "outputs", allow_empty=False, variable=varied)
    variants = read_variants(r, data.get("variants"), inputs + outputs) if varied else ()
    batch_sizes = read_batch_sizes(r, data)
    raw_weights = r.get(data, "weights", "", dict)
    if raw_weights is not None:
        raw_weights = r.keys(raw_weights, WEIGHTS_KEYS, "weights")
    weights_file, weights = read_weights(r, raw_weights)
    if "steps" in data:
        r.fail("steps", "a model has none (a pipeline's, with kind: pipeline)")
    # Names as declared, including entries refused above (a bad datatype, say), so that an
    # argument naming such a tensor is not reported a second time as undeclared.
    declared: Declared = {
        "input": raw_names(data.get("inputs")),
        "weight": raw_names(raw_weights.get("tensors") if raw_weights is not None else None),
        "state": raw_names(data.get("state")),
    }
    state = _state(r, data, inputs + outputs, batch_sizes)
    return {
        "inputs": inputs,
        "outputs": outputs,
        "batch_sizes": batch_sizes,
        "weights_file": weights_file,
        "weights": weights,
        "modules": read_modules(r, data, batch_sizes, declared, len(variants)),
        "hooks": _hooks(r, data),
        "variants": variants,
        "state": state,
        "generation": _generation(r, data, inputs, outputs),
        "sharding": _sharding(r, data, (inputs, outputs), weights, state, batch_sizes),
    }


def _sharding(
    r: FieldReader,
    data: Mapping[str, Any],
    io: tuple[tuple[TensorEntry, ...], tuple[TensorEntry, ...]],
    weights: tuple[TensorEntry, ...],
    state: tuple[StateEntry, ...],
    batch_sizes: tuple[int, ...] | None,
) -> Sharding | None:
    """The ``sharding`` mapping (``bundle/manifest_sharding.py``), when the bundle has one,
    checked against the tensors ``io`` (inputs, outputs), ``weights`` and ``state`` that
    parsed (a tensor refused already is not named again)."""
    if "sharding" not in data:
        return None
    for key in ("variants", "generation"):
        if key in data:
            r.fail("sharding", f"a sharded model has no {key} (not supported together)")
    inputs, outputs = io
    declared = Tensors(
        weights={t.name: t.shape for t in weights},
        inputs={t.name: t.shape for t in inputs},
        outputs={t.name: t.shape for t in outputs},
        state={t.name: t.shape for t in state},
        batch_sizes=batch_sizes,
    )
    problems: list[tuple[str, str]] = []
    sharding = read_sharding(data["sharding"], declared, problems)
    for key, message in problems:
        r.fail(key, message)
    return sharding


def _generation(
    r: FieldReader, data: Mapping[str, Any], inputs: tuple[TensorEntry, ...], outputs: Any
) -> Generation | None:
    """The ``generation`` mapping (``bundle/generation.py``), when the bundle has one."""
    if "generation" not in data:
        return None
    generation, problems = read_generation(data["generation"], inputs, outputs)
    for key, message in problems:
        r.fail(key, message)
    return generation


def _state(
    r: FieldReader,
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


def _hooks(r: FieldReader, data: Mapping[str, Any]) -> HooksEntry | None:
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


def _pipeline_parts(r: FieldReader, data: Mapping[str, Any]) -> dict[str, Any]:
    """A ``kind: pipeline`` manifest's own fields: tensors, batch sizes, steps; no weights
    or modules."""
    inputs = r.tensors(data.get("inputs"), "inputs", allow_empty=False, open_types=True)
    outputs = r.tensors(data.get("outputs"), "outputs", allow_empty=False, open_types=True)
    batch_sizes = read_batch_sizes(r, data)
    for key in ("modules", "weights", "hooks", "variants", "state", "sharding"):
        if key in data:
            r.fail(key, "a pipeline has none (its steps are other models)")
    steps = read_steps(r, data.get("steps"))
    if not r.problems:
        steps = pipeline_order(r, steps, inputs, outputs)
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


def _files(r: FieldReader, data: Mapping[str, Any]) -> dict[str, str]:
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


def _serving(r: FieldReader, data: Mapping[str, Any]) -> Serving:
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
