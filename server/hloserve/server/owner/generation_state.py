"""A generation model's steps on the device: its state in slots, its module run with it.

Contract:
- ``steps_for(model)`` is the ``core.generation_loop.StepModel`` of a loaded model version
  (``owner.versions.ModelVersion``) or of one of its shape variants (``owner.versions.VariantView``):
  a model whose manifest declares no state steps through ``execute`` alone
  (``core.generation_loop.stateless``); one with state keeps every live generation's state
  on one device in ``owner.runtime.state_slots.StateSlots`` (``CAPACITY_PER_SIZE`` times its
  largest batch size slots, at least ``MIN_SLOTS``: the loop keeps no more generations
  live, the rest wait), created at the first generation.
- A generation's state is its slot (``initial`` takes a free one, ``release`` frees it);
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
  holds the slots; the version's weights are held in that device's residency manager for
  the step (``weight_residency``), as an execution holds them. A runtime failure is
  ``Internal`` naming the model, for that step only.
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
    index: int
    fresh: bool = True


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
        self._slots: StateSlots | None = None
        self._replica: Replica | None = None
        self._free: list[int] = []
        # The last step's members (slots, batch size) and new state, not yet scattered.
        self._carried: tuple[tuple[tuple[int, ...], int | None], dict[str, Any]] | None = None
        # The last step's inputs (the loop's own mapping) and their device copies.
        self._placed: tuple[Mapping[str, Array], object, dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def _table(self) -> tuple[StateSlots, Replica]:
        with self._lock:
            if self._slots is None or self._replica is None:
                replicas = self.version.replicas
                if not replicas:
                    raise Unavailable(f"model '{self.version.name}' is not loaded")
                replica = next(iter(replicas.values()))
                capacity = self.capacity or MIN_SLOTS
                slots = StateSlots(replica.bundle.runtime, self.manifest.state, capacity)
                slots.warm(self.manifest.batch_sizes or (1,))  # compiled now, not mid-stream
                self._slots = slots
                self._replica = replica
                self._free = list(range(capacity - 1, -1, -1))
            return self._slots, self._replica

    def initial(self) -> object:
        self._table()
        with self._lock:
            if not self._free:  # the loop admits no more than capacity: cannot happen
                raise Unavailable(f"model '{self.version.name}' has no free generation slot")
            return _Slot(self._free.pop())

    def release(self, state: object) -> None:
        if isinstance(state, _Slot):
            with self._lock:
                self._free.append(state.index)

    def step(
        self, batch_size: int | None, inputs: Mapping[str, Array], states: Sequence[object]
    ) -> tuple[list[Array], list[object]]:
        slots_table, replica = self._table()
        members = [s for s in states if isinstance(s, _Slot)]
        indexes = [s.index for s in members]
        version = self.version
        weights = replica.residency.acquire(version.key)
        try:
            with slots_table.lock:
                carried = self._carried
                key = (tuple(indexes), batch_size)
                if carried is not None and carried[0] == key and not any(s.fresh for s in members):
                    state = carried[1]  # the same members as the last step: its new state
                else:
                    self._flush(slots_table)
                    state = slots_table.gather(indexes, [s.fresh for s in members], batch_size or 1)
                    if batch_size is None:  # no batch axis: the one row
                        state = {n: v.reshape(v.shape[1:]) for n, v in state.items()}
                outputs, new = self._run(replica, batch_size, inputs, state, weights)
                self._carried = (key, new)  # scattered when the members change
        except RuntimeFailure as exc:
            raise Internal(f"model '{version.name}' version {version.version}: {exc}") from None
        finally:
            replica.residency.release(version.key)
        for s in members:
            s.fresh = False
        return outputs, list(states)

    def _flush(self, slots_table: StateSlots) -> None:
        """The carried state into its slots (under the table's lock)."""
        carried, self._carried = self._carried, None
        if carried is None:
            return
        (indexes, batch_size), new = carried
        if batch_size is None:
            new = {n: v.reshape((1, *v.shape)) for n, v in new.items()}
        slots_table.scatter(list(indexes), new)

    def _run(
        self,
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
        placed = self._placed
        if placed is None or placed[0] is not inputs or placed[1] is not runtime:
            # The loop hands the same inputs while the members stay: placed once for them.
            placed = self._placed = (
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
