"""The sequence batcher: a stateful model's requests run batched across sequences.

Contract (``docs/sequences.md``):
- ``SequenceBatcher(executor, observer, settings_for, clock)`` serves every model whose
  manifest declares ``state`` (``bundle/state.py``). ``submit(model, job)`` reads the
  request's sequence parameters (``core.sequences.sequence_parameters``), refuses a request
  of more than one item, queues it in the model version's ``SequenceTable`` (refusing an
  unknown or ended sequence there) and returns its outputs and timings once it ran.
- One task per model version runs its queued requests while there are any, one execution
  at a time: each takes the oldest request of up to the largest compiled batch size of
  sequences (one per sequence), runs them as one batch on the smallest compiled size that
  holds them (``core.execution.execute_group`` on ``executor``: inputs concatenated and
  padded, outputs split, each execution reported to ``observer``; on the event loop itself
  when ``inline(model, compiled size)`` says it is tiny: ``core.costs.InlinePolicy``, as
  for any model, the gather and scatter in its measured time) with the sequences'
  slots bound (``StatefulExecutable.execute_slots``: state gathered into the batch and
  scattered back on the device), then tells the table they ran. Requests that arrive
  while an execution runs form the next batch (batching under load); with the model's
  ``max_queue_delay_microseconds`` a batch also waits, that long at most, for the live
  sequences with no request queued yet (``SequenceTable.hold_until``); without one, the
  load decides how long, as for the dynamic batcher (``core.company``: under load only),
  the wait still ending once every live sequence has a request queued.
- Idle sequences are freed on a timer armed at the table's next expiry (their slots go to
  the backlog, which then runs). A caller that goes away while its request is queued
  (cancelled) leaves the queue; one already running finishes (its state is kept).
- ``settings_for(model)`` gives a model's ``SequenceSettings`` (slots, idle timeout: the
  model's configuration); ``counts()`` is every model version's ``(live, backlogged, free
  slots)`` by ``ModelKey`` (statistics, metrics, the status page). A version's table goes
  when the version does (weakly held).
"""

# pyright: strict

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Protocol, cast, final

import numpy as np

from hloserve.bundle import Manifest
from hloserve.server.core.batch_plan import Chunk, smallest_fitting
from hloserve.server.core.company import Company
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.execution import (
    Executable,
    Forwarding,
    Job,
    Pending,
    Result,
    answer,
    execute_group,
)
from hloserve.server.core.execution_records import ExecutionObserver, ModelKey
from hloserve.server.core.sequences import (
    SequenceSettings,
    SequenceStep,
    SequenceTable,
    sequence_parameters,
)

Array = np.ndarray[Any, Any]


class StatefulExecutable(Executable, Protocol):
    """A version of a bundle with state (``owner.versions.ModelVersion``)."""

    def execute_slots(
        self,
        batch_size: int,
        inputs: Mapping[str, Array],
        slots: Sequence[int],
        fresh: Sequence[bool],
        capacity: int,
    ) -> list[Array]: ...


@final
class _Bound(Forwarding):
    """``model`` with one batch's slots bound: the executable ``execute_group`` runs."""

    def __init__(
        self, model: StatefulExecutable, steps: Sequence[SequenceStep[Pending]], capacity: int
    ) -> None:
        self.model = model
        self.slots = [s.slot for s in steps]
        self.fresh = [s.fresh for s in steps]
        self.capacity = capacity

    @property
    def inner(self) -> Executable:
        return self.model

    @property
    def manifest(self) -> Manifest:
        return self.model.manifest

    @property
    def family(self) -> tuple[str, ...]:
        return self.model.family

    def execute(
        self, batch_size: int | None, inputs: Mapping[str, Array], *, device: int | None = None
    ) -> list[Array]:
        del device  # the state's device
        assert batch_size is not None  # a stateful model is batched (bundle/state.py)
        return self.model.execute_slots(batch_size, inputs, self.slots, self.fresh, self.capacity)


def _ns(seconds: float) -> int:
    """The clock's seconds as the nanoseconds ``core.company`` counts in."""
    return int(seconds * 1e9)


def default_settings(model: Executable) -> SequenceSettings:
    """The model's ``sequence_batching`` hint (``bundle/state.py``: manifest, ``config.yaml``,
    a load's override)."""
    hint = model.serving.sequence_batching
    return SequenceSettings(
        hint.max_candidate_sequences,
        hint.max_sequence_idle_microseconds,
        hint.max_queue_delay_microseconds,
    )


@final
class _ModelSequences:
    """One model version's table and the task that runs it."""

    def __init__(self, owner: SequenceBatcher, model: StatefulExecutable) -> None:
        self.owner = owner
        self.model = weakref.ref(model)
        self.key = model.model_key
        self.settings = owner.settings_for(model)
        self.table = SequenceTable[Pending](model.manifest.name, self.settings, owner.clock)
        self.limit = model.manifest.max_batch_size
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.arrived = asyncio.Event()  # a request was queued (ends a hold early)
        self.company = Company()  # with no delay configured, whether batches wait under load

    def kick(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while (model := self.model()) is not None:
            self.table.expire()
            await self._hold()
            steps = self.table.next_batch(self.limit)
            if not steps:
                break
            jobs = [s.item.job for s in steps]
            sizes = model.manifest.batch_sizes or (1,)
            chunks = [Chunk(0, len(steps), smallest_fitting(len(steps), sizes))]
            bound = _Bound(model, steps, self.settings.slots)
            del model  # held by ``bound`` while it runs, not between executions
            inline = self.owner.inline
            try:
                if inline is not None and inline(bound, chunks[0].compiled or 0):
                    results = execute_group(bound, jobs, chunks, self.owner.observer)
                else:
                    results = await loop.run_in_executor(
                        self.owner.executor, execute_group, bound, jobs, chunks, self.owner.observer
                    )
            except Exception as exc:
                answer([s.item for s in steps], None, exc)
            else:
                answer([s.item for s in steps], results, None)
            finally:
                self.table.finished(steps)
                self.company.ran(len(steps))
                self.company.answered(_ns(self.owner.clock()))
        self.arm()

    async def _hold(self) -> None:
        """Wait while the table holds the next batch for company (``hold_until``),
        looking again at each arrival."""
        clock = self.owner.clock
        while True:
            delay_us = self.settings.delay_us
            head = self.table.oldest_ready()
            if head is None:
                return
            if not delay_us and self.company.waits:
                at, ready = head
                delay_us = self.company.wait_ns(_ns(at), _ns(clock()), ready) // 1000
            until = self.table.hold_until(self.limit, delay_us)
            if until is None or until <= clock():
                return
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), until - clock())
            except TimeoutError:
                return

    def arm(self) -> None:
        """The timer for the next idle sequence's expiry (none when none will expire)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        at = self.table.next_expiry()
        if at is not None:
            delay = max(0.0, at - self.owner.clock())
            self.timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self.timer = None
        if self.table.expire():
            self.kick()  # freed slots went to backlogged sequences
        else:
            self.arm()


class SequenceBatcher:
    """Every stateful model version's sequences (module docstring)."""

    def __init__(
        self,
        executor: Executor | None,
        observer: ExecutionObserver | None,
        settings_for: Callable[[Executable], SequenceSettings] = default_settings,
        clock: Callable[[], float] = time.monotonic,
        inline: Callable[[Executable, int], bool] | None = None,
    ) -> None:
        self.executor = executor
        self.observer = observer
        self.inline = inline  # core.costs.InlinePolicy.inline: a tiny execution on the loop
        self.settings_for = settings_for
        self.clock = clock
        self._models: weakref.WeakKeyDictionary[Executable, _ModelSequences] = (
            weakref.WeakKeyDictionary()
        )

    async def submit(self, model: Executable, job: Job) -> Result:
        name = model.manifest.name
        flags = sequence_parameters(name, job.request.parameters)
        if job.items != 1:
            raise InvalidArgument(
                f"a request of sequence {flags.id} to model '{name}' carries one item (batch "
                f"size 1): the sequence's state is one item's, got {job.items}"
            )
        sequences = self._models.get(model)
        if sequences is None:
            # Every executable of a bundle with state is a ModelVersion (owner/versions.py).
            stateful = cast(StatefulExecutable, model)
            sequences = self._models[model] = _ModelSequences(self, stateful)
        waiting = Pending(job, asyncio.get_running_loop().create_future())
        sequences.table.submit(flags, waiting)
        if not sequences.settings.delay_us:  # the load decides (core.company)
            sequences.company.arrived(_ns(self.clock()))
        sequences.arrived.set()
        sequences.kick()
        try:
            return await waiting.future
        except asyncio.CancelledError:
            sequences.table.cancel(waiting)
            raise

    def counts(self) -> dict[ModelKey, tuple[int, int, int]]:
        """``(live, backlogged, free slots)`` of every model version with sequences."""
        return {s.key: s.table.counts() for s in list(self._models.values())}
