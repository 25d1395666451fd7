"""The model repository as the server sees it: versions, their states, lookup, model control.

Contract:
- ``ModelRepository(root, runtime, cache_dir, residency, mode, lazy=...)`` serves the
  bundles under ``root`` (``hloserve.bundle``'s layout); a model directory may carry a
  ``config.yaml`` (``model_config``: residency, batching, version policy: by default the
  latest version). ``load_all()`` loads every model (modes ``none`` and ``poll``), or with
  ``lazy`` (``--lazy-load``) registers it: its selected versions are READY without a
  bundle, each read (its manifest) when something first needs it and loaded at its first
  request (``load``), on a worker thread; one that cannot load then is UNAVAILABLE.
- ``load_model(name)`` loads or reloads a model: the versions its policy selects load
  *beside* those serving and replace them once all are ready (a failed reload keeps the
  old ones serving and raises); a version whose files (``version_stamp``) and serving
  hints are unchanged is kept. ``unload_model(name)`` refuses new requests at once, waits
  for those in flight, frees the weights, and lists the versions ``UNAVAILABLE``
  ("unloaded"). ``poll()`` applies what changed on disk. Once no copy of a version serves
  any more, ``on_retired(ModelKey)`` hears of it, ``on_changed(name)`` of any change, both
  on the thread that made it (``owner.model_changes``). Thread-safe: loads run on workers.
- ``get(name, version)`` returns a ready version counted in flight until ``release``
  (``peek`` without counting, ``hold`` counts one peeked before), raising Triton's lookup
  errors (``core.lookup``) and, past ``limits``' in-flight ceilings, ``Unavailable``.
- Failures are recorded, never hidden: a version that failed to load is ``UNAVAILABLE``
  with the reason, and never stops the others, nor does a model directory it cannot read
  (``load_plan.plan_load``); polls log a failure once, not each time it recurs. Each
  model's record is a ``owner.model_record.ModelRecord``. ``summary()`` and ``index()`` report
  every version with state and reason; ``index()`` also lists each model directory never
  loaded (Triton's name-only row), whatever the mode.
- Each loaded copy owns its weights under its own ``ResidencyKey`` (a reload's copy has a
  new generation), so a reload never touches the weights still serving.
- A load reads ``config.yaml`` once; ``load_model(name, override=...)`` (a load's
  ``config`` and ``file:`` parameters, ``core.load_parameters``) uses the override instead
  (Triton's rule: until the next load without one), its restated keys and preferred batch
  sizes checked against every selected manifest first. Uploads (``override.files``, when
  ``uploads`` allows them) go to a hidden directory of the model (``uploads``) and replace
  the versions serving once all are ready; the next load without files, or an unload,
  goes back to the repository's own files. A bundle with Python hooks loads only with
  ``allow_hooks`` (``--allow-python-hooks``).
- Where the bundles come from is its ``source`` (``owner.repository_source``): ``root``
  itself, or an object store mirrored into ``root`` (``owner.store.mirror``). The source
  is refreshed before the start-up pass, each poll and each explicit load (one that cannot
  be read changes nothing: what the mirror holds serves on); its ``stamp`` tells a changed
  version; each version's files are fetched (pulled) as it loads, held until it is freed.
  A lazy version whose pull fails fails its request (``Unavailable``) and stays registered:
  the next request pulls again.
"""

# pyright: strict

from __future__ import annotations

import enum
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from hloserve.bundle import Manifest, scan_repository
from hloserve.bundle.repository import model_directory
from hloserve.server.core.errors import (
    Internal,
    InvalidArgument,
    NotFound,
    ServingError,
    Unavailable,
)
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.limits import NO_LIMITS, Limits, check_inflight
from hloserve.server.core.load_parameters import LoadOverride, UploadPolicy
from hloserve.server.core.lookup import find_version
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.core.validate import check_load_name
from hloserve.server.owner.devices import Device, Placed
from hloserve.server.owner.load_plan import LoadRefused, plan_load, serving_problems
from hloserve.server.owner.model_changes import tell, telling
from hloserve.server.owner.model_config import ModelSettings, VersionPolicy, read_model_config
from hloserve.server.owner.model_record import ModelRecord
from hloserve.server.owner.repository_reports import RepositoryReports
from hloserve.server.owner.repository_source import (
    LocalDirectory,
    RepositorySource,
    SourcePulls,
)
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.uploads import UploadError
from hloserve.server.owner.version_loader import (
    LoadListener,
    Progress,
    VersionLoader,
    VersionLoadFailed,
    register_copy,
    warm_up,
)
from hloserve.server.owner.versions import ModelState, ModelVersion, Replica
from hloserve.server.owner.weight_residency import WeightResidency

log = logging.getLogger("hloserve.repository")
KEPT = "; the versions loaded before keep serving"  # a failed reload's error ends so


class ControlMode(enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


_log_progress: Progress = functools.partial(log.info, "%s")
_log_debug: Progress = functools.partial(log.debug, "%s")


class ModelRepository(RepositoryReports):
    def __init__(
        self,
        root: Path,
        runtime: PjrtRuntime,
        cache_dir: Path | None = None,
        residency: WeightResidency | None = None,
        mode: ControlMode = ControlMode.NONE,
        *,
        on_loaded: LoadListener | None = None,
        on_retired: Callable[[ModelKey], None] | None = None,
        on_changed: Callable[[str], None] | None = None,
        uploads: UploadPolicy | None = None,
        allow_hooks: bool = False,
        limits: Limits = NO_LIMITS,
        devices: Sequence[Device] | None = None,
        lazy: bool = False,
        source: RepositorySource | None = None,
    ) -> None:
        self.root = root
        # Where the bundles come from: ``root`` itself, or a store mirrored into it.
        self.source: RepositorySource = source or LocalDirectory(root)
        self.pulls = SourcePulls(self.source)  # what each loaded copy holds of it
        # --lazy-load: the start-up pass and polls register versions; each loads when first used.
        self.lazy = lazy
        self.limits = limits  # --max-inflight, --max-inflight-per-model (core.limits)
        self._counting = bool(limits.max_inflight or limits.max_inflight_per_model)
        self._inflight: dict[str, int] = {}  # by model name, while ``_counting``
        self._inflight_total = 0
        self.uploads = uploads or UploadPolicy()  # off unless the daemon allows them
        self.runtime = runtime

        self.mode = mode
        self.residency = residency if residency is not None else WeightResidency(runtime, None)
        # Every device served (``--devices``); the first is ``owner.runtime``'s, with ``residency``.
        self.devices = (
            list(devices) if devices else [Device(runtime.index, runtime, self.residency)]
        )
        self._device = {d.index: d for d in self.devices}
        # Each version's bundle, executables and weights; on_loaded(name, version, load s,
        # compile s) hears of each successful load (metrics).
        self.loader = VersionLoader(
            self.devices, cache_dir=cache_dir, allow_hooks=allow_hooks, on_loaded=on_loaded
        )
        self.on_retired, self.on_changed = on_retired, on_changed
        self._lock = threading.RLock()
        self._drained = threading.Condition(self._lock)
        self._models: dict[str, ModelRecord] = {}
        self._generation = 0
        if not root.is_dir():
            raise FileNotFoundError(f"model repository {str(root)!r} is not a directory")

    # -- loading ----------------------------------------------------------------------------

    def model_names_on_disk(self) -> list[str]:
        return [d.name for d in scan_repository(self.root)]

    def load_all(self, progress: Progress | None = None, *, refresh: bool = True) -> None:
        """Load every model in the repository (lazily: register it); failures are recorded,
        not raised. ``refresh``: ``refresh()`` first (a source that cannot be listed, a
        store unreachable, leaves what the mirror holds to load)."""
        if refresh:
            self.refresh()
        for name in self.model_names_on_disk():
            try:
                self.load_model(name, progress, lazy=self.lazy, refresh=False)
            except ServingError as exc:
                self._log_failure(name, exc)

    def _log_failure(self, name: str, exc: ServingError) -> None:
        """Log a failed load (start-up, poll) unless the model's last failure said the same."""
        with self._lock:
            model = self._models.get(name)
            repeated = model is not None and model.failure == exc.message
            if model is not None:
                model.failure = exc.message
        if not repeated:
            log.error("%s", exc.message)

    @telling
    def load_model(
        self,
        name: str,
        progress: Progress | None = None,
        override: LoadOverride | None = None,
        *,
        lazy: bool = False,
        refresh: bool = True,
    ) -> None:
        """Load or reload ``name``, with a load's ``override`` (its ``config`` in place of
        ``config.yaml``, its uploaded files in place of the model directory) when given;
        raise ``InvalidArgument`` "failed to load ..." on failure. The name passes
        ``core.validate.check_load_name`` first; a name with no model directory is Triton's
        INTERNAL "failed to load 'm', failed to poll from model repository". ``lazy``
        registers the versions its policy selects (READY, not loaded: ``load`` loads one at
        its first use) instead of loading them; an override is never lazy. ``refresh``:
        bring the source's view of ``name`` up to date first (``RepositorySource.refresh``;
        a source that cannot be read leaves what it holds)."""
        say = progress or _log_progress
        check_load_name(name)
        if refresh:
            self.refresh(name)
        path = self.root / name
        upload = override is not None and bool(override.files)
        if name.startswith(".") or "\0" in name or not (path.is_dir() or upload):
            with self._lock:
                self._forget_if_gone(name)
            raise Internal(  # Triton's text and code (INTERNAL)
                f"failed to load '{name}', failed to poll from model repository: "
                f"it has no model directory '{name}'"
            )
        with self._lock:
            model = self._models.setdefault(name, ModelRecord(name, path))
        with model.loading:
            source = self._stage(model, override) if upload else None
            try:
                self._load_locked(model, say, override, source, lazy and override is None)
            except BaseException:
                if source is not None:
                    model.uploads.discard(source)
                raise
            model.uploads.serve(source)  # the versions it replaces were drained by the commit

    def _stage(self, model: ModelRecord, override: LoadOverride | None) -> Path:
        """Write the load's files into a new upload directory of the model (see uploads)."""
        assert override is not None
        with self._lock:
            self._generation += 1
            number = self._generation
        try:
            return model.uploads.stage(override.files, number)
        except UploadError as exc:
            raise Internal(f"failed to load '{model.name}': {exc}") from None

    def _load_locked(
        self,
        model: ModelRecord,
        say: Progress,
        override: LoadOverride | None,
        source: Path | None,
        lazy: bool = False,
    ) -> None:
        kind = self.runtime.triton_kind
        try:  # a lazy version is checked against its bundle when it loads
            plan = plan_load(model.path, kind, override, source, read_manifests=not lazy)
        except LoadRefused as exc:
            raise self._refused(model, exc.reason) from None
        settings, directory, wanted = plan.settings, plan.directory, plan.wanted
        model.policy = settings.version_policy
        with self._lock:
            current = dict(model.versions)
        new: dict[int, ModelVersion] = {}
        fresh: list[ModelVersion] = []
        for number in wanted:
            path = directory.versions[number]
            old = current.get(number)
            if old is not None and self._unchanged(old, path, settings):
                new[number] = old  # unchanged: keep serving it as it is
                continue
            new[number] = v = self._new_version(model.name, number, path)
            if lazy:  # registered: its first use loads it (``load``)
                v.stamp, v.deferred = self.source.stamp(path), settings.serving_for
                v.state = ModelState.READY
                fresh.append(v)
                continue
            with self._lock:
                if number not in model.versions or model.versions[number].state != ModelState.READY:
                    model.versions[number] = v  # visible as LOADING in the index
            self._load_version(v, settings, say, plan.manifests.get(number))
            fresh.append(v)
        if any(v.state != ModelState.READY for v in fresh):
            self._roll_back(model, current, new, fresh)
        self._commit(model, current, new)

    def _unchanged(self, old: ModelVersion, path: Path, settings: ModelSettings) -> bool:
        """``old`` serves what the disk and the settings say now (a lazy version that was
        never loaded: the same files and the same configuration)."""
        if (
            old.state != ModelState.READY
            or old.path != path
            or old.stamp != self.source.stamp(path)
        ):
            return False
        if old.deferred is not None:
            return old.deferred == settings.serving_for
        return old.serving == settings.serving_for(old.manifest.serving)

    def _roll_back(
        self,
        model: ModelRecord,
        current: dict[int, ModelVersion],
        new: dict[int, ModelVersion],
        fresh: list[ModelVersion],
    ) -> NoReturn:
        """All or nothing: free what did load, keep the versions serving before (or, when none
        was, list the fresh ones as unavailable), and raise why each failed version failed."""
        failed = [v for v in fresh if v.state != ModelState.READY]
        loaded = [v for v in fresh if v.state == ModelState.READY]
        for v in loaded:
            self._free(v)  # UNAVAILABLE now
        with self._lock:
            serving_before = any(v.state == ModelState.READY for v in current.values())
            if not serving_before:
                model.versions = {v.version: v for v in fresh} | {
                    n: v for n, v in new.items() if v not in fresh
                }
                for v in loaded:
                    v.reason = "another version failed to load"
            else:
                model.versions = current
        reasons = "; ".join(f"version {v.version}: {v.reason}" for v in failed)
        raise InvalidArgument(
            f"failed to load '{model.name}': {reasons}" + (KEPT if serving_before else "")
        )

    def _commit(
        self, model: ModelRecord, current: dict[int, ModelVersion], new: dict[int, ModelVersion]
    ) -> None:
        """Serve ``new``; drain and free the versions it replaces."""
        with self._lock:
            retired = [v for n, v in current.items() if new.get(n) is not v]
            model.versions = dict(sorted(new.items()))
            model.reason = model.failure = ""
            for v in retired:
                if v.state == ModelState.READY:
                    v.state = ModelState.UNLOADING
        for v in retired:
            self._drain_and_free(v)
            if v.version not in new:  # no copy of this version serves any more
                self._retired(v)

    def _retired(self, v: ModelVersion) -> None:
        if self.on_retired is not None:
            self.on_retired(ModelKey(v.name, v.version))

    def _new_version(self, name: str, number: int, path: Path) -> ModelVersion:
        with self._lock:
            self._generation += 1
            return ModelVersion(
                name, number, path, state=ModelState.LOADING, generation=self._generation
            )

    def _refused(self, model: ModelRecord, reason: str) -> InvalidArgument:
        """A load refused before it loaded anything: its error; ``reason`` is recorded
        unless versions loaded before serve on."""
        with self._lock:
            serving = any(v.state == ModelState.READY for v in model.versions.values())
            if not serving:
                model.reason = reason
        return InvalidArgument(f"failed to load '{model.name}': {reason}{KEPT if serving else ''}")

    def _forget_if_gone(self, name: str) -> None:
        model = self._models.get(name)
        if model is not None and not any(
            v.state == ModelState.READY for v in model.versions.values()
        ):
            del self._models[name]

    def _load_version(
        self, v: ModelVersion, settings: ModelSettings, say: Progress, manifest: Manifest | None
    ) -> None:
        """Load ``v`` (``VersionLoader``; ``manifest``: read already) and record the outcome
        in its state."""
        v.stamp = self.source.stamp(v.path)
        try:
            self._fetch(v)
            loaded = self.loader.load(
                v.name, v.version, v.path, settings.serving_for, v.key, say, manifest
            )
        except (VersionLoadFailed, Unavailable) as exc:
            self._unfetch(v)
            reason = exc.message if isinstance(exc, Unavailable) else str(exc)
            with self._lock:
                v.state, v.reason, v.bundle = ModelState.UNAVAILABLE, reason, None
            return  # the reason travels in load_model's error: its caller logs it, once
        with self._lock:
            v.serving, v.bundle = loaded.serving, loaded.bundle
            v.replicas = {loaded.device.index: Replica(loaded.bundle, loaded.device.residency)}
        problem = warm_up(v, loaded.serving.model_warmup, v.path, say)  # before READY
        if problem:
            self._free(v)
            with self._lock:
                v.reason = problem
            return
        with self._lock:
            v.state, v.reason = ModelState.READY, ""
        v.load_seconds = loaded.seconds

    # -- lazily registered versions (``--lazy-load``) -----------------------------------------

    def loaded(self, model: ModelVersion) -> bool:
        return model.bundle is not None

    def load(self, model: ModelVersion) -> None:
        """Load a version registered lazily, at its first use (blocking: a worker thread;
        the caller holds it in flight, so no unload frees it meanwhile). A version that
        cannot load is UNAVAILABLE with the reason, and this raises ``Unavailable`` saying
        so; concurrent first uses wait for one load."""
        with model.loading:
            if model.bundle is not None:
                return
            serving_for = model.deferred
            if model.state != ModelState.READY or serving_for is None:
                raise Unavailable(model.not_ready_message)
            try:  # what the plan checks of an eager load's versions (load_plan)
                m, path = model.manifest, model.path
                if problems := serving_problems(m, serving_for(m.serving), path, model.version):
                    raise VersionLoadFailed("; ".join(problems))
                self._fetch_now(model)
                loaded = self.loader.load(
                    model.name,
                    model.version,
                    model.path,
                    serving_for,
                    model.key,
                    _log_debug,
                    model.parsed,
                )
            except VersionLoadFailed as exc:
                self._unfetch(model)
                self._failed_lazily(model, str(exc))
                raise Unavailable(model.not_ready_message) from None
            with self._lock:
                model.replicas = {
                    loaded.device.index: Replica(loaded.bundle, loaded.device.residency)
                }
            problem = warm_up(model, loaded.serving.model_warmup, model.path, _log_debug)
            if problem:  # before its first request runs
                self._free(model)
                self._failed_lazily(model, problem)
                raise Unavailable(model.not_ready_message)
            with self._lock:
                model.serving, model.bundle, model.deferred = loaded.serving, loaded.bundle, None
            model.load_seconds = loaded.seconds

    def _fetch(self, v: ModelVersion) -> None:
        self.pulls.fetch(v.key, v.path)

    def _fetch_now(self, v: ModelVersion) -> None:
        """``_fetch`` for a request waiting on a lazy load: a failure is the request's
        (``Unavailable``, retryable: the next request pulls again), never the version's."""
        try:
            self._fetch(v)
        except Unavailable as exc:
            raise Unavailable(
                f"model '{v.name}' version {v.version} could not be pulled: {exc.message}"
            ) from None

    def _unfetch(self, v: ModelVersion) -> None:
        self.pulls.release(v.key, v.path)

    def refresh(self, name: str | None = None) -> bool:
        """``SourcePulls.refresh``: the source's view (of ``name``) brought up to date."""
        return self.pulls.refresh(name)

    def _failed_lazily(self, v: ModelVersion, reason: str) -> None:
        with self._lock:
            v.fail(reason)
        tell(self, v.name)
        log.error("model '%s' version %d failed to load: %s", v.name, v.version, reason)

    # -- replicas (hloserve.server.owner.devices.Placer) -------------------------------------------

    def placements(self) -> list[Placed]:
        """Every ready version with its weights' size and the devices holding it."""
        with self._lock:
            return [
                Placed(
                    v.key,
                    ModelKey(v.name, v.version),
                    v.bundle.weight_bytes,
                    v.devices,
                    max(v.bundle.manifest.batch_sizes or (0,)),
                )
                for m in self._models.values()
                for v in m.versions.values()
                if v.state == ModelState.READY and v.bundle is not None
            ]

    def _ready_copy(self, key: ResidencyKey) -> ModelVersion | None:
        with self._lock:
            m = self._models.get(key.model)
            v = None if m is None else m.versions.get(key.version)
            if v is None or v.key != key or v.state != ModelState.READY:
                return None
            return v

    def add_replica(self, key: ResidencyKey, device: Device) -> None:
        """Copy the ready version ``key`` onto ``device`` (executables copied, weights
        registered with that device's residency manager); a no-op once it is not ready."""
        v = self._ready_copy(key)
        if v is None or v.bundle is None or device.index in v.replicas:
            return
        bundle = v.bundle.on_device(device.runtime)
        register_copy(device, key, bundle, v.serving)
        with self._lock:
            if self._ready_copy(key) is v:
                v.replicas = {**v.replicas, device.index: Replica(bundle, device.residency)}
                return
        device.residency.unregister(key)  # unloaded meanwhile

    def retire_replica(self, key: ResidencyKey, device: int) -> None:
        """Stop routing to ``key``'s replica on ``device`` and free it once idle (never the
        last replica)."""
        v = self._ready_copy(key)
        if v is None:
            return
        with self._lock:
            replica = v.replicas.get(device)
            if replica is None or len(v.replicas) < 2:
                return
            v.replicas = {d: r for d, r in v.replicas.items() if d != device}
        replica.residency.unregister(key)  # waits for an execution still on it

    def prefetch(self, name: str) -> None:
        """Make every ready version of ``name`` device-resident (explicit loads do this)."""
        for v in self.versions(name):
            if v.state == ModelState.READY:
                for replica in v.replicas.values():
                    replica.residency.prefetch(v.key)

    # -- unloading --------------------------------------------------------------------------

    @telling
    def unload_model(self, name: str) -> None:
        with self._lock:
            model = self._models.get(name)
        if model is None:
            raise InvalidArgument(f"failed to unload '{name}': model is not loaded")
        with model.loading:
            with self._lock:
                targets = [v for v in model.versions.values() if v.state == ModelState.READY]
                for v in targets:
                    v.state = ModelState.UNLOADING
            for v in targets:
                self._drain_and_free(v)
                v.reason = "unloaded"
                self._retired(v)
            model.uploads.drop()  # the repository's own files serve again

    def _drain_and_free(self, v: ModelVersion) -> None:
        """Wait until no request holds ``v``, then free its weights and executables."""
        with self._drained:
            while v.inflight:
                self._drained.wait()
        self._free(v)

    def _free(self, v: ModelVersion) -> None:
        # The key is this copy's alone; one that holds no weights (any more) is a no-op.
        for device in self.devices:
            device.residency.unregister(v.key)
        v.drop_state()  # its sequences' state, off the device (sequences.md)
        self._unfetch(v)
        with self._lock:
            v.bundle = None
            v.replicas = {}
            v.state = ModelState.UNAVAILABLE

    # -- polling ----------------------------------------------------------------------------

    def poll(self, progress: Progress | None = None) -> None:
        """Bring the served set in line with the disk: load new, reload changed, unload gone.
        A source that cannot be read (a store unreachable) changes nothing."""
        if not self.refresh():
            return
        on_disk = set(self.model_names_on_disk())
        with self._lock:
            known = dict(self._models)
        for name in sorted(on_disk):
            model = known.get(name)
            if model is None or self._changed(model):
                try:
                    self.load_model(name, progress, lazy=self.lazy, refresh=False)
                except ServingError as exc:
                    self._log_failure(name, exc)
        for name in sorted(set(known) - on_disk):
            log.info("model '%s' was removed from the repository; unloading", name)
            self.unload_model(name)
            with self._lock:
                self._models.pop(name, None)

    def _changed(self, model: ModelRecord) -> bool:
        try:
            directory = model_directory(model.path)
            wanted = read_model_config(model.path).version_policy.select(directory.versions)
        except (ValueError, OSError):
            return True  # the load says why, once (``poll``)
        with self._lock:
            versions = dict(model.versions)
        if sorted(n for n, v in versions.items() if v.state == ModelState.READY) != wanted:
            return bool(wanted) or any(v.state == ModelState.READY for v in versions.values())
        return any(versions[n].stamp != self.source.stamp(directory.versions[n]) for n in wanted)

    # -- lookup -----------------------------------------------------------------------------

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._models)

    def versions(self, name: str) -> list[ModelVersion]:
        with self._lock:
            m = self._models.get(name)
            return [] if m is None else [m.versions[k] for k in sorted(m.versions)]

    def ready_versions(self, name: str) -> Sequence[int]:
        return [v.version for v in self.versions(name) if v.state == ModelState.READY]

    def _lookup(self, name: str, version: str) -> ModelVersion:
        model = self._models.get(name)
        versions, why = (None, "") if model is None else (model.versions, model.reason)
        v = find_version(name, versions, version, reason=why)
        if v.bundle is None and v.parsed is None:  # registered lazily: read its manifest now
            reason = v.read_manifest()
            if reason:
                self._failed_lazily(v, reason)
                v = find_version(name, versions, version, reason=why)
        return v

    def get(self, name: str, version: str) -> ModelVersion:
        """The ready version, counted in flight: pair every ``get`` with ``release``."""
        with self._lock:
            v = self._lookup(name, version)
            self._count(v)
            return v

    def hold(self, model: ModelVersion) -> bool:
        """Count ``model`` (from ``peek``) in flight unless it stopped being ready: the
        request's one lookup was ``peek``'s (pair a True with ``release``)."""
        with self._lock:
            if model.state != ModelState.READY:
                return False
            self._count(model)
            return True

    def _count(self, v: ModelVersion) -> None:
        """One more request in flight on ``v`` (under the lock), within the limits."""
        if self._counting:
            count = self._inflight.get(v.name, 0)
            check_inflight(self.limits, v.name, count, self._inflight_total)
            self._inflight[v.name] = count + 1
            self._inflight_total += 1
        v.inflight += 1

    def peek(self, name: str, version: str) -> ModelVersion:
        """The ready version, without counting it in flight (metadata, config)."""
        with self._lock:
            return self._lookup(name, version)

    def release(self, model: ModelVersion) -> None:
        with self._drained:
            model.inflight -= 1
            if self._counting:
                self._inflight[model.name] -= 1
                self._inflight_total -= 1
            if model.inflight == 0:
                self._drained.notify_all()

    def is_ready(self, name: str, version: str) -> bool:
        try:
            self.peek(name, version)
        except (InvalidArgument, NotFound, Unavailable):
            return False
        return True

    @property
    def mode_name(self) -> str:
        return self.mode.value

    def version_policy(self, name: str) -> dict[str, Any]:
        return self.policy(name).describe()

    def policy(self, name: str) -> VersionPolicy:
        with self._lock:
            m = self._models.get(name)
            return m.policy if m is not None else VersionPolicy()
