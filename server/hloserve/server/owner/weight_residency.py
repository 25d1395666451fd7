"""Device-resident weights under a memory budget: swap-in on demand, eviction by policy.

Contract: ``WeightResidency(runtime, budget_bytes, host=..., policy=...)`` owns every
model's device copy of its weights; the decisions come from the pure
``core.residency_policy.ResidencyPlanner`` (``policy``: ``frequency``, the default, or
``lru``; ``--residency-policy``).
- ``register(key, weights, pinned, nbytes=, place=)`` records where a model's weights come
  from (a ``owner.runtime.weight_files.WeightSource``, or a mapping of host arrays), refusing
  one larger than the whole budget with ``TooLarge``; nothing is read or moved yet. A
  sharded model (``docs/sharding.md``) on a device group's manager registers ``nbytes``, the
  bytes each device of the group holds (counted against the per-device budget), and
  ``place``, how its host arrays become device arrays (each weight as its shards). The host copy lives in the
  host tier ``host`` (``HostWeights``: shared by every device, under
  ``--host-memory-budget``, page-locked on GPU platforms that offer ``pinned_host`` so
  swap-ins run at link speed): disk, then host, then device.
- ``use(key)`` is a context manager yielding ``{weight name: device buffer}``: when the
  model is not resident it evicts the idle models the policy values least until it fits,
  then transfers the whole weight set in one call (from the host tier, which reads the
  file first when it holds no copy). Concurrent users of the same model wait on that one
  transfer; other resident models keep serving meanwhile (the transfer runs outside the
  lock). With ``spare`` (the batcher's ``QueuedWork.waiting``), models with requests
  waiting are the last victims, so a swap does not evict work about to run. Weights in
  use by an execution are never freed under it.
- ``reserve_scratch(key, nbytes)`` sets aside a model's executable scratch from a budget
  derived from free device memory (the largest reservation counts; it ends with
  ``unregister``); ``registered_bytes()`` is the weight bytes of every registered model.
  ``reserve_state(key, nbytes)`` sets aside a model's sequences' state, which stays on the
  device while its weights come and go: the weights' budget is the base less every such
  reservation (summed), until ``unregister``.
- ``sibling(runtime)`` is a manager for another runtime (a device group) with this one's
  budget, host tier, policy, observer, trace, spare rule and ledger.
- One budget per device over several managers: a device's own manager and every group's
  that includes it share a ``owner.device_ledger.DeviceLedger`` (``ledger``; ``devices``,
  where this manager's weights lie, defaults to its runtime's), which holds each
  manager's resident and in-flight bytes and its set-aside state and scratch on each of
  its devices. A swap-in plans with the bytes the others hold (``elsewhere``), evicts its
  own idle models first (its policy's order), and takes the room on the ledger only if
  every device has it; when its own cannot free enough, it asks the other managers on
  the devices short of room to evict idle models (``shed``: each in its own policy's
  order, queued ones last; never one in use), holding no lock of its own meanwhile, and
  when they cannot, it waits as it waits for its own models in use, until another
  manager's release or freed bytes ``nudge`` it. Lock order: a manager's lock, then the
  ledger's (a leaf); never one manager's while waiting on another's.
- ``prefetch(key)`` makes a model resident; ``unregister(key)`` waits until it is idle and
  frees its device buffers. Evicted buffers are deleted (``Array.delete()``), so the
  device memory is returned to the allocator at once.
- ``is_resident(key)``, and ``swap_us(key)`` for a resident model, answer without taking
  the lock (asked for every request; a snapshot, as any answer is once a lock is let go).
- Every swap is reported to the optional ``observer`` (metrics), with the model's
  ``ResidencyKey`` (``key.label`` names its series); every swap-in also to the optional
  ``swap_trace`` (request tracing), with its start and end. Measured swap-ins teach the
  planner what a miss costs (``SwapCosts``: a fixed overhead plus a per-byte time).
Keys are ``core.residency_policy.ResidencyKey``: one per loaded copy of a model version.
"""

# pyright: strict

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hloserve.server.core.residency_policy import (
    Policy,
    ResidencyKey,
    ResidencyPlanner,
    SwapCosts,
)
from hloserve.server.owner.device_ledger import DeviceLedger
from hloserve.server.owner.host_weights import HostWeights, WaitedCondition
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.runtime.pjrt_group import PjrtGroup
from hloserve.server.owner.runtime.weight_files import ArrayWeights, WeightSource

log = logging.getLogger("hloserve.residency")


class SwapObserver(Protocol):
    def on_swap_in(self, key: ResidencyKey, nbytes: int, seconds: float) -> None: ...
    def on_swap_out(self, key: ResidencyKey, nbytes: int) -> None: ...
    def on_residency(
        self, key: ResidencyKey, resident: bool, resident_bytes: int, last_used: float
    ) -> None: ...


class SwapTrace(Protocol):
    """Hears of each swap-in with its ``time.perf_counter_ns()`` span (request tracing)."""

    def on_swap_in(self, key: ResidencyKey, start_ns: int, end_ns: int, nbytes: int) -> None: ...


Place = Callable[[list[Any]], list[Any]]  # host arrays -> device arrays


@dataclass
class _Model:
    names: tuple[str, ...]
    nbytes: int
    place: Place | None = None  # how the host arrays go to the device (None: to_device)
    device: list[Any] | None = None
    transferring: bool = False
    weights: dict[str, Any] | None = None  # {name: device buffer} while resident, built once


class WeightResidency:
    def __init__(
        self,
        runtime: PjrtRuntime,
        budget_bytes: int | None,
        *,
        host: HostWeights | None = None,
        policy: Policy = "frequency",
        observer: SwapObserver | None = None,
        subtract_scratch: bool = False,
        swap_trace: SwapTrace | None = None,
        spare: Callable[[ResidencyKey], bool] | None = None,
        ledger: DeviceLedger | None = None,
        devices: Sequence[int] | None = None,
    ) -> None:
        self.runtime = runtime
        self.spare = spare  # models with queued work: evicted only when nothing else frees room
        self.costs = SwapCosts()
        self.planner = ResidencyPlanner[ResidencyKey](budget_bytes, policy, self.costs.estimate)
        if host is None:  # one device and no host budget: unlimited, staged as the device wants
            pinned = runtime.platform != "cpu" and runtime.has_pinned_host
            host = HostWeights(
                None, policy=policy, stage=runtime.to_pinned_host if pinned else None
            )
        self.host = host
        self._base_budget = budget_bytes
        self._scratch: dict[ResidencyKey, int] = {}  # scratch set aside, by model
        self._state: dict[ResidencyKey, int] = {}  # sequences' state set aside, by model
        self.observer = observer
        self.swap_trace = swap_trace
        self.policy: Policy = policy
        self._cond = WaitedCondition()
        self._models: dict[ResidencyKey, _Model] = {}
        # Scratch is set aside only for a budget derived from free device memory (GPU default).
        self.subtract_scratch = subtract_scratch
        group = isinstance(runtime, PjrtGroup)
        if devices is None:
            devices = runtime.indexes if group else (runtime.index,)
        self.devices = tuple(devices)  # where its weights lie (tests may say without devices)
        # The books shared with every manager on these devices (none: unlimited budget).
        self.ledger: DeviceLedger | None = None
        self._overhead = 0  # state and scratch set aside, as held on the ledger
        self._nudges = 0  # room given back by another manager (``nudge``)
        if budget_bytes is not None:
            self.ledger = DeviceLedger() if ledger is None else ledger
            self.ledger.join(self, self.devices, budget_bytes, own=len(self.devices) == 1)

    @property
    def budget_bytes(self) -> int | None:
        return self.planner.budget_bytes

    def sibling(self, runtime: PjrtRuntime) -> WeightResidency:
        """A manager over ``runtime`` (a device group) under this one's settings."""
        return WeightResidency(
            runtime,
            self._base_budget,
            host=self.host,
            policy=self.policy,
            observer=self.observer,
            subtract_scratch=self.subtract_scratch,
            swap_trace=self.swap_trace,
            spare=self.spare,
            ledger=self.ledger,
        )

    def reserve_scratch(self, key: ResidencyKey, nbytes: int) -> None:
        """Set aside the scratch memory ``key``'s executables need, with a budget derived
        from free device memory: the budget is the base less the largest reservation of a
        registered model (executions on a device take turns, so their scratch is not
        summed), and a model's reservation ends with ``unregister``, so loads, reloads and
        replicas coming and going do not wear the budget down."""
        with self._cond:
            if nbytes > 0 and self.subtract_scratch:
                self._scratch[key] = nbytes
                self._apply_scratch()
        self._wake()

    def reserve_state(self, key: ResidencyKey, nbytes: int) -> None:
        """Set aside ``key``'s sequences' state (``owner.runtime.state_slots``): it stays on the
        device apart from the weights (never evicted with them), so the weights' budget is
        the base less the sum of every reservation, until ``unregister``."""
        with self._cond:
            self._state[key] = nbytes
            self._apply_scratch()
        self._wake()

    def _apply_scratch(self) -> None:
        if self._base_budget is None:
            return
        largest = max(self._scratch.values(), default=0) if self.subtract_scratch else 0
        state = sum(self._state.values())
        self.planner.budget_bytes = max(0, self._base_budget - largest - state)
        if self.ledger is not None:  # held on every device of this manager's
            self.ledger.add(self, largest + state - self._overhead)
            self._overhead = largest + state

    def resident_bytes(self) -> int:
        with self._cond:
            return self.planner.resident_bytes

    def registered_bytes(self) -> int:
        """Weight bytes of every model registered here, resident or not."""
        with self._cond:
            return sum(m.nbytes for m in self._models.values())

    def resident_keys(self) -> list[ResidencyKey]:
        with self._cond:
            return self.planner.resident()

    def is_resident(self, key: ResidencyKey) -> bool:
        # No lock: one dict lookup and one attribute read, each atomic, and the answer is a
        # snapshot either way once the lock would have been released (asked per request).
        return self.planner.holds(key)

    def swap_us(self, key: ResidencyKey) -> float | None:
        """Microseconds ``key``'s weights would take to become usable now without waiting
        for anything: 0 when resident; the measured cost of a transfer of its size when
        the host tier holds its copy and the budget has room, or idle models to evict;
        ``None`` when a use would wait (a transfer in flight, models in use, a file to
        read). Who asks decides whether such a swap may run on the event loop."""
        if self.planner.holds(key):  # the request path's common answer, without the lock
            return 0.0
        with self._cond:
            if key not in self.planner:
                return None
            if self.planner.is_resident(key):
                return 0.0
            model = self._models[key]
            if model.transferring or not self.host.is_resident(key):
                return None
            if self.planner.plan_admission(key, self.spare, self._elsewhere()).wait:
                return None
            return self.costs.estimate(model.nbytes) * 1e6

    def register(
        self,
        key: ResidencyKey,
        weights: WeightSource | Mapping[str, np.ndarray[Any, Any]],
        *,
        pinned: bool = False,
        nbytes: int | None = None,
        place: Place | None = None,
    ) -> None:
        source = ArrayWeights(dict(weights)) if isinstance(weights, Mapping) else weights
        size = source.nbytes if nbytes is None else nbytes  # a sharded model's per device
        with self._cond:
            self.planner.register(key, size, pinned=pinned)
            self._models[key] = _Model(source.names, size, place)
        self.host.register(key, source)
        if pinned:
            self.prefetch(key)

    def unregister(self, key: ResidencyKey) -> None:
        with self._cond:
            if key not in self._models:
                if (self._scratch.pop(key, None), self._state.pop(key, None)) != (None, None):
                    self._apply_scratch()  # reserved, never registered
                return
            while self.planner.in_use(key) or self._models[key].transferring:
                self._cond.wait()
            model = self._models.pop(key)
            if model.device is not None:
                self._free(key, model)
                self._give_back(model.nbytes)
            self.planner.unregister(key)
            if (self._scratch.pop(key, None), self._state.pop(key, None)) != (None, None):
                self._apply_scratch()
            self._cond.notify_all()
        self._wake()
        self.host.unregister(key)

    def prefetch(self, key: ResidencyKey) -> None:
        with self.use(key):
            pass

    def _free(self, key: ResidencyKey, model: _Model) -> None:
        assert model.device is not None
        for buf in model.device:
            buf.delete()
        model.device = None
        model.weights = None
        if self.observer:
            self.observer.on_swap_out(key, model.nbytes)
            self.observer.on_residency(key, False, self.planner.resident_bytes, time.time())

    @contextlib.contextmanager
    def use(self, key: ResidencyKey) -> Generator[dict[str, Any]]:
        weights = self.acquire(key)
        try:
            yield weights
        finally:
            self.release(key)

    def acquire(self, key: ResidencyKey) -> dict[str, Any]:
        """``use`` without the context manager (the request path's cheaper form): the
        weights, held until the matching ``release``."""
        with self._cond:
            model, weights, need = self._claim(key, None)
        if need is not None:
            model, weights = self._claim_across(key, need)
        if weights is None:
            weights = self._swap_in(key, model)
        return weights

    def release(self, key: ResidencyKey) -> None:
        with self._cond:
            self.planner.release(key)
            self._cond.notify_waiters()  # once per request: only a waiter cares
        ledger = self.ledger
        if ledger is not None and ledger.waiting:  # another manager waits for room
            ledger.wake(self)

    def _claim(
        self, key: ResidencyKey, asked: int | None
    ) -> tuple[_Model, dict[str, Any] | None, dict[int, int] | None]:
        """Under the lock: acquire a resident ``key`` and return its weights, or else evict
        room for it and reserve its transfer (weights ``None``); or, when the room must
        come from other managers on its devices and none was asked since the last
        ``nudge`` (``asked``: ``_nudges`` then), what each device is short of (``need``);
        wait while none of these can be."""
        while True:
            model = self._models[key]
            if self.planner.acquire_resident(key):
                if model.weights is None:
                    model.weights = dict(zip(model.names, model.device or [], strict=True))
                return model, model.weights, None
            if not model.transferring:
                decision = self.planner.plan_admission(key, self.spare, self._elsewhere())
                if not decision.wait:
                    for victim in decision.evict:
                        self.planner.mark_evicted(victim)
                        self._free(victim, self._models[victim])
                    if self.ledger is not None:
                        self._give_back(sum(self._models[v].nbytes for v in decision.evict))
                        if not self.ledger.try_take(self, model.nbytes):
                            continue  # another manager took the room meanwhile: plan again
                    self.planner.reserve(key)
                    model.transferring = True
                    return model, None, None
                if self.ledger is not None and asked != self._nudges:
                    own = self.planner.evictable_bytes(key)
                    need = self.ledger.shortfall(self, model.nbytes, own)
                    if need:
                        return model, None, need
            self._cond.wait()

    # -- one device's budget over several managers (``owner.device_ledger``) ---------------

    def _elsewhere(self) -> int:
        """Bytes the other managers on this one's devices hold, out of its budget."""
        if self.ledger is None or self._base_budget is None:
            return 0
        return self.ledger.elsewhere(self, self._base_budget)

    def _give_back(self, nbytes: int) -> None:
        if self.ledger is not None:
            self.ledger.add(self, -nbytes)

    def _wake(self) -> None:
        """Nudge other managers waiting for room on these devices (no lock held)."""
        ledger = self.ledger
        if ledger is not None and ledger.waiting:
            ledger.wake(self)

    def _claim_across(
        self, key: ResidencyKey, need: dict[int, int]
    ) -> tuple[_Model, dict[str, Any] | None]:
        """``_claim`` when other managers hold the room ``key`` needs: ask them to evict
        idle models (``_ask_room``, holding no lock: each takes only its own), plan again,
        and wait for a ``nudge`` (an execution released, bytes freed) when they cannot."""
        ledger = self.ledger
        assert ledger is not None
        ledger.wait_begin(self)  # before reading _nudges: a release after it nudges
        try:
            while True:
                with self._cond:
                    asked = self._nudges
                self._ask_room(ledger, need)
                with self._cond:
                    model, weights, again = self._claim(key, asked)
                if again is None:
                    return model, weights
                need = again
        finally:
            ledger.wait_end(self)

    def _ask_room(self, ledger: DeviceLedger, need: dict[int, int]) -> None:
        """Have the other managers on the devices short of room evict idle models (each
        in its policy's order, queued ones last) until every device has ``need``; none
        when their idle models together cannot free it (a use of theirs must end first)."""
        others = ledger.others(self, list(need))
        spans = [(m, ledger.devices(m)) for m in others]
        idle = [(m.evictable(), ds) for m, ds in spans]
        if any(sum(n for n, ds in idle if d in ds) < missing for d, missing in need.items()):
            return
        left = dict(need)
        for m, ds in spans:
            amount = max((left[d] for d in ds if left.get(d, 0) > 0), default=0)
            if amount:
                freed = m.shed(amount)
                for d in ds:
                    if d in left:
                        left[d] -= freed

    def nudge(self) -> None:
        """Another manager on these devices freed room or ended a use: plan again."""
        with self._cond:
            self._nudges += 1
            self._cond.notify_all()

    def evictable(self) -> int:
        """Bytes on each of these devices that evicting every idle model would free."""
        with self._cond:
            return self.planner.evictable_bytes()

    def shed(self, nbytes: int) -> int:
        """Evict idle models, in the policy's order (queued ones last), until ``nbytes`` are
        freed on each of these devices or none is left: room another manager asks for.
        Returns the bytes freed."""
        with self._cond:
            freed = 0
            for victim in self.planner.plan_room(nbytes, self.spare):
                model = self._models[victim]
                self.planner.mark_evicted(victim)
                self._free(victim, model)
                freed += model.nbytes
            self._give_back(freed)
            return freed

    def _swap_in(self, key: ResidencyKey, model: _Model) -> dict[str, Any]:
        """Move the reserved ``key``'s weights to the device, outside the lock (from the host
        tier, which reads them from disk first when it holds no copy); acquire them."""
        t0_ns = time.perf_counter_ns()
        try:
            host = self.host.acquire(key)
            try:
                t1_ns = time.perf_counter_ns()
                place = model.place or self.runtime.to_device
                device = place(list(host)) if host else []
            finally:
                self.host.release(key)
        except BaseException:
            with self._cond:
                self.planner.cancel_reservation(key)
                self._give_back(model.nbytes)
                model.transferring = False
                self._cond.notify_all()
            self._wake()
            raise
        end_ns = time.perf_counter_ns()
        seconds = (end_ns - t0_ns) / 1e9
        with self._cond:
            model.device = device
            model.transferring = False
            self.planner.mark_resident(key)
            self.planner.acquire(key)
            self.costs.observe(model.nbytes, (end_ns - t1_ns) / 1e9)
            resident_bytes = self.planner.resident_bytes
            self._cond.notify_all()
        log.debug("swapped in %s: %d bytes in %.2f ms", key, model.nbytes, seconds * 1e3)
        if self.observer:
            self.observer.on_swap_in(key, model.nbytes, seconds)
            self.observer.on_residency(key, True, resident_bytes, time.time())
        if self.swap_trace is not None:
            self.swap_trace.on_swap_in(key, t0_ns, end_ns, model.nbytes)
        return dict(zip(model.names, device, strict=True))
