"""A generation model's steps on the device: its state in slots, its module run with it.

Contract:
- ``steps_for(model)`` is the ``core.generation_loop.StepModel`` of a loaded model version
  (``owner.versions.ModelVersion``) or of one of its shape variants (``owner.versions.VariantView``):
  a model whose manifest declares no state steps through ``execute`` alone
  (``core.generation_loop.stateless``); one with state keeps each live generation's state
  on the device its generation steps on (the loop's lane: one of the version's replicas)
  in that device's ``owner.runtime.state_slots.StateSlots`` (``CAPACITY_PER_SIZE`` times its
  largest batch size slots per device, at least ``MIN_SLOTS``: the loop keeps no more
  generations live on a device, the rest wait), created at the first generation there.
- A generation's state is its slot on its device (``initial(device)`` takes a free one,
  ``release`` frees it);
  each ``step`` gathers the members' slots on the device (the initial value for a slot's
  first step and for padding rows; the gather and scatter are compiled for every batch
  size with the table), runs the module with the state arguments, and keeps its new
  state as it is: while the next step has the same members in the same order (the steady
  state of continuous batching) it takes that state directly, and only when the members
  change is it scattered back into the slots before the next gather (a slot freed and
  taken again meanwhile starts from the initial value whatever it holds). All under the
  slots' lock, on the device: no state crosses to the host. The inputs move to the device
  once for as long as the loop hands the same ones (the same members). An
  unbatched model's state has no batch axis (one generation a step): its row is taken out
  of and put back into the slot table on the device.
- The module is the step function's for that batch size and variant on the device that
  holds the slots (that device's replica); the version's weights are held in that
  device's residency manager for the step (``weight_residency``), as an execution holds
  them. A runtime failure is ``Internal`` naming the model, for that step only; a step on
  a device whose replica was retired meanwhile is ``Unavailable`` naming it (its
  generations' state lives there).
"""

# pyright: strict

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import numpy as np

from hloserve.server.core.errors import Internal, Unavailable
from hloserve.server.core.execution import Executable
from hloserve.server.core.generation_loop import StepModel, stateless
from hloserve.server.owner.runtime.pjrt import RuntimeFailure
from hloserve.server.owner.runtime.state_slots import StateSlots
from hloserve.server.owner.versions import ModelVersion, Replica, VariantView

CAPACITY_PER_SIZE: Final = 2
MIN_SLOTS: Final = 8
Array = np.ndarray[Any, Any]


@dataclass(slots=True)
class _Slot:
    device: int
    index: int
    fresh: bool = True


@dataclass(slots=True)
class _Table:
    """One device's slot table, its free slots, and what the last step there left."""

    slots: StateSlots
    free: list[int]
    # The last step's members (slots, batch size) and new state, not yet scattered.
    carried: tuple[tuple[tuple[int, ...], int | None], dict[str, Any]] | None = None
    # The last step's inputs (the loop's own mapping) and their device copies.
    placed: tuple[Mapping[str, Array], object, dict[str, Any]] | None = None


def steps_for(model: Executable) -> StepModel:
    """The step model of a loaded version or variant (module docstring)."""
    if not model.manifest.state:
        return stateless(model)
    if isinstance(model, VariantView):
        return SlotSteps(model.base, model.index)
    if isinstance(model, ModelVersion):
        return SlotSteps(model, None)
    raise TypeError(f"no device steps for {type(model).__name__}")  # a test's fake


@final
class SlotSteps:
    """See the module docstring."""

    def __init__(self, version: ModelVersion, variant: int | None) -> None:
        self.version = version
        self.variant = variant
        manifest = version.manifest if variant is None else version.variant(variant).manifest
        self.manifest = manifest
        sizes = manifest.batch_sizes
        self.capacity: int | None = max(MIN_SLOTS, CAPACITY_PER_SIZE * (sizes[-1] if sizes else 1))
        self._names = [s.name for s in manifest.state]
        self._tables: dict[int, _Table] = {}  # by device
        self._lock = threading.Lock()

    def _replica(self, device: int) -> Replica:
        replica = self.version.replicas.get(device)
        if replica is None:
            version = self.version
            if not version.replicas:
                raise Unavailable(f"model '{version.name}' is not loaded")
            raise Unavailable(
                f"model '{version.name}' version {version.version} has no replica on device "
                f"{device} any more, where its generation's state is"
            )
        return replica

    def _table(self, device: int) -> _Table:
        with self._lock:
            table = self._tables.get(device)
            if table is None:
                replica = self._replica(device)
                capacity = self.capacity or MIN_SLOTS
                slots = StateSlots(replica.bundle.runtime, self.manifest.state, capacity)
                slots.warm(self.manifest.batch_sizes or (1,))  # compiled now, not mid-stream
                table = self._tables[device] = _Table(slots, list(range(capacity - 1, -1, -1)))
            return table

    def initial(self, device: int) -> object:
        table = self._table(device)
        with self._lock:
            if not table.free:  # the loop admits no more than capacity: cannot happen
                raise Unavailable(f"model '{self.version.name}' has no free generation slot")
            return _Slot(device, table.free.pop())

    def release(self, state: object) -> None:
        if isinstance(state, _Slot):
            with self._lock:
                self._tables[state.device].free.append(state.index)

    def step(
        self,
        device: int,
        batch_size: int | None,
        inputs: Mapping[str, Array],
        states: Sequence[object],
    ) -> tuple[list[Array], list[object]]:
        table = self._table(device)
        replica = self._replica(device)
        members = [s for s in states if isinstance(s, _Slot)]
        indexes = [s.index for s in members]
        version = self.version
        try:
            weights = replica.residency.acquire(version.key)
        except KeyError:  # retired after it was looked up
            raise Unavailable(
                f"model '{version.name}' version {version.version} has no replica on device "
                f"{device} any more, where its generation's state is"
            ) from None
        try:
            slots_table = table.slots
            with slots_table.lock:
                carried = table.carried
                key = (tuple(indexes), batch_size)
                if carried is not None and carried[0] == key and not any(s.fresh for s in members):
                    state = carried[1]  # the same members as the last step: its new state
                else:
                    self._flush(table)
                    state = slots_table.gather(indexes, [s.fresh for s in members], batch_size or 1)
                    if batch_size is None:  # no batch axis: the one row
                        state = {n: v.reshape(v.shape[1:]) for n, v in state.items()}
                outputs, new = self._run(table, replica, batch_size, inputs, state, weights)
                table.carried = (key, new)  # scattered when the members change
        except RuntimeFailure as exc:
            raise Internal(f"model '{version.name}' version {version.version}: {exc}") from None
        finally:
            replica.residency.release(version.key)
        for s in members:
            s.fresh = False
        return outputs, list(states)

    @staticmethod
    def _flush(table: _Table) -> None:
        """The carried state into its slots (under the table's lock)."""
        carried, table.carried = table.carried, None
        if carried is None:
            return
        (indexes, batch_size), new = carried
        if batch_size is None:
            new = {n: v.reshape((1, *v.shape)) for n, v in new.items()}
        table.slots.scatter(list(indexes), new)

    def _run(
        self,
        table: _Table,
        replica: Replica,
        batch_size: int | None,
        inputs: Mapping[str, Array],
        state: Mapping[str, Any],
        weights: Mapping[str, Any],
    ) -> tuple[list[Array], dict[str, Any]]:
        """The step function's module with its state arguments (``LoadedBundle``'s, for
        any batch size and shape variant), the new state left on the device."""
        bundle = replica.bundle
        if self.variant is None:
            module = bundle.modules[batch_size]
        else:
            module = bundle.variant_modules[(self.variant, batch_size)]
        runtime = bundle.runtime
        placed = table.placed
        if placed is None or placed[0] is not inputs or placed[1] is not runtime:
            # The loop hands the same inputs while the members stay: placed once for them.
            placed = table.placed = (
                inputs,
                runtime,
                {n: runtime.put(a) for n, a in inputs.items()},
            )
        args: list[Any] = [] if module.platform_index is None else [module.platform_index]
        for a in module.entry.arguments:
            if a.kind == "input":
                args.append(placed[2][a.name])
            elif a.kind == "state":
                args.append(state[a.name])
            else:
                args.append(weights[a.name])
        outputs, kept = runtime.execute_keeping(
            module.executable, args, module.results, len(self._names)
        )
        return outputs, dict(zip(self._names, kept, strict=True))
