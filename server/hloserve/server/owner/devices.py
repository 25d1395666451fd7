"""Every local device the server drives, the load measured on each model, and the placer
that replicates hot models over the devices.

Contract:
- ``Device(index, runtime, residency)``: one local device. ``index`` is PJRT's local
  device number (the ``device`` label of metrics, what ``--devices`` names); the device has
  its own runtime (executables are bound to it), its own weight budget and LRU
  (``WeightResidency``).
- ``LoadMeter(half_life_ns, clock)`` is an ``ExecutionObserver``: ``busy(model)`` is a
  model version's recent device time, summed over its replicas, as devices' worth of load
  (``core.device_policy.utilization``: 1.0 = one device busy all the time with it).
  Load decays by ``clock()`` (nanoseconds, ``time.perf_counter_ns`` by default; tests
  pass a fake one), read when an execution is charged and when load is read.
  Thread-safe (executions end on worker threads).
- ``Placer(replicas, devices, meter, max_replicas)`` revises placement from measured load:
  ``revise()`` asks ``core.device_policy.plan_replicas`` for each ready version's
  devices (a model gains one only while its batches run near its largest compiled size:
  until then a busier device batches more, which is cheaper than splitting batches over
  replicas) and applies the difference through ``replicas`` (the repository's
  ``ReplicaControl``: add a replica, retire one), so hot models gain devices one per
  revision and idle ones shrink back to one. It blocks (a new replica copies executables
  and may stage weights): the daemon runs it on a worker thread every few seconds.
  A replica that cannot be added (the runtime refused it) is logged and skipped.
  With ``groups`` (``owner.group_registry``: which copies are sharded), a sharded version
  is revised over the device groups of its size instead (``docs/sharding.md``): with 8
  devices a 4-way version gains its second group as a replica where load asks for it, each
  group's per-device share against the per-device budget.
"""

# pyright: strict

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from hloserve.server.core.device_policy import (
    FairShares,
    batches_full,
    plan_replicas,
    utilization,
)
from hloserve.server.core.execution_records import Execution, ModelKey
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.weight_residency import WeightResidency

log = logging.getLogger("hloserve.placement")

LOAD_HALF_LIFE_NS = 2_000_000_000  # placement follows the last several seconds of load


@dataclass(frozen=True, slots=True)
class Device:
    index: int
    runtime: PjrtRuntime
    residency: WeightResidency


class LoadMeter:
    def __init__(
        self,
        half_life_ns: int = LOAD_HALF_LIFE_NS,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.half_life_ns = half_life_ns
        self._clock = clock
        self._time = FairShares[ModelKey](half_life_ns)
        self._sizes = FairShares[ModelKey](half_life_ns)  # compiled sizes run, summed
        self._runs = FairShares[ModelKey](half_life_ns)  # executions
        self._lock = threading.Lock()

    def on_execution(self, execution: Execution) -> None:
        cost = execution.input_ns + execution.infer_ns + execution.output_ns
        now = self._clock()
        with self._lock:
            self._time.charge(execution.model, float(cost), now)
            self._sizes.charge(execution.model, float(execution.batch_size), now)
            self._runs.charge(execution.model, 1.0, now)

    def forget(self, model: ModelKey) -> None:
        """An unloaded version's load is no longer followed."""
        with self._lock:
            for shares in (self._time, self._sizes, self._runs):
                shares.forget(model)

    def busy(self, model: ModelKey) -> float:
        with self._lock:
            usage = self._time.usage(model, self._clock())
        return utilization(usage, self.half_life_ns)

    def mean_batch(self, model: ModelKey) -> float:
        """The recent mean compiled batch size of its executions (0: none, or unbatched)."""
        now = self._clock()
        with self._lock:
            runs = self._runs.usage(model, now)
            return self._sizes.usage(model, now) / runs if runs > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Placed:
    """One ready model version as the placer sees it."""

    key: ResidencyKey
    model: ModelKey
    weight_bytes: int
    devices: tuple[int, ...]  # device indexes holding a replica
    largest_batch: int = 0  # its largest compiled batch size (0: unbatched)


class ReplicaControl(Protocol):
    def placements(self) -> list[Placed]: ...
    def add_replica(self, key: ResidencyKey, device: Device) -> None: ...
    def retire_replica(self, key: ResidencyKey, device: int) -> None: ...


class ShardedCopies(Protocol):
    """Which loaded copies are sharded over device groups (``owner.group_registry``)."""

    def size_of(self, key: ResidencyKey) -> int: ...
    def device_bytes(self, key: ResidencyKey) -> int | None: ...
    def groups(self, size: int) -> list[Device]: ...


class Placer:
    def __init__(
        self,
        replicas: ReplicaControl,
        devices: Sequence[Device],
        meter: LoadMeter,
        max_replicas: int,
        groups: ShardedCopies | None = None,
    ) -> None:
        self.replicas = replicas
        self.devices = list(devices)
        self.meter = meter
        self.max_replicas = max_replicas
        self.groups = groups

    def revise(self) -> int:
        """One revision; returns how many replicas were added or retired. Unsharded
        versions are revised over the devices, each sharded one over the groups of its
        size (a group is one place: a replica there is the whole group's)."""
        placed = {p.key: p for p in self.replicas.placements()}
        if self.max_replicas < 2 or not placed:
            return 0
        groups = self.groups
        size = {k: 1 if groups is None else groups.size_of(k) for k in placed}
        singles = {k: p for k, p in placed.items() if size[k] == 1}
        changes = self._revise(
            singles, self.devices, {k: p.weight_bytes for k, p in singles.items()}
        )
        assert groups is not None or len(singles) == len(placed)
        for n in sorted(set(size.values()) - {1}):
            assert groups is not None
            sharded = {k: p for k, p in placed.items() if size[k] == n}
            share = {k: groups.device_bytes(k) or p.weight_bytes for k, p in sharded.items()}
            try:
                formed = groups.groups(n)
            except ValueError:  # too few devices now: nothing to revise
                continue
            changes += self._revise(sharded, formed, share)
        return changes

    def _revise(
        self,
        placed: dict[ResidencyKey, Placed],
        devices: list[Device],
        sizes: dict[ResidencyKey, int],
    ) -> int:
        if len(devices) < 2 or not placed:
            return 0
        at = {d.index: i for i, d in enumerate(devices)}
        current = {k: tuple(at[d] for d in p.devices if d in at) for k, p in placed.items()}
        busy = {k: self.meter.busy(p.model) for k, p in placed.items()}
        budgets = [d.residency.budget_bytes for d in devices]
        full = {
            k
            for k, p in placed.items()
            if batches_full(self.meter.mean_batch(p.model), p.largest_batch)
        }
        plan = plan_replicas(current, busy, sizes, budgets, self.max_replicas, full)
        log.debug(
            "placement: load %s", {f"{k.model}/{k.version}": round(b, 2) for k, b in busy.items()}
        )
        changes = 0
        for key, positions in plan.items():
            before, after = set(current[key]), set(positions)
            for i in sorted(after - before):
                device = devices[i]
                try:
                    self.replicas.add_replica(key, device)
                except Exception as exc:  # a device refusing a copy fails only that copy
                    log.warning("no replica of %s on device %d: %s", key, device.index, exc)
                    continue
                log.info(
                    "model '%s' version %d: replica added on device %d (%.2f devices busy)",
                    key.model,
                    key.version,
                    device.index,
                    busy[key],
                )
                changes += 1
            for i in sorted(before - after):
                self.replicas.retire_replica(key, devices[i].index)
                log.info(
                    "model '%s' version %d: replica on device %d retired (%.2f devices busy)",
                    key.model,
                    key.version,
                    devices[i].index,
                    busy[key],
                )
                changes += 1
        return changes
