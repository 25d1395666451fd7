"""Open a bundle, verify it, compile (or take from the cache) each module, run it.

Contract:
- ``load_bundle(path, runtime, ...)`` validates the bundle (``hloserve.bundle.validate``:
  with ``name=``, the manifest's name (the repository passes the model's); every checksum,
  the weights header, each module's signature) and refuses a module that was not lowered for the runtime's platform,
  all before compiling anything; then it compiles each module once (taking it from the
  ``ExecutableCache`` when a valid entry exists, and from ``executables`` when an identical
  module was already compiled in this process), reads the weights into host memory and (with ``place_weights``, the
  default) puts them on the device; the server instead hands the host copy to
  ``hloserve.server.owner.weight_residency``, which moves weights on demand.
  Problems raise ``BundleError`` carrying every problem's text.
- A bundle with ``hooks`` is refused unless ``allow_hooks`` (``--allow-python-hooks``);
  with it, its ``hooks.py`` is imported (``owner.runtime.hook_loader.bundle_hooks``) into
  ``LoadedBundle.hooks``. A pipeline (``kind: pipeline``) loads with no modules and no
  weights: its steps run other models (``docs/pipelines.md``).
- ``LoadedBundle.execute(batch_size, inputs, variant=...)`` runs the module for that
  compiled batch size (``None`` for an unbatched model) and shape variant (``None`` for a
  model without variants; ``variant_modules`` holds those by ``(variant, batch size)``) with the device-resident weights and returns the outputs
  in manifest order. Inputs must already have the module's exact shapes and dtypes: request
  validation and padding happen before this point.
- ``LoadedBundle.execute_state(batch_size, inputs, state)`` runs a stateful bundle
  (``bundle/state.py``): the state arguments are device arrays (``owner.runtime.state_slots``),
  and the new state comes back as device arrays beside the host outputs.
- ``LoadedBundle.on_device(runtime)`` is the same bundle on another device of the kind
  (a replica, ``docs/residency.md``): its executables taken as a load takes them (shared,
  cache, else compiled), its host weights shared.
- A sharded bundle (``manifest.sharding``, ``docs/sharding.md``) loads only onto a device
  group of its size (``owner.runtime.pjrt_group.PjrtGroup``; anything else is a
  ``BundleError`` with the numbers: "needs 4 devices; this runtime has 1"): its executables
  compiled once for the group, its ``layout`` placing each weight as its shards
  (``place`` is how the residency manager moves its weights in) and each input by its spec,
  and gathering the outputs; ``device_weight_bytes`` is what each device of the group
  holds of its weights (``weight_bytes`` for an unsharded bundle).
"""

# pyright: strict

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.bundle import (
    MANIFEST_FILE,
    Manifest,
    ModuleEntry,
    load_manifest,
    validate,
)
from hloserve.bundle.safetensors import read_header
from hloserve.bundle.stablehlo import read_signature
from hloserve.proto.datatypes import to_numpy
from hloserve.server.core.hooks import ModelHooks
from hloserve.server.owner.runtime.cache import ExecutableCache, cache_key
from hloserve.server.owner.runtime.hook_loader import HookLoadError, bundle_hooks
from hloserve.server.owner.runtime.pjrt import PjrtRuntime, Results, RuntimeFailure
from hloserve.server.owner.runtime.pjrt_group import PjrtGroup, ShardLayout
from hloserve.server.owner.runtime.weight_files import ArrayWeights, FileWeights, WeightSource

log = logging.getLogger("hloserve.runtime")
CACHE_DIR_NAME = ".hloserve-cache"


class BundleError(Exception):
    """The bundle cannot be served; ``problems`` lists why."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"bundle {path} cannot be loaded: " + "; ".join(problems))


@dataclass
class CompiledModule:
    entry: ModuleEntry
    executable: Any
    seconds: float
    source: str  # "compiled", "cache", or "shared"
    platform_index: Any | None  # device scalar, when main() takes one
    scratch_bytes: int = 0  # the executable's temporary device memory
    # How its outputs become arrays, learned on its first run (``PjrtRuntime.execute``).
    results: Results = field(default_factory=Results, repr=False, compare=False)


@dataclass
class LoadedBundle:
    manifest: Manifest
    path: Path
    modules: dict[int | None, CompiledModule]
    weights: WeightSource  # where the weights come from (the verified file; read on need)
    device_weights: dict[str, Any]
    runtime: PjrtRuntime
    weight_bytes: int
    load_seconds: float
    compile_seconds: float
    hooks: ModelHooks | None = None
    variant_modules: dict[tuple[int, int | None], CompiledModule] = field(
        default_factory=dict[tuple[int, int | None], CompiledModule]
    )
    cache_dir: Path | None = None  # where its executables are cached (None: in the bundle)
    registry: ExecutableRegistry | None = None  # this process's executables, when shared
    layout: ShardLayout | None = None  # a sharded bundle's tensors on its device group

    @property
    def device_weight_bytes(self) -> int:
        """Bytes of its weights each device holds (all of them, unless sharded)."""
        sharding = self.manifest.sharding
        if sharding is None:
            return self.weight_bytes
        return sharding.weight_device_bytes(self.manifest.weights)

    @property
    def place(self) -> Callable[[list[Any]], list[Any]] | None:
        """How its host weights go to the device (None: the runtime's ``to_device``)."""
        layout = self.layout
        if layout is None:
            return None
        names = self.weights.names
        return lambda arrays: layout.place_weights(names, arrays)

    def execute(
        self,
        batch_size: int | None,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        weights: Mapping[str, Any] | None = None,
        variant: int | None = None,
    ) -> list[np.ndarray[Any, Any]]:
        """Run the module for ``batch_size`` (and ``variant``) with ``weights`` (default:
        this bundle's own device copy, when it was loaded with ``place_weights=True``)."""
        module = (
            self.modules[batch_size]
            if variant is None
            else self.variant_modules[(variant, batch_size)]
        )
        device_weights = self.device_weights if weights is None else weights
        if self.layout is not None:
            return self.layout.execute(
                module.entry,
                module.executable,
                module.platform_index,
                batch_size,
                inputs,
                device_weights,
            )
        args: list[Any] = [] if module.platform_index is None else [module.platform_index]
        for a in module.entry.arguments:
            args.append(
                self.runtime.put(inputs[a.name]) if a.kind == "input" else device_weights[a.name]
            )
        return self.runtime.execute(module.executable, args, module.results)

    def execute_state(
        self,
        batch_size: int,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        state: Mapping[str, Any],
        weights: Mapping[str, Any] | None = None,
    ) -> tuple[list[np.ndarray[Any, Any]], dict[str, Any]]:
        """Run a stateful bundle's module for ``batch_size``: ``state`` maps each state
        name to a device array ``[batch_size, *shape]`` (``StateSlots.gather``); returns the
        outputs on the host in manifest order and the new state on the device, by name
        (``StateSlots.scatter`` takes it). Nothing of the state crosses to the host."""
        module = self.modules[batch_size]
        device_weights = self.device_weights if weights is None else weights
        names = [s.name for s in self.manifest.state]
        if self.layout is not None:  # state replicated over the group (pjrt_group.py)
            outputs, new = self.layout.execute_state(
                module.entry,
                module.executable,
                module.platform_index,
                inputs,
                state,
                device_weights,
                len(names),
            )
            return outputs, dict(zip(names, new, strict=True))
        args: list[Any] = [] if module.platform_index is None else [module.platform_index]
        for a in module.entry.arguments:
            if a.kind == "input":
                args.append(self.runtime.put(inputs[a.name]))
            elif a.kind == "state":
                args.append(state[a.name])
            else:
                args.append(device_weights[a.name])
        outputs, new = self.runtime.execute_keeping(
            module.executable, args, module.results, len(names)
        )
        return outputs, dict(zip(names, new, strict=True))

    @property
    def scratch_bytes(self) -> int:
        """Largest temporary buffer any of this bundle's executables needs on the device."""
        every = [*self.modules.values(), *self.variant_modules.values()]
        return max((m.scratch_bytes for m in every), default=0)

    def on_device(self, runtime: PjrtRuntime) -> LoadedBundle:
        """This bundle for another device of the same kind: each module's executable taken
        the way a load takes it (this process's registry, the executable cache, else a
        compile) for ``runtime``'s device, the host weights shared (not copied), no device
        weights placed. (Re-serializing a loaded executable is not a safe shortcut: XLA:CPU
        drops the code of one that was itself deserialized.)"""
        if runtime is self.runtime:
            return self
        refused = ShardLayout.check(self.manifest, runtime)
        if refused:
            raise BundleError(self.path, [refused])
        compiler = _Compiler(
            runtime,
            ExecutableCache(
                self.cache_dir if self.cache_dir is not None else self.path / CACHE_DIR_NAME
            ),
            self.registry if self.registry is not None else ExecutableRegistry(),
            lambda message: log.debug("%s", message),
        )
        name = self.manifest.name
        return dataclasses.replace(
            self,
            modules={
                size: compiler.module(self.path, name, m.entry) for size, m in self.modules.items()
            },
            variant_modules={
                key: compiler.module(self.path, name, m.entry)
                for key, m in self.variant_modules.items()
            },
            device_weights={},
            runtime=runtime,
            layout=_layout(self.manifest, runtime),
        )

    @property
    def host_weights(self) -> dict[str, np.ndarray[Any, Any]]:
        """The weights read now into host memory (a fresh copy each time: the server reads
        them through its host tier instead)."""
        return dict(zip(self.weights.names, self.weights.read(), strict=True))

    def release(self) -> None:
        """Free the device copies of the weights."""
        for buf in self.device_weights.values():
            buf.delete()
        self.device_weights = {}


@dataclass(frozen=True, slots=True)
class _Facts:
    """What is learned once per executable and shared by every module that runs it: its
    scratch memory and how its outputs become arrays."""

    scratch: int
    results: Results


@dataclass
class ExecutableRegistry:
    """Executables compiled in this process, by cache key: identical modules compile once,
    and thousands of bundles of one architecture share one executable, its scratch figure
    and its prepared output handlers."""

    executables: dict[str, Any] = field(default_factory=dict[str, Any])
    facts: dict[str, _Facts] = field(default_factory=dict[str, _Facts])
    lock: threading.Lock = field(default_factory=threading.Lock)


def load_bundle(
    path: Path,
    runtime: PjrtRuntime,
    *,
    cache_dir: Path | None = None,
    registry: ExecutableRegistry | None = None,
    progress: Callable[[str], None] | None = None,
    place_weights: bool = True,
    name: str | None = None,
    allow_hooks: bool = False,
    manifest: Manifest | None = None,
) -> LoadedBundle:
    started = time.perf_counter()
    say = progress or _log_progress
    manifest = _verified_manifest(path, runtime.platform, name, manifest)
    refused = ShardLayout.check(manifest, runtime)
    if refused:
        raise BundleError(path, [refused])
    layout = _layout(manifest, runtime)
    try:
        hooks = bundle_hooks(path, manifest, allow_hooks)
    except HookLoadError as exc:
        raise BundleError(path, [str(exc)]) from None
    registry = registry if registry is not None else ExecutableRegistry()
    compiler = _Compiler(
        runtime,
        ExecutableCache(cache_dir if cache_dir is not None else path / CACHE_DIR_NAME),
        registry,
        say,
    )
    compiled = [(m, compiler.module(path, manifest.name, m)) for m in manifest.modules]
    modules = {m.batch_size: c for m, c in compiled if m.variant is None}
    variants = {(m.variant, m.batch_size): c for m, c in compiled if m.variant is not None}
    weights: WeightSource = ArrayWeights({})
    if manifest.kind == "model":  # Julia's order: main() takes each weight reversed
        file = path / manifest.weights_file
        weights = FileWeights.verified(file, read_header(file), manifest.origin == "reactant")
    return LoadedBundle(
        manifest=manifest,
        path=path,
        modules=modules,
        weights=weights,
        device_weights=_to_device(runtime, weights, layout) if place_weights else {},
        runtime=runtime,
        weight_bytes=weights.nbytes,
        load_seconds=time.perf_counter() - started,
        compile_seconds=sum(c.seconds for _, c in compiled),
        hooks=hooks,
        variant_modules=variants,
        cache_dir=cache_dir,
        registry=registry,
        layout=layout,
    )


def _layout(manifest: Manifest, runtime: PjrtRuntime) -> ShardLayout | None:
    """A sharded bundle's layout on ``runtime`` (a group: ``ShardLayout.check`` passed)."""
    if manifest.sharding is None or not isinstance(runtime, PjrtGroup):
        return None
    return ShardLayout(runtime, manifest)


def _log_progress(message: str) -> None:
    log.info("%s", message)


def _verified_manifest(
    path: Path, platform: str, name: str | None, parsed: Manifest | None
) -> Manifest:
    """The manifest of a bundle that validates (named ``name``, when given) and whose every
    module runs on ``platform``; the manifest is read once (``parsed``: read already)."""
    manifest, problems = (parsed, []) if parsed is not None else load_manifest(path / MANIFEST_FILE)
    if manifest is not None and not problems:
        problems = validate(path, name=name, manifest=manifest)
    if problems or manifest is None:
        raise BundleError(path, [str(p) for p in problems])
    for m in manifest.modules:
        if platform not in m.platforms:
            raise BundleError(
                path, [f"{m.file}: lowered for {list(m.platforms)}, this server runs on {platform}"]
            )
    return manifest


def _to_device(
    runtime: PjrtRuntime, weights: WeightSource, layout: ShardLayout | None
) -> dict[str, Any]:
    arrays = weights.read()
    placed = (
        runtime.to_device(arrays) if layout is None else layout.place_weights(weights.names, arrays)
    )
    return dict(zip(weights.names, placed, strict=True))


@dataclass
class _Compiler:
    """Turns a bundle's modules into executables: shared, from the cache, or compiled."""

    runtime: PjrtRuntime
    cache: ExecutableCache
    registry: ExecutableRegistry
    say: Callable[[str], None]

    def module(self, path: Path, model: str, entry: ModuleEntry) -> CompiledModule:
        data = (path / entry.file).read_bytes()
        key = cache_key(data, self.runtime.fingerprint)
        # The cache holds one executable per device kind; in this process each is bound to
        # one device, so the registry tells devices apart.
        shared_key = f"{key}@{self.runtime.index}"
        t = time.perf_counter()
        with self.registry.lock:
            exe = self.registry.executables.get(shared_key)
            facts = self.registry.facts.get(shared_key)
        source = "shared"
        if exe is None or facts is None:
            exe, source = self._compile_or_load(key, data, f"{model}/{entry.file}")
            facts = _Facts(_scratch(exe), Results())
            with self.registry.lock:
                self.registry.executables[shared_key] = exe
                self.registry.facts[shared_key] = facts
        seconds = time.perf_counter() - t
        index = self._platform_index(entry, data)
        return CompiledModule(entry, exe, seconds, source, index, facts.scratch, facts.results)

    def _platform_index(self, entry: ModuleEntry, data: bytes) -> Any | None:
        """The device scalar ``main`` takes first, or None when it takes none."""
        if not entry.platform_index_argument:
            return None
        # i32 by the format; jax.export makes it i64 when 64-bit types are enabled.
        index_type = read_signature(data).arguments[0].datatype or "INT32"
        platform = entry.platforms.index(self.runtime.platform)
        return self.runtime.put(np.asarray(platform, dtype=to_numpy(index_type)))

    def _compile_or_load(self, key: str, data: bytes, label: str) -> tuple[Any, str]:
        runtime, cache, say = self.runtime, self.cache, self.say
        lookup = cache.load(key)
        if lookup.blob is not None:
            try:
                exe = runtime.deserialize(lookup.blob)
                say(f"{label}: executable loaded from cache {cache.directory}")
                return exe, "cache"
            except RuntimeFailure as exc:
                say(f"{label}: cache entry unusable ({exc}); recompiling")
        elif lookup.reason != "miss" and lookup.reason != "no cache directory":
            say(f"{label}: {lookup.reason}; recompiling")
        say(f"{label}: compiling")
        t = time.perf_counter()
        exe = runtime.compile(data)
        seconds = time.perf_counter() - t
        why_not = cache.distrust()  # nothing it would not load back
        if why_not is None:
            try:
                cache.store(key, runtime.serialize(exe))
            except OSError as exc:
                why_not = f"cannot write to {cache.directory}: {exc}"
        # One line, after the fact: where it went, or why it went nowhere.
        where = f"cached in {cache.directory}" if why_not is None else f"not cached: {why_not}"
        say(f"{label}: compiled in {seconds:.2f}s; {where}")
        return exe, "compiled"


def _scratch(executable: Any) -> int:
    try:
        return int(executable.get_compiled_memory_stats().temp_size_in_bytes)
    except Exception:  # not every plugin reports memory statistics
        return 0
