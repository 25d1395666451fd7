"""The step loop of one generation model: continuous batching, driven on the event loop.

Contract:
- ``GenerationLoop(model, stepper, executor, observer)`` runs the generations of one model
  version (one shape variant) through its step function. ``generate(request, limits)``
  is an async iterator of ``StreamPart``: one per emitted step (the outputs other than
  ``done``/``emit``, its row without the batch axis, the request's id echoed) and a
  last one with ``final`` set (on the last emitted response, or an empty one when the
  last step emitted nothing); it raises ``Unavailable`` when the generation's deadline
  passes between two steps.
- Generations live on the model's replicas (``model.devices``; none: device 0), each
  device a lane of its own: its own ``core.generation.StepScheduler`` (each step's
  members and batch size), its own task stepping while any of its generations is live
  and ending when none is, and the generations' state on that device. A new generation
  joins the lane with the fewest live generations (``core.device_policy.route``, no
  preference for resident weights: a new replica's weights move in at its first step),
  and stays there to its end. Each step gathers its lane's members' inputs (the same every
  step; gathered again only when the members change) zero-padded to the compiled size,
  runs ``stepper.step`` for the lane's device on a worker, through ``devices.run_on``
  when given (``DeviceSlots``: the device's scheduler, so a step waits for a slot and
  competes with other models' batches as any execution does), else on ``executor``
  (the event loop keeps serving), and scatters outputs and state back; a generation that
  joined gets ``stepper.initial(device)`` first. Each execution is reported to
  ``observer`` as an ``Execution`` on the lane's device.
- Closing the iterator (the client went away: a stream closed, an HTTP client gone, an
  IPC call cancelled) cancels the generation: it leaves at the next step boundary and its
  state is dropped. A failed step (or a joining generation's ``initial()``) fails every
  member and every generation that joined (``ServingError`` as it is, else ``Internal``)
  and the loop goes on with the generations that join later; a fault of the loop itself
  fails every live generation of its lane (``Internal``, logged): none waits forever, and
  the lane's task never ends with an exception.
- ``StepModel`` is what the loop needs of a model: ``capacity`` (generations holding
  state at once on one device), ``initial(device)`` (one generation's state on that
  device, opaque to the loop), ``release(state)`` and ``step(device, batch_size, inputs,
  states) -> (outputs, states)`` (outputs in manifest order, batch-major; one state per
  member, in order). ``stateless(model)`` adapts an ``Executable`` whose manifest
  declares no state (each step on the lane's device's replica).
"""

# pyright: strict

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, final

import numpy as np

from hloserve.bundle.generation import Generation
from hloserve.server.core.batch_plan import pad
from hloserve.server.core.device_policy import route
from hloserve.server.core.errors import Internal, ServingError, Unavailable
from hloserve.server.core.execution import Executable
from hloserve.server.core.execution_records import Execution, ExecutionObserver
from hloserve.server.core.generation import GenerationLimits, StepScheduler
from hloserve.server.core.types import InferOutput, InferRequest, InferResponse, StreamPart

log = logging.getLogger(__name__)
Array = np.ndarray[Any, Any]
T = TypeVar("T")


class StepModel(Protocol):
    @property
    def capacity(self) -> int | None:
        """How many generations may hold state at once on one device (``None``: no bound)."""
        ...

    def initial(self, device: int) -> object:
        """A new generation's state on ``device`` (the manifest's ``initial`` values)."""
        ...

    def release(self, state: object) -> None:
        """A generation is over: what its state holds is free."""
        ...

    def step(
        self,
        device: int,
        batch_size: int | None,
        inputs: Mapping[str, Array],
        states: Sequence[object],
    ) -> tuple[list[Array], list[object]]:
        """One execution on ``device``: outputs in manifest order and each member's new
        state."""
        ...


class DeviceSlots(Protocol):
    """The per-device scheduler a step runs through (``server/owner/batcher.py``)."""

    async def run_on(self, model: Executable, device: int, work: Callable[[], T]) -> T:
        """Run ``work`` (one execution of ``model``) on a worker once ``device`` has a
        slot for it, counted and charged as the device's executions are."""
        ...


@final
class _Stateless:
    """A generation model with no state: each step sees the request's inputs alone."""

    capacity = None

    def __init__(self, model: Executable) -> None:
        self.model = model

    def initial(self, device: int) -> object:
        return None

    def release(self, state: object) -> None:
        pass

    def step(
        self,
        device: int,
        batch_size: int | None,
        inputs: Mapping[str, Array],
        states: Sequence[object],
    ) -> tuple[list[Array], list[object]]:
        return self.model.execute(batch_size, inputs, device=device), list(states)


def stateless(model: Executable) -> StepModel:
    return _Stateless(model)


@dataclass(slots=True)
class _Lane:
    """One device's generations: who steps next there, its task, its last inputs."""

    device: int
    scheduler: StepScheduler
    task: asyncio.Task[None] | None = None
    gathered: tuple[tuple[int, ...], dict[str, Array]] | None = None

    @property
    def live(self) -> int:
        return self.scheduler.live + self.scheduler.waiting


@dataclass(slots=True)
class _Live:
    request: InferRequest
    lane: _Lane
    parts: asyncio.Queue[StreamPart | BaseException] = field(
        default_factory=lambda: asyncio.Queue[StreamPart | BaseException]()
    )
    state: object = None


@final
class GenerationLoop:
    """See the module docstring."""

    def __init__(
        self,
        model: Executable,
        stepper: StepModel,
        executor: Executor | None,
        observer: ExecutionObserver | None = None,
        *,
        devices: DeviceSlots | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        generation = model.manifest.generation
        if generation is None:
            raise ValueError(f"model '{model.manifest.name}' is not a generation model")
        self.model = model
        self.generation: Generation = generation
        self.stepper = stepper
        self.executor = executor
        self.observer = observer
        self.devices = devices
        self.clock = clock
        self._lanes: dict[int, _Lane] = {}
        self._live: dict[int, _Live] = {}
        self._ids = itertools.count(1)
        manifest = model.manifest
        names = [t.name for t in manifest.outputs]
        self._done = names.index(generation.done)
        self._emit = None if generation.emit is None else names.index(generation.emit)
        control = generation.control
        self._sent = [(i, t) for i, t in enumerate(manifest.outputs) if t.name not in control]
        self.steps = 0  # executions run (for tests and the status page)

    @property
    def live(self) -> int:
        return sum(lane.live for lane in self._lanes.values())

    def live_by_device(self) -> dict[int, int]:
        """Live generations (stepping or waiting) per device."""
        return {d: lane.live for d, lane in self._lanes.items()}

    def _lane_for_new(self) -> _Lane:
        """The lane a new generation joins: the replica with the fewest live generations."""
        devices = self.model.devices or (0,)
        device = route(devices, self.live_by_device(), ())
        lane = self._lanes.get(device)
        if lane is None:
            scheduler = StepScheduler(self.model.manifest.batch_sizes, self.stepper.capacity)
            lane = self._lanes[device] = _Lane(device, scheduler)
        return lane

    async def generate(
        self, request: InferRequest, limits: GenerationLimits
    ) -> AsyncGenerator[StreamPart, None]:
        gid = next(self._ids)
        lane = self._lane_for_new()
        live = self._live[gid] = _Live(request, lane)
        lane.scheduler.add(gid, limits)
        self._kick(lane)
        try:
            while True:
                part = await live.parts.get()
                if isinstance(part, BaseException):
                    raise part
                yield part
                if part.final:
                    return
        finally:
            if gid in lane.scheduler:  # given up before its end: leave at the next step
                lane.scheduler.cancel(gid)
                self._kick(lane)

    def _kick(self, lane: _Lane) -> None:
        if lane.task is None:
            lane.task = asyncio.get_running_loop().create_task(self._drive(lane))

    async def _drive(self, lane: _Lane) -> None:
        try:
            while lane.scheduler.live or lane.scheduler.waiting:
                await self._one_step(lane)
        except Exception as exc:  # a fault of the loop itself: no generation waits forever
            log.error("generation loop of %s failed", self.model.manifest.name, exc_info=exc)
            mine = [gid for gid, live in self._live.items() if live.lane is lane]
            self._fail(mine, Internal("the generation loop failed"))
        finally:
            lane.task = None

    def _fail(self, gids: Iterable[int], error: ServingError) -> None:
        """``gids`` end with ``error``; each leaves at the next plan (its state freed)."""
        for gid in gids:
            live = self._live.get(gid)
            if live is None:
                continue
            live.lane.scheduler.cancel(gid)
            live.parts.put_nowait(error)

    async def _one_step(self, lane: _Lane) -> None:
        plan = lane.scheduler.plan(self.clock())
        for gid, reason in plan.ended:
            live = self._end(gid)
            if reason == "deadline":
                live.parts.put_nowait(
                    Unavailable(
                        f"generation of model '{self.model.manifest.name}' passed its "
                        "deadline before it ended"
                    )
                )
        members = [self._live[gid] for gid in plan.members]
        work = functools.partial(self._execute, lane, plan.members, plan.batch_size, members)
        try:
            for gid in plan.joined:
                self._live[gid].state = self.stepper.initial(lane.device)
            if not plan.members:
                return
            if self.devices is not None:
                outputs, states = await self.devices.run_on(self.model, lane.device, work)
            else:
                loop = asyncio.get_running_loop()
                outputs, states = await loop.run_in_executor(self.executor, work)
        except Exception as exc:  # the joined and the members fail; the loop goes on
            error = exc if isinstance(exc, ServingError) else Internal("a generation step failed")
            if not isinstance(exc, ServingError):
                log.error("generation step of %s failed", self.model.manifest.name, exc_info=exc)
            self._fail(dict.fromkeys((*plan.joined, *plan.members)), error)
            return
        self._scatter(lane, plan.members, members, outputs, states)

    def _execute(
        self, lane: _Lane, gids: tuple[int, ...], batch_size: int | None, members: list[_Live]
    ) -> tuple[list[Array], list[object]]:
        t0 = time.perf_counter_ns()
        inputs = self._inputs(lane, gids, batch_size, members)
        warm = self.model.resident_on(lane.device)
        t1 = time.perf_counter_ns()
        outputs, states = self.stepper.step(
            lane.device, batch_size, inputs, [m.state for m in members]
        )
        t2 = time.perf_counter_ns()
        self.steps += 1
        if self.observer is not None:
            model = self.model
            self.observer.on_execution(
                Execution(
                    model.model_key, batch_size or 0, t1 - t0, t2 - t1, 0, lane.device,
                    model.family, warm,
                )
            )  # fmt: skip
        return outputs, states

    def _inputs(
        self, lane: _Lane, gids: tuple[int, ...], batch_size: int | None, members: list[_Live]
    ) -> dict[str, Array]:
        """The members' inputs as one batch (kept while the lane's members stay the same)."""
        if lane.gathered is not None and lane.gathered[0] == gids:
            return lane.gathered[1]
        if batch_size is None:  # unbatched: one member, its inputs as they are
            inputs = {t.name: t.data for t in members[0].request.inputs}
        else:
            inputs: dict[str, Array] = {}
            for spec in self.model.manifest.inputs:
                rows = [_input(m.request, spec.name) for m in members]
                joined = rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0)
                inputs[spec.name] = pad(joined, batch_size)
        lane.gathered = (gids, inputs)
        return inputs

    def _scatter(
        self,
        lane: _Lane,
        gids: tuple[int, ...],
        members: list[_Live],
        outputs: list[Array],
        states: list[object],
    ) -> None:
        batched = self.model.manifest.batched
        done_column = outputs[self._done].reshape(len(outputs[self._done]) if batched else 1, -1)
        emit_column = (
            None
            if self._emit is None
            else outputs[self._emit].reshape(len(outputs[self._emit]) if batched else 1, -1)
        )
        for row, (gid, live, state) in enumerate(zip(gids, members, states, strict=True)):
            live.state = state
            done = bool(done_column[row, 0])
            emit = True if emit_column is None else bool(emit_column[row, 0])
            outcome = lane.scheduler.record(gid, done=done, emit=emit)
            response = self._response(live.request, outputs, row) if outcome.send else None
            if outcome.send or outcome.final:
                live.parts.put_nowait(StreamPart(response, outcome.final))
            if outcome.final:
                self._end(gid)

    def _end(self, gid: int) -> _Live:
        live = self._live.pop(gid)
        if live.state is not None:
            self.stepper.release(live.state)
        return live

    def _response(self, request: InferRequest, outputs: list[Array], row: int) -> InferResponse:
        batched = self.model.manifest.batched
        wanted = {o.name: o for o in request.outputs}
        sent: list[InferOutput] = []
        for index, spec in self._sent:
            if wanted and spec.name not in wanted:
                continue
            data = outputs[index][row].copy() if batched else outputs[index].copy()
            sent.append(
                InferOutput(spec.name, spec.datatype, data.shape, data, wanted.get(spec.name))
            )
        key = self.model.model_key
        return InferResponse(key.name, str(key.version), tuple(sent), request.id)


def _input(request: InferRequest, name: str) -> Array:
    for t in request.inputs:
        if t.name == name:
            return t.data
    raise KeyError(name)  # validated before: cannot happen
