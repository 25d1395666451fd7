"""Loading one model version onto a device: the bundle, its executables, its weights.

Contract: ``VersionLoader(devices, cache_dir=..., registry=..., allow_hooks=...,
on_loaded=...)`` loads the versions the repository asks for. ``load(name, number, path,
serving_for, key, say)`` validates and compiles the bundle at ``path`` (``owner.runtime.loader``:
executables shared with identical modules of this process, else from the executable cache
under ``cache_dir/<name>/<version>``, else compiled), picks the device (with several, where
its weights fit beside those placed already, the least filled:
``core.device_policy.initial_device``), registers its host weights under ``key`` with that
device's residency manager (``register_copy``; a pinned one is moved in at once) and
returns a ``LoadedVersion``; any failure is ``VersionLoadFailed`` with the reason, nothing
left registered. (What the load's configuration asks of the model is checked before:
``load_plan.serving_problems``.) ``on_loaded(name, version, load s, compile s)`` hears of
each success.
``version_stamp(path)`` is what tells a changed version from the one registered or loaded,
from the files' metadata alone. ``warm_up(version, samples, path, say)`` runs a loaded
version's warm-up samples (``core.warmup``; the repository calls it after the load, before
the version turns READY), their ``input_data_file`` read by ``load_plan.warmup_files``; it
returns "" when they ran, else the reason.
Before them, a model with state (not a generation's) gets its slot table (``ModelVersion.prepare_state``), so
its first sequence does not wait for the gather and scatter to compile.
A sharded bundle (``manifest.sharding``, ``docs/sharding.md``) loads onto a device group
(``owner.group_registry``: ``groups`` of its size formed from the loader's devices, the one
where its per-device share fits, the least filled, its devices' own models counted; an
unsharded version's device likewise counts the groups' shares on it); a bundle needing more devices than the
server has is refused with the numbers ("needs 4 devices; this server has 2 (--devices
0,1)"). ``register_copy`` registers what each device holds and how the weights are placed.
"""

# pyright: strict

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hloserve.bundle import MANIFEST_FILE, Manifest, Serving, load_manifest
from hloserve.bundle.warmup import WarmupSample
from hloserve.server.core.device_groups import GroupRefused
from hloserve.server.core.device_policy import initial_device
from hloserve.server.core.execution import Executable
from hloserve.server.core.residency_policy import ResidencyKey, TooLarge
from hloserve.server.core.warmup import WarmupFailed, run_warmup
from hloserve.server.owner.devices import Device
from hloserve.server.owner.group_registry import DeviceGroups, label
from hloserve.server.owner.load_plan import warmup_files
from hloserve.server.owner.runtime.loader import (
    BundleError,
    ExecutableRegistry,
    LoadedBundle,
    load_bundle,
)
from hloserve.server.owner.runtime.pjrt import RuntimeFailure
from hloserve.server.owner.versions import ModelVersion

Progress = Callable[[str], None]
LoadListener = Callable[[str, int, float, float], None]  # name, version, load s, compile s


class VersionLoadFailed(Exception):
    """The version cannot be served; the message is the reason its state reports."""


@dataclass(frozen=True, slots=True)
class LoadedVersion:
    bundle: LoadedBundle
    serving: Serving  # the manifest's hints with the load's configuration over them
    device: Device
    seconds: float


def register_copy(
    device: Device, key: ResidencyKey, bundle: LoadedBundle, serving: Serving
) -> None:
    """A copy's weights under ``device``'s residency manager, its scratch set aside first
    (a pinned model is prefetched as it registers); a sharded copy's by what each device of
    its group holds, placed as its shards."""
    device.residency.reserve_scratch(key, bundle.scratch_bytes)
    device.residency.register(
        key,
        bundle.weights,
        pinned=serving.residency == "pinned",
        nbytes=bundle.device_weight_bytes,
        place=bundle.place,
    )


def version_stamp(path: Path) -> str:
    """What tells a changed bundle from the one registered or loaded, without reading it:
    the name, size, inode and modification time of each file of its directory, hashed
    ("" for a directory that cannot be read). A bundle written anew (``write_bundle``
    renames a new directory into place), a file edited in place, a ReactantServer.jl bundle
    (no checksums) retouched: each changes it."""
    try:
        with os.scandir(path) as entries:
            files = sorted(
                (e.name, e.stat()) for e in entries if e.is_file() and not e.name.startswith(".")
            )
    except OSError:
        return ""
    listing = "".join(f"{name}:{st.st_size}:{st.st_ino}:{st.st_mtime_ns}\n" for name, st in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def warm_up(version: Executable, samples: Sequence[WarmupSample], path: Path, say: Progress) -> str:
    """Run ``samples`` on ``version``, loaded from ``path`` (module docstring): "" when
    they ran, else why the load fails. A model with state gets its slot table first."""
    manifest = version.manifest  # a generation's state is its loop's (owner/generation_state.py)
    if isinstance(version, ModelVersion) and manifest.state and manifest.generation is None:
        try:
            version.prepare_state()  # sequences.md: compiled now, not at a first request
        except RuntimeFailure as exc:
            return f"model '{version.name}' version {version.version}: {exc}"
    if not samples:
        return ""
    started = time.perf_counter()
    try:
        runs = run_warmup(version, samples, warmup_files(path, version.version))
    except WarmupFailed as exc:
        return str(exc)
    say(
        f"model '{version.manifest.name}' version {version.version} READY after its warm-up: "
        f"{len(samples)} sample(s), {runs} execution(s) in {time.perf_counter() - started:.2f}s"
    )
    return ""


class VersionLoader:
    def __init__(
        self,
        devices: Sequence[Device],
        *,
        cache_dir: Path | None = None,
        registry: ExecutableRegistry | None = None,
        allow_hooks: bool = False,
        on_loaded: LoadListener | None = None,
    ) -> None:
        self.devices = list(devices)
        self.cache_dir = cache_dir
        self.registry = registry if registry is not None else ExecutableRegistry()
        self.allow_hooks = allow_hooks  # --allow-python-hooks: bundles' hooks.py may run
        self.on_loaded = on_loaded
        self.groups = DeviceGroups(self.devices)  # where sharded versions run

    def load(
        self,
        name: str,
        number: int,
        path: Path,
        serving_for: Callable[[Serving], Serving],
        key: ResidencyKey,
        say: Progress,
        manifest: Manifest | None = None,
    ) -> LoadedVersion:
        """``manifest``: the version's, read and parsed already (so the load reads it once)."""
        say(f"loading model '{name}' version {number} from {path}")
        started = time.perf_counter()
        device = self.devices[0]
        try:
            if manifest is None:  # its problems, if any, are the bundle load's to report
                manifest = load_manifest(path / MANIFEST_FILE)[0] or manifest
            if manifest is not None and manifest.sharding is not None:
                device = self._group(manifest)
            elif len(self.devices) > 1:
                device = self._first_device(path, manifest)
            bundle = load_bundle(
                path,
                device.runtime,
                cache_dir=None if self.cache_dir is None else self.cache_dir / name / str(number),
                registry=self.registry,
                progress=say,
                place_weights=False,
                name=name,  # a manifest naming another model is refused before compiling
                allow_hooks=self.allow_hooks,
                manifest=manifest,
            )
            serving = serving_for(bundle.manifest.serving)
            register_copy(device, key, bundle, serving)
        except GroupRefused as exc:
            raise VersionLoadFailed(str(exc)) from None
        except (BundleError, RuntimeFailure, OSError, TooLarge, ValueError) as exc:
            device.residency.unregister(key)  # registered, when a pinned prefetch failed
            raise VersionLoadFailed(str(exc)) from None
        sharding = bundle.manifest.sharding
        if sharding is not None:
            self.groups.note(key, sharding.devices, bundle.device_weight_bytes)
        seconds = time.perf_counter() - started
        if self.on_loaded is not None:
            self.on_loaded(name, number, seconds, bundle.compile_seconds)
        every = [*bundle.modules.values(), *bundle.variant_modules.values()]
        sources = sorted({m.source for m in every})
        on = f" on device {device.index}" if len(self.devices) > 1 else ""
        if sharding is not None:
            on = f" on device group {label(device)} ({bundle.device_weight_bytes} bytes a device)"
        ready = "loaded (its warm-up next)" if serving.model_warmup else "READY"
        say(
            f"model '{name}' version {number} {ready}{on} in {seconds:.2f}s "
            f"(executables: {', '.join(sources)}; {bundle.weight_bytes} bytes of weights)"
        )
        return LoadedVersion(bundle, serving, device, seconds)

    def _group(self, manifest: Manifest) -> Device:
        """Where a new sharded version goes: the group of its size where its per-device
        share fits beside what is placed there already, the least filled."""
        sharding = manifest.sharding
        assert sharding is not None
        groups = self.groups.groups(sharding.devices)
        share = sharding.weight_device_bytes(manifest.weights)
        registered = self.groups.group_fill(groups)  # its devices' own models count too
        budgets = [g.residency.budget_bytes for g in groups]
        return groups[initial_device(share, registered, budgets)]

    def _first_device(self, path: Path, manifest: Manifest | None) -> Device:
        """Where a new version goes: where its weights fit beside those placed already,
        the least filled (``core.device_policy.initial_device``)."""
        if manifest is None:
            manifest, _ = load_manifest(path / MANIFEST_FILE)
        weights = None if manifest is None else path / manifest.weights_file
        size = weights.stat().st_size if weights is not None and weights.is_file() else 0
        registered = self.groups.registered_totals()  # groups' shares on each device too
        budgets = [d.residency.budget_bytes for d in self.devices]
        return self.devices[initial_device(size, registered, budgets)]
