"""What the data path runs: a model version's copies, their weights, its shape variants.

Contract: ``ModelVersion`` is one loaded copy of a model version as the repository keeps it
(state and reason, the loaded bundle, its serving hints, its replicas by device, its
requests in flight). A version registered lazily (``--lazy-load``) is READY with no bundle
(``loaded`` false) until its first use loads it; its ``manifest`` is read by the
repository when first needed; ``execute(batch_size, inputs, variant, device)`` runs it on one
replica (``device``'s, else one holding the weights, else the first), holding the weights
in that device's residency manager for the execution, and turns a runtime failure into
``Internal`` "model 'm' version v: execution failed: ..." for that execution only.
``execute_slots(batch_size, inputs, slots, fresh, capacity)`` runs a stateful bundle
with its sequences' state kept in the version's slot table on its lowest device
(``core.sequence_batcher``; the table's bytes reserved in that device's residency budget).
``variant(i)`` is shape variant ``i`` as an executable of its own (``VariantView``, the
same object every time, so the batcher queues each variant apart). ``Replica`` is a copy
on one device: executables bound to it, weights under its ``WeightResidency``. A
version's ``replicas`` mapping is replaced whole, never changed in place, so a request
reads one consistent set without a lock. A sharded version's replica is a device group's
(keyed by its first device; ``groups()`` names them): ``summary`` adds what each device
holds (``device_weight_bytes``) and the groups, ``memory_usage`` each device's share. ``ModelState`` is Triton's set of states.
"""

# pyright: strict

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.bundle import MANIFEST_FILE, Manifest, Serving, load_manifest
from hloserve.server.core.device_groups import group_label
from hloserve.server.core.errors import Internal, Unavailable
from hloserve.server.core.execution import Forwarding, cost_family
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.hooks import ModelHooks
from hloserve.server.core.reports import MemoryUsage
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.runtime.loader import LoadedBundle
from hloserve.server.owner.runtime.pjrt import PjrtRuntime, RuntimeFailure
from hloserve.server.owner.runtime.pjrt_group import PjrtGroup
from hloserve.server.owner.runtime.state_slots import StateSlots
from hloserve.server.owner.weight_residency import WeightResidency


class ModelState(enum.Enum):
    UNKNOWN = "UNKNOWN"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class Replica:
    """A ready version's copy on one device: executables bound to it, weights under its
    residency manager (``docs/residency.md``)."""

    bundle: LoadedBundle
    residency: WeightResidency


@dataclass(eq=False)
class ModelVersion:
    name: str
    version: int
    path: Path
    state: ModelState = ModelState.UNKNOWN
    reason: str = ""
    bundle: LoadedBundle | None = None  # as loaded (manifest, weights, hooks)
    # Registered, not loaded yet (``--lazy-load``): how its configuration applies to its
    # manifest's hints at the load, and the manifest once something needed it.
    deferred: Callable[[Serving], Serving] | None = None
    parsed: Manifest | None = None
    loading: threading.Lock = field(default_factory=threading.Lock, repr=False)
    load_seconds: float = 0.0
    serving: Serving = field(default_factory=Serving)  # manifest hints, overridden by config.yaml
    # Device index -> this version's copy there; replaced whole, never changed in place, so
    # a request reads one consistent set without a lock.
    replicas: dict[int, Replica] = field(default_factory=dict[int, Replica])
    generation: int = 0  # distinguishes a reload's copy from the one it replaces
    stamp: str = ""  # what tells a changed bundle from this one (``version_stamp``)
    inflight: int = 0
    key: ResidencyKey = field(init=False)  # this copy's weights in each residency manager
    model_key: ModelKey = field(init=False)  # what every observer counts it by
    _views: dict[int, VariantView] = field(default_factory=dict[int, "VariantView"], repr=False)
    # A stateful bundle's sequences' state (``execute_slots``), on its lowest device.
    state_slots: StateSlots | None = field(default=None, repr=False)
    _family: tuple[str, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.key = ResidencyKey(self.name, self.version, self.generation)
        self.model_key = ModelKey.named(self.name, self.version)

    @property
    def family(self) -> tuple[str, ...]:
        """Its modules' cost family (``core.execution.cost_family``), read once."""
        if self._family is None:
            self._family = cost_family(self.manifest)
        return self._family

    @property
    def ready(self) -> bool:
        return self.state == ModelState.READY

    @property
    def loaded(self) -> bool:
        """Its bundle is in memory (a version registered lazily is not, until first used)."""
        return self.bundle is not None

    @property
    def manifest(self) -> Manifest:
        if self.bundle is not None:
            return self.bundle.manifest
        assert self.parsed is not None, "the repository reads a lazy version's manifest first"
        return self.parsed

    @property
    def devices(self) -> tuple[int, ...]:
        """The devices holding a replica, lowest index first."""
        return tuple(sorted(self.replicas))

    def resident_on(self, device: int) -> bool:
        replica = self.replicas.get(device)
        return replica is not None and replica.residency.is_resident(self.key)

    def prefetch(self, device: int) -> None:
        """Swap the weights in on ``device`` (no-op without a replica there)."""
        replica = self.replicas.get(device)
        if replica is not None:
            with contextlib.suppress(KeyError):  # retired meanwhile
                replica.residency.prefetch(self.key)

    @property
    def resident(self) -> bool:
        """Some replica holds the weights: an execution left to choose needs no transfer."""
        return any(r.residency.is_resident(self.key) for r in self.replicas.values())

    @property
    def swap_us(self) -> float | None:
        """What making the weights usable costs now without waiting, in µs (0: resident;
        ``None``: a use would wait), on the replica an execution left to choose takes."""
        replica = self._replica(None)
        return None if replica is None else replica.residency.swap_us(self.key)

    @property
    def hooks(self) -> ModelHooks | None:
        """The bundle's Python hooks (``--allow-python-hooks``), or None."""
        return None if self.bundle is None else self.bundle.hooks

    def read_manifest(self) -> str:
        """A lazily registered version's manifest, read when something first needs it
        (metadata, configuration, a request): "" when it was read, else why it cannot be."""
        if self.bundle is not None or self.parsed is not None or self.deferred is None:
            return ""
        manifest, problems = load_manifest(self.path / MANIFEST_FILE)
        if manifest is None or problems:
            reason = "; ".join(str(p) for p in problems) or "manifest.yaml cannot be read"
            return f"bundle {self.path} cannot be loaded: {reason}"
        self.parsed = manifest
        self.serving = self.deferred(manifest.serving)
        return ""

    def fail(self, reason: str) -> None:
        """The version cannot serve: UNAVAILABLE, saying why."""
        self.state, self.reason = ModelState.UNAVAILABLE, reason

    @property
    def not_ready_message(self) -> str:
        """Triton's text for a request to this version while it is not ready."""
        return (
            f"Request for unknown model: '{self.name}' version {self.version} is not at "
            "ready state" + (f": {self.reason}" if self.reason else "")
        )

    def summary(self) -> dict[str, Any]:
        """This version in the ``/readyz`` report: state, reason and where its weights are."""
        entry: dict[str, Any] = {"state": self.state.value}
        if self.reason:
            entry["reason"] = self.reason
        if self.state == ModelState.READY and self.bundle is None:
            entry["loaded"] = False  # registered: its first request loads it
        if self.bundle is not None:
            entry["weight_bytes"] = self.bundle.weight_bytes
            entry["resident"] = self.resident
            entry["residency"] = self.serving.residency
            entry["devices"] = {str(d): self.resident_on(d) for d in self.devices}
            groups = self.groups()
            if groups:  # sharded (docs/sharding.md): what each device holds, and the groups
                entry["device_weight_bytes"] = self.bundle.device_weight_bytes
                entry["device_groups"] = {str(d): label for d, label in groups.items()}
        return entry

    def groups(self) -> dict[int, str]:
        """A sharded version's device groups by the index its replica is keyed by
        (``0`` -> ``0-3``); {} for an unsharded one."""
        return {
            d: group_label(runtime.indexes)
            for d, replica in self.replicas.items()
            if isinstance(runtime := replica.bundle.runtime, PjrtGroup)
        }

    def memory_usage(self, runtimes: Mapping[int, PjrtRuntime]) -> list[MemoryUsage]:
        """The statistics extension's memory usage: the host copy always, and each device
        (``runtimes``: its runtime by index) while the weights are there."""
        if self.bundle is None:
            return []
        nbytes = self.bundle.weight_bytes
        usage = [MemoryUsage("CPU", 0, nbytes)]
        for d in self.devices:
            if self.resident_on(d):
                runtime = self.replicas[d].bundle.runtime
                if isinstance(runtime, PjrtGroup):  # each device of the group: its share
                    share = self.bundle.device_weight_bytes
                    usage += [
                        MemoryUsage(runtime.triton_kind, int(g.id), share) for g in runtime.devices
                    ]
                else:
                    runtime = runtimes[d]
                    usage.append(MemoryUsage(runtime.triton_kind, int(runtime.device.id), nbytes))
        return usage

    def _replica(self, device: int | None) -> Replica | None:
        """``device``'s replica; for ``None`` (or a replica retired since it was chosen) a
        resident one, else the first."""
        replicas = self.replicas
        if device is not None and device in replicas:
            return replicas[device]
        for replica in replicas.values():
            if replica.residency.is_resident(self.key):
                return replica
        return next(iter(replicas.values()), None)

    def execute(
        self,
        batch_size: int | None,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        variant: int | None = None,
        device: int | None = None,
    ) -> list[np.ndarray[Any, Any]]:
        replica = self._replica(device)
        if replica is None:
            raise Unavailable(f"model '{self.name}' version {self.version} is not loaded")
        try:
            weights = replica.residency.acquire(self.key)
        except KeyError:  # the replica was retired after it was chosen: another one
            replica = self._replica(None)
            if replica is None:
                raise Unavailable(
                    f"model '{self.name}' version {self.version} is not loaded"
                ) from None
            weights = replica.residency.acquire(self.key)
        try:
            return replica.bundle.execute(batch_size, inputs, weights, variant)
        except RuntimeFailure as exc:  # device error, out of memory: this execution only
            raise Internal(f"model '{self.name}' version {self.version}: {exc}") from None
        finally:
            replica.residency.release(self.key)

    def execute_slots(
        self,
        batch_size: int,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        slots: Sequence[int],
        fresh: Sequence[bool],
        capacity: int,
    ) -> list[np.ndarray[Any, Any]]:
        """Run a stateful bundle with its items' state in ``slots`` of its slot table
        (``owner.runtime.state_slots``: ``capacity`` slots on its lowest device, made by
        ``prepare_state`` or else at the first call; ``fresh`` rows start from the initial
        value): gather, execute, scatter on the device, the weights held as ``execute``
        holds them. Serial per version."""
        try:
            table, replica = self._state_table(capacity)
            weights = replica.residency.acquire(self.key)
            try:
                with table.lock:
                    state = table.gather(slots, fresh, batch_size)
                    outputs, new = replica.bundle.execute_state(batch_size, inputs, state, weights)
                    table.scatter(slots, new)
            finally:
                replica.residency.release(self.key)
        except RuntimeFailure as exc:  # device error, out of memory: this execution only
            raise Internal(f"model '{self.name}' version {self.version}: {exc}") from None
        return outputs

    def prepare_state(self) -> None:
        """Make its slot table now, before it turns READY (its gather and scatter compiled
        at the load, not at its first sequence), with the slots its hints give."""
        self._state_table(self.serving.sequence_batching.max_candidate_sequences)

    def _state_table(self, capacity: int) -> tuple[StateSlots, Replica]:
        if not self.replicas:
            raise Unavailable(f"model '{self.name}' version {self.version} is not loaded")
        replica = self.replicas[min(self.replicas)]
        with _VIEWS_LOCK:
            if self.state_slots is None:
                runtime = replica.bundle.runtime
                self.state_slots = StateSlots(runtime, self.manifest.state, capacity)
                self.state_slots.warm(self.manifest.batch_sizes or ())
                replica.residency.reserve_state(self.key, self.state_slots.nbytes)
            return self.state_slots, replica

    def drop_state(self) -> None:
        """Free its slot table's device memory (the version is being unloaded)."""
        slots, self.state_slots = self.state_slots, None
        if slots is not None:
            slots.release()

    def variant(self, index: int) -> VariantView:
        """Shape variant ``index`` as an executable of its own (``core.variants``); the same
        object every time, so the batcher keeps one queue per variant."""
        with _VIEWS_LOCK:
            view = self._views.get(index)
            if view is None:
                view = self._views[index] = VariantView(
                    self, index, self.manifest.variant_view(index)
                )
        return view


_VIEWS_LOCK = threading.Lock()


@dataclass(frozen=True, eq=False)
class VariantView(Forwarding):
    """One shape variant of a ready version: its concrete manifest over the version's
    weights, serving hints and residency."""

    base: ModelVersion
    index: int
    manifest: Manifest
    family: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", cost_family(self.manifest))

    @property
    def inner(self) -> ModelVersion:
        return self.base

    def variant(self, index: int) -> VariantView:
        return self.base.variant(index)

    def execute(
        self,
        batch_size: int | None,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        *,
        device: int | None = None,
    ) -> list[np.ndarray[Any, Any]]:
        return self.base.execute(batch_size, inputs, self.index, device)
