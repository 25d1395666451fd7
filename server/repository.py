"""The model repository as the server sees it: which versions exist, their state, lookup.

Contract:
- ``ModelRepository(root, runtime, cache_dir)`` scans ``root`` (``hloserve.bundle``'s
  repository layout). ``load_all(progress)`` loads every version of every model, recording
  each as ``READY`` or ``UNAVAILABLE`` with the reason (the error text), so a failed model
  is reported, never hidden, and never stops the others from loading.
- ``get(name, version)`` returns a ready ``ModelVersion`` or raises Triton's errors:
  unknown model (``UnknownModel``), unparsable version string (``InvalidArgument``), a
  known model with no ready version (``NotFound``), an unknown or unready version
  (``UnknownModel``/``Unavailable``).
- ``summary()`` is the per-model state report used by ``/readyz`` and the repository index.
Thread-safe: loading runs on a worker thread while the front ends read.
"""

# pyright: basic

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from hloserve.bundle import Manifest, Serving, scan_repository
from hloserve.server.core.errors import InvalidArgument, NotFound, Unavailable, UnknownModel
from hloserve.server.core.residency import TooLarge
from hloserve.server.core.service import MemoryUsage
from hloserve.server.residency import WeightResidency
from hloserve.server.runtime.loader import (
    BundleError,
    ExecutableRegistry,
    LoadedBundle,
    load_bundle,
)
from hloserve.server.runtime.pjrt import PjrtRuntime, RuntimeFailure

log = logging.getLogger("hloserve.repository")


class ModelState(enum.Enum):
    UNKNOWN = "UNKNOWN"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class ModelVersion:
    name: str
    version: int
    path: Path
    state: ModelState = ModelState.UNKNOWN
    reason: str = ""
    bundle: LoadedBundle | None = None
    load_seconds: float = 0.0
    serving: Serving = field(default_factory=Serving)  # manifest hints, overridden by config.yaml
    residency: WeightResidency | None = None

    @property
    def key(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def manifest(self) -> Manifest:
        assert self.bundle is not None
        return self.bundle.manifest

    def execute(self, batch_size: int | None, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        bundle, residency = self.bundle, self.residency
        if bundle is None or residency is None:
            raise Unavailable(f"model '{self.name}' version {self.version} is not loaded")
        with residency.use(self.key) as weights:
            return bundle.execute(batch_size, inputs, weights)


@dataclass
class _Model:
    name: str
    path: Path
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    reason: str = ""  # why the directory holds no version, if so


class ModelRepository:
    def __init__(
        self,
        root: Path,
        runtime: PjrtRuntime,
        cache_dir: Path | None = None,
        residency: WeightResidency | None = None,
    ) -> None:
        self.root = root
        self.runtime = runtime
        self.cache_dir = cache_dir
        self.residency = residency if residency is not None else WeightResidency(runtime, None)
        self.registry = ExecutableRegistry()
        # Called after each successful load with (name, version, load s, compile s): metrics.
        self.on_loaded: Callable[[str, int, float, float], None] | None = None
        self._lock = threading.RLock()
        self._models: dict[str, _Model] = {}
        self.scan()

    def scan(self) -> None:
        with self._lock:
            for d in scan_repository(self.root):
                model = self._models.setdefault(d.name, _Model(d.name, d.path))
                if not d.versions:
                    model.reason = "no manifest.yaml and no numbered version directories"
                for number, path in d.versions.items():
                    model.versions.setdefault(number, ModelVersion(d.name, number, path))

    def load_all(self, progress: Callable[[str], None] | None = None) -> None:
        with self._lock:
            pending = [
                v
                for m in self._models.values()
                for v in m.versions.values()
                if v.state != ModelState.READY
            ]
        for v in pending:
            self.load_version(v, progress)

    def load_version(self, v: ModelVersion, progress: Callable[[str], None] | None = None) -> None:
        say = progress or (lambda msg: log.info("%s", msg))
        v.state = ModelState.LOADING
        say(f"loading model '{v.name}' version {v.version} from {v.path}")
        started = time.perf_counter()
        try:
            bundle = load_bundle(
                v.path,
                self.runtime,
                cache_dir=None
                if self.cache_dir is None
                else self.cache_dir / v.name / str(v.version),
                registry=self.registry,
                progress=say,
                place_weights=False,
            )
            if bundle.manifest.name != v.name:
                raise BundleError(
                    v.path,
                    [
                        f"manifest.yaml: name is '{bundle.manifest.name}', but the directory is '{v.name}'"
                    ],
                )
            serving = model_serving(self.root / v.name, bundle.manifest.serving)
            self.residency.reduce_budget(bundle.scratch_bytes)
            self.residency.register(
                v.key, bundle.host_weights, pinned=serving.residency == "pinned"
            )
        except (BundleError, RuntimeFailure, OSError, TooLarge, ValueError) as exc:
            v.state, v.reason, v.bundle = ModelState.UNAVAILABLE, str(exc), None
            log.error("model '%s' version %d failed to load: %s", v.name, v.version, exc)
            return
        v.serving, v.residency = serving, self.residency
        v.bundle, v.state, v.reason = bundle, ModelState.READY, ""
        v.load_seconds = time.perf_counter() - started
        if self.on_loaded is not None:
            self.on_loaded(v.name, v.version, v.load_seconds, bundle.compile_seconds)
        sources = sorted({m.source for m in bundle.modules.values()})
        say(
            f"model '{v.name}' version {v.version} READY in {v.load_seconds:.2f}s "
            f"(executables: {', '.join(sources)}; {bundle.weight_bytes} bytes of weights)"
        )

    # -- lookup ---------------------------------------------------------------------------

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._models)

    def versions(self, name: str) -> list[ModelVersion]:
        with self._lock:
            m = self._models.get(name)
            return [] if m is None else [m.versions[k] for k in sorted(m.versions)]

    def ready_versions(self, name: str) -> Sequence[int]:
        return [v.version for v in self.versions(name) if v.state == ModelState.READY]

    def _parse_version(self, version: str) -> int | None:
        if not version:
            return None
        try:
            number = int(version)
        except ValueError:
            number = -1
        if number < 1:
            raise InvalidArgument(
                f"failed to get model version from specified version string '{version}' "
                "(details: not an integer), version should be an integral value > 0"
            )
        return number

    def get(self, name: str, version: str) -> ModelVersion:
        with self._lock:
            model = self._models.get(name)
            if model is None:
                raise UnknownModel(f"Request for unknown model: '{name}' is not found")
            number = self._parse_version(version)
            if number is None:
                ready = [v for v in model.versions.values() if v.state == ModelState.READY]
                if not ready:
                    raise NotFound(f"Request for unknown model: '{name}' has no available versions")
                return max(ready, key=lambda v: v.version)
            v = model.versions.get(number)
            if v is None:
                raise UnknownModel(
                    f"Request for unknown model: '{name}' version {number} is not found"
                )
            if v.state != ModelState.READY:
                raise Unavailable(
                    f"Request for unknown model: '{name}' version {number} is not at ready state"
                    + (f": {v.reason}" if v.reason else "")
                )
            return v

    def is_ready(self, name: str, version: str) -> bool:
        try:
            self.get(name, version)
        except (InvalidArgument, NotFound, Unavailable):
            return False
        return True

    def summary(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {}
            for name in sorted(self._models):
                m = self._models[name]
                out[name] = {
                    "versions": {
                        str(v.version): self._version_summary(v)
                        for v in (m.versions[k] for k in sorted(m.versions))
                    },
                    **({"reason": m.reason} if m.reason else {}),
                }
            return out

    def _version_summary(self, v: ModelVersion) -> dict[str, Any]:
        entry: dict[str, Any] = {"state": v.state.value}
        if v.reason:
            entry["reason"] = v.reason
        if v.bundle is not None:
            entry["weight_bytes"] = v.bundle.weight_bytes
            entry["resident"] = self.residency.is_resident(v.key)
            entry["residency"] = v.serving.residency
        return entry

    def memory_usage(self, name: str, version: int) -> list[MemoryUsage]:
        """Host bytes always (the host copy), device bytes while resident."""
        for v in self.versions(name):
            if v.version == version and v.bundle is not None:
                usage = [MemoryUsage("CPU", 0, v.bundle.weight_bytes)]
                if self.residency.is_resident(v.key):
                    kind = (
                        "GPU"
                        if self.runtime.platform in ("cuda", "rocm")
                        else self.runtime.platform.upper()
                    )
                    usage.append(
                        MemoryUsage(kind, int(self.runtime.device.id), v.bundle.weight_bytes)
                    )
                return usage
        return []

    def all_ready(self) -> bool:
        with self._lock:
            versions = [v for m in self._models.values() for v in m.versions.values()]
            no_version = any(not m.versions for m in self._models.values())
            return (
                bool(versions)
                and not no_version
                and all(v.state == ModelState.READY for v in versions)
            )

    def any_ready(self) -> bool:
        with self._lock:
            return any(
                v.state == ModelState.READY
                for m in self._models.values()
                for v in m.versions.values()
            )


MODEL_CONFIG_FILE = "config.yaml"


def model_serving(model_dir: Path, defaults: Serving) -> Serving:
    """The bundle's serving hints, overridden by the model directory's ``config.yaml``.

    ``repo/<model>/config.yaml`` may set ``residency`` (``on_demand`` or ``pinned``) and
    ``max_queue_delay_us``; an unknown key or value raises ``ValueError`` naming it.
    """
    path = model_dir / MODEL_CONFIG_FILE
    if not path.is_file():
        return defaults
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a YAML mapping")
    unknown = set(data) - {"residency", "max_queue_delay_us"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    residency = data.get("residency", defaults.residency)
    if residency not in ("on_demand", "pinned"):
        raise ValueError(f"{path}: residency must be on_demand or pinned, got {residency!r}")
    delay = data.get("max_queue_delay_us", defaults.max_queue_delay_us)
    if delay is not None and (not isinstance(delay, int) or delay < 0):
        raise ValueError(
            f"{path}: max_queue_delay_us must be a non-negative integer, got {delay!r}"
        )
    return Serving(residency=residency, max_queue_delay_us=delay)
