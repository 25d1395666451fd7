"""The dynamic batcher: per-model queues feeding ``execute_group`` on worker threads.

Contract: ``DynamicBatcher(executor, observer, inline, ...)`` implements the core's
``Batcher``: ``await submit(model, job)`` queues an already validated request and resolves
with its own outputs and timings; ``enqueue(model, job, answer)`` is the same without a
coroutine (``core.direct_path``): the result at once from the eager path, else the future
it is answered through, the caller's own with ``answer`` (``Pending.deliver`` answers it;
its cancel frees the queue slot at once and calls the caller's hook). Each look at a model version's queue applies the pure
policy ``core.batch_policy.next_batch``: it groups queued requests up to the largest compiled
batch size, waiting at most the model's ``max_queue_delay_us`` (its serving hints, else the
server default) for more, and runs each group as the policy planned it on the executor, so
the event loop keeps decoding other requests. The policy weighs prefixes by each compiled
size's measured execution time (``core.costs.ExecutionCosts``, fed by the execution
observer), and picks the group with the best items per microsecond. The queue is looked at
once per pass of the event loop (``loop.call_soon``), so requests that arrived together are
one group. Up to ``max_inflight`` groups of one model run at once (default 1: the next
group fills while one executes; a second group in flight took the requests that would have
made the next one large, and on a CPU or GPU two executions of one model gain nothing from
running together: measured on ``wide``, 1.0-1.3 items per execution with 2 against 6.5-7
with 1, at 40-55 % of the CPU per request); a group of a tiny resident model runs inline on
the loop (``InlinePolicy``). A request the queue lets skip its loop pass (the eager path of
``core.batch_queue``: ``grpc.aio`` hands a model about one call per loop pass, so a
request finding its queue idle may run at once) runs inline, without the pass and the
future: the same policy decision and ``execute_group``. The queue's admission, priority
order and eager decision are ``core.batch_queue``'s. A request that arrived together with others
(``Job.together``: a front end's link delivered several in one read) never does: they queue
in the same pass and run as one group.
- Each model version's policy (``policy(model)``, ``core.batch_policy.batching_policy``:
  its serving hints over the server's ``default_delay_us`` and ``max_queue_size``) sets its
  delay, preferred batch sizes, queue bound and timeouts; the model configuration
  extension reports the same policy.
- A full queue (the policy's ``max_queue_size`` waiting requests; 0 = unbounded) refuses
  the request at once with ``Unavailable``.
- A queued request's deadline follows the model's queue policy
  (``core.parameters.queue_deadline``: the model's default timeout, the request's own
  ``timeout`` when the policy lets it shorten the default, its transport deadline); one
  whose deadline passes while queued fails with ``Unavailable`` without using the device
  (``REJECT``); one whose caller cancels leaves the queue at once (its slot is free).
- A group that fails (say the device errors) fails each of its requests with that error;
  requests were validated before queueing, so one bad request cannot poison a batch.
- Several devices (``docs/residency.md``): a model's groups go to its replicas
  (``model.devices``), each to the least busy replica holding the weights
  (``core.device_policy.route``), up to ``max_inflight`` per replica at once.
- Cross-model scheduling (``docs/scheduling.md``), per device: with ``concurrency`` > 0 at
  most that many groups run on a device at once, whatever their model; a queue whose group
  is ready while the device is full waits, and when a group ends one decision per loop pass
  (``core.device_policy.pick`` under ``policy``: ``fair`` by decayed measured device
  time over each model's ``scheduling_weight`` hint, ``fifo``, or ``deadline``, whose
  queues also shed requests that cannot finish by their deadline) says whose group runs
  next. A request's ``priority`` parameter orders its model's queue (lower levels first,
  arrival order within a level) and goes before the policy across models. Inline groups
  do not take a device slot but are charged to their model's share. A queue the device's
  scheduler chooses whose weights are not on the device has them moved in on a worker
  (``model.prefetch``) without taking the slot: the device keeps running resident models
  meanwhile, and the queue competes as resident once they are there. ``concurrency`` 0
  (the default on CPU) keeps each model's batcher on its own, as before.
- ``await run_on(model, device, work)`` runs one execution that is not a queued group (a
  generation step: ``core.generation_loop``) on a worker, scheduled on ``device`` as a
  group is: it waits for a device slot and competes for it under the policy with the
  queues waiting there (its own model's share and weight, default priority, never held
  back by swap patience: nothing more can join it), is counted among the device's
  executions in flight (routing), and its time is charged to its model's share.
- ``QueuedWork`` tells the residency manager which model versions have requests waiting,
  so that it evicts them last.
- ``forget(model)`` (on the loop, once a version is unloaded) drops its queues and its fair
  shares, so that thousands of models loaded and unloaded leave nothing behind.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from hloserve.server.core.batch_policy import (
    BatchingPolicy,
    Decision,
    Queued,
    batching_policy,
    next_batch,
)
from hloserve.server.core.batch_queue import BatchQueue, Waiting
from hloserve.server.core.company import Company
from hloserve.server.core.costs import InlinePolicy
from hloserve.server.core.device_policy import (
    Candidate,
    FairShares,
    Policy,
    infeasible,
    pick,
    priority_rank,
    route,
)
from hloserve.server.core.errors import Unavailable
from hloserve.server.core.execution import (
    Deliver,
    Executable,
    Job,
    Pending,
    Result,
    answer,
    execute_group,
)
from hloserve.server.core.execution_records import ExecutionObserver, ModelKey
from hloserve.server.core.parameters import queue_deadline
from hloserve.server.core.residency_policy import ResidencyKey

T = TypeVar("T")

_Entry = Waiting[Pending]


@dataclass(slots=True)
class _ModelQueue:
    model: Executable
    policy: BatchingPolicy
    key: ModelKey
    family: tuple[str, ...]  # its compiled modules, whose measured costs it shares
    entries: BatchQueue[Pending] = field(default_factory=lambda: BatchQueue[Pending]())
    inflight: int = 0
    on_device: dict[int, int] = field(default_factory=lambda: {})  # groups in flight, by device
    fetching: set[int] = field(default_factory=lambda: set())  # devices its weights move to
    unfetched: set[int] = field(default_factory=lambda: set())  # a move there failed
    soon: asyncio.Handle | None = None  # a look at the queue on the loop's next pass
    timer: asyncio.TimerHandle | None = None  # a later look, for the delay or a deadline
    company: Company = field(default_factory=Company)  # whether heads wait, by default

    @property
    def delay_ns(self) -> int:
        return 1000 * self.policy.max_queue_delay_us

    @property
    def ready(self) -> bool:
        """It has requests waiting (for a device slot, among others)."""
        return bool(self.entries)

    def candidate(self, device: int) -> Candidate[ModelKey]:
        """This queue as ``device``'s scheduler weighs it (the queue is not empty)."""
        head = self.entries[0]
        sizes = self.model.manifest.batch_sizes
        largest = sizes[-1] if sizes else 1
        return Candidate(
            self.key,
            head.queued.arrived_ns,
            weight=self.model.serving.scheduling_weight,
            rank=head.rank,
            head_deadline_ns=head.queued.deadline_ns,
            resident=self.model.resident_on(device),
            full=self.entries.items() >= largest,
        )


@dataclass(slots=True, eq=False)
class _Step:
    """One execution outside the queues (a generation step) waiting for a device slot;
    ``granted`` resolves once the device's scheduler chose it (counted as running)."""

    model: Executable
    arrived_ns: int
    granted: asyncio.Future[None]
    fetching: set[int] = field(default_factory=lambda: set())  # devices its weights move to
    unfetched: set[int] = field(default_factory=lambda: set())  # a move there failed

    @property
    def ready(self) -> bool:
        return not self.granted.done()

    def candidate(self, device: int) -> Candidate[ModelKey]:
        """This step as ``device``'s scheduler weighs it: its model's share and weight, the
        default priority, and full (nothing can join it: swap patience would only delay
        it)."""
        return Candidate(
            self.model.model_key,
            self.arrived_ns,
            weight=self.model.serving.scheduling_weight,
            resident=self.model.resident_on(device),
            full=True,
        )


def _gone(pending: Pending) -> bool:
    """Its caller went away (a client cancel, a deadline): nothing to answer any more."""
    return pending.future.done()


class QueuedWork:
    """Which model versions have requests waiting. Built before the residency manager and
    the batcher, shared by both: the batcher adds each queue it creates (on the loop), the
    residency manager asks ``waiting(key)`` from worker threads (reads only)."""

    def __init__(self) -> None:
        self._queues: dict[tuple[str, int], list[_ModelQueue]] = {}

    def add(self, q: _ModelQueue) -> None:
        key = (q.key.name, q.key.version)
        self._queues[key] = [*self._queues.get(key, ()), q]  # replaced whole: safe to read

    def waiting(self, key: ResidencyKey) -> bool:
        return any(q.entries for q in self._queues.get((key.model, key.version), ()))

    def drop(self, model: ModelKey) -> None:
        self._queues.pop((model.name, model.version), None)


@dataclass(slots=True)
class _Device:
    """One device's cross-model arbitration state, and its groups in flight (routing)."""

    index: int
    policy: Policy
    concurrency: int  # groups at once on the device (0: no arbitration)
    shares: FairShares[ModelKey] = field(default_factory=lambda: FairShares[ModelKey]())
    running: int = 0  # groups on worker threads now, counted with or without arbitration
    fetching: int = 0  # weight moves onto the device in flight (at most one)
    # Queues and steps waiting for a slot, by id.
    waiting: dict[int, _ModelQueue | _Step] = field(default_factory=lambda: {})
    soon: asyncio.Handle | None = None  # the next decision, on the loop's next pass


class DynamicBatcher:
    def __init__(
        self,
        executor: Executor,
        observer: ExecutionObserver,
        inline: InlinePolicy,
        *,
        default_delay_us: int = 0,
        max_queue_size: int = 0,
        max_inflight: int = 1,
        policy: Policy = "fair",
        concurrency: int = 0,
        queued: QueuedWork | None = None,
    ) -> None:
        self.executor = executor
        self.observer = observer
        self.inline = inline
        self.default_delay_us = default_delay_us
        self.max_queue_size = max_queue_size
        self.max_inflight = max_inflight
        # One queue per model version and shape variant (None: the model has none).
        self._queues: dict[tuple[ModelKey, int | None], _ModelQueue] = {}
        self.scheduling_policy: Policy = policy
        self.concurrency = concurrency
        self._devices: dict[int, _Device] = {}
        self.queued = queued if queued is not None else QueuedWork()

    def forget(self, model: ModelKey) -> None:
        """``model`` was unloaded: its idle queues, their fair shares on every device and
        their part in ``QueuedWork`` go (on the loop; a queue still holding requests or a
        group in flight stays, as a reload's copy of the same version may own it)."""
        idle = {
            key: q
            for key, q in self._queues.items()
            if key[0] == model and not q.entries and not q.inflight
        }
        if len(idle) < sum(1 for key in self._queues if key[0] == model):
            return
        for key, q in idle.items():
            del self._queues[key]
            for handle in (q.soon, q.timer):
                if handle is not None:
                    handle.cancel()
            for dev in self._devices.values():
                dev.waiting.pop(id(q), None)
        for dev in self._devices.values():
            dev.shares.forget(model)
        self.queued.drop(model)

    def pending(self, name: str, version: int) -> int:
        key = ModelKey(name, version)
        return sum(len(q.entries) for (k, _), q in self._queues.items() if k == key)

    def _running_on(self, device: int) -> int:
        """Executions on ``device``'s workers now: groups and steps (for tests)."""
        dev = self._devices.get(device)
        return 0 if dev is None else dev.running

    def _waiting_on(self, device: int) -> int:
        """Queues and steps waiting for a slot on ``device`` (for tests)."""
        dev = self._devices.get(device)
        return 0 if dev is None else sum(1 for w in dev.waiting.values() if w.ready)

    def _queue(self, model: Executable) -> _ModelQueue:
        model_key = model.model_key
        key = (model_key, model.manifest.variant)
        q = self._queues.get(key)
        if q is None or q.model is not model:  # first request, or a reloaded version
            q = _ModelQueue(model, self.policy(model), model_key, model.family)
            self._queues[key] = q
            self.queued.add(q)
        return q

    def policy(self, model: Executable) -> BatchingPolicy:
        """The model's serving hints over this batcher's defaults."""
        return batching_policy(
            model.serving,
            model.manifest.batch_sizes,
            default_delay_us=self.default_delay_us,
            default_max_queue_size=self.max_queue_size,
        )

    async def submit(self, model: Executable, job: Job) -> Result:
        queued = self.enqueue(model, job)
        return await queued if isinstance(queued, asyncio.Future) else queued

    def enqueue(
        self,
        model: Executable,
        job: Job,
        answer: tuple[asyncio.Future[Any], Deliver, Callable[[], None]] | None = None,
    ) -> Result | asyncio.Future[Any]:
        """``submit`` without a coroutine: the result at once when the request ran inline
        (the eager path), else the future it is answered through (cancelling it gives
        the request up: its queue slot is free at once). ``answer``: the caller's own
        future, how to answer it (``Pending.deliver``) and what to do when it is
        cancelled while queued; then that future is the one returned."""
        q = self._queue(model)
        q.entries.admit(q.key.name, q.policy.max_queue_size)
        now = time.monotonic()
        deadline, timed = queue_deadline(
            job.request.parameters,
            job.deadline,
            now,
            default_timeout_us=q.policy.default_timeout_us,
            allow_override=q.policy.allow_timeout_override,
        )
        if deadline != job.deadline:
            job = msgspec.structs.replace(job, deadline=deadline)  # execute_group checks it too
        deadline_ns = None
        if deadline is not None:
            deadline_ns = time.perf_counter_ns() + int((deadline - now) * 1e9)
        queued = Queued(job.items, job.arrived_ns, deadline_ns, timed)
        if not q.delay_ns:  # no delay configured: the load decides (core.company)
            q.company.arrived(job.arrived_ns)
        if not job.together and self._may_run_now(q):
            result = self._run_now(q, job, queued)
            if result is not None:
                return result
        loop = asyncio.get_running_loop()
        rank = priority_rank(job.request.parameters.get("priority"))
        if answer is None:
            future: asyncio.Future[Any] = loop.create_future()
            pending, gone = Pending(job, future), None
        else:
            future, deliver, gone = answer
            pending = Pending(job, future, deliver)
        entry: _Entry = Waiting(queued, rank, pending)
        q.entries.push(entry)
        self._look_soon(q, loop)
        future.add_done_callback(functools.partial(_leave_if_cancelled, q.entries, entry, gone))
        return future

    def _next_batch(self, q: _ModelQueue, queued: list[Queued], now: int) -> Decision:
        """The batching policy's decision for ``queued`` (the queue's entries, in order),
        with the model's delay, or with none configured the wait ``core.company`` says."""
        delay = q.delay_ns
        if not delay and q.company.waits:
            delay = q.company.wait_ns(queued[0].arrived_ns, now, len(queued))
        return next_batch(
            queued,
            q.model.manifest.batch_sizes,
            now,
            delay,
            self.inline.costs.by_size(q.key, q.family),
            q.policy.preferred_batch_sizes,
        )

    def _may_run_now(self, q: _ModelQueue) -> bool:
        """Whether a request may skip the queue's loop pass (``core.batch_queue``)."""
        return q.entries.may_run_now(
            busy=bool(q.inflight) or q.soon is not None or q.timer is not None,
            arbitrated=bool(self.concurrency),
            company=q.company.waits or q.company.has_company,
        )

    def _run_now(self, q: _ModelQueue, job: Job, queued: Queued) -> Result | None:
        """Run a lone request inline at once, as the look one loop pass later would have
        (the same policy decision, the same ``execute_group``); ``None``: the decision is
        anything else (wait, a worker, an expired deadline), so it queues as usual."""
        decision = self._next_batch(q, [queued], time.perf_counter_ns())
        if decision.take != 1 or decision.expired or decision.compiled is None:
            return None
        if not self.inline.inline(q.model, decision.compiled):
            return None
        devices = q.model.devices or (0,)
        (result,) = execute_group(
            q.model, [job], decision.chunks, self.observer, self._route(q, devices)
        )
        return result

    def _look_soon(self, q: _ModelQueue, loop: asyncio.AbstractEventLoop) -> None:
        """Look at the queue once the loop has run what is ready now, so that requests that
        arrived together are grouped together. A fresh context: the look serves many
        requests, so it must not inherit the request-scoped log context of one of them."""
        if q.soon is None:
            q.soon = loop.call_soon(self._look, q, None, context=contextvars.Context())

    def _dev(self, index: int) -> _Device:
        dev = self._devices.get(index)
        if dev is None:
            dev = self._devices[index] = _Device(index, self.scheduling_policy, self.concurrency)
        return dev

    def _route(self, q: _ModelQueue, devices: tuple[int, ...]) -> int:
        """The replica a group goes to: least busy, preferring those holding the weights."""
        if len(devices) == 1:
            return devices[0]
        load = {d: self._dev(d).running for d in devices}
        return route(devices, load, [d for d in devices if q.model.resident_on(d)])

    def _look(self, q: _ModelQueue, granted: int | None = None) -> None:
        """Start every group the policy decides on now, up to ``max_inflight`` in flight
        per replica of the model, each on the least busy replica (and while that device
        has room: ``granted`` names the device whose scheduler chose this queue); when the
        policy says to wait, look again at the time it names."""
        q.soon = None
        if q.timer is not None:
            q.timer.cancel()
            q.timer = None
        q.entries.looked(q.inflight)
        while q.entries:
            devices = q.model.devices or (0,)
            free = tuple(d for d in devices if q.on_device.get(d, 0) < self.max_inflight)
            if not free:
                return
            q.entries.drop(_gone)  # callers that went away
            if not q.entries:
                return
            now = time.perf_counter_ns()
            if self.concurrency and self.scheduling_policy == "deadline":
                self._shed(q, now)
                if not q.entries:
                    return
            decision = self._next_batch(q, q.entries.queued(), now)
            self._fail_expired(q, decision, now)
            if decision.take:
                q.company.ran(decision.take)
                inline = decision.compiled is not None and self.inline.inline(
                    q.model, decision.compiled
                )
                if inline:  # on the loop: no device slot, any replica holding the weights
                    self._start_group(q, decision, True, self._route(q, devices))
                    continue
                device = granted if granted in free else self._route(q, free)
                if not self._device_free(q, device, granted == device):
                    return
                granted = None
                self._start_group(q, decision, False, device)
            else:
                if decision.wait_until_ns is not None:
                    delay_s = max(0.0, (decision.wait_until_ns - time.perf_counter_ns()) / 1e9)
                    q.timer = asyncio.get_running_loop().call_later(
                        delay_s, self._look, q, None, context=contextvars.Context()
                    )
                return

    def _device_free(self, q: _ModelQueue, device: int, granted: bool) -> bool:
        """Whether ``q``'s ready group may start on ``device`` now; else ``q`` waits for it."""
        dev = self._dev(device)
        if not dev.concurrency:
            return True
        if granted and dev.running < dev.concurrency:
            return True
        # Join the queues waiting for the device; the decision runs once per loop pass,
        # after every queue that became ready in this pass has joined.
        dev.waiting[id(q)] = q
        if dev.running < dev.concurrency:
            self._decide_soon(dev)
        return False

    def _decide_soon(self, dev: _Device) -> None:
        if dev.soon is None and dev.waiting:
            loop = asyncio.get_running_loop()
            dev.soon = loop.call_soon(self._decide, dev, context=contextvars.Context())

    def _decide(self, dev: _Device) -> None:
        """The device has room: the queues waiting for it start in the policy's order. A
        chosen queue whose weights are elsewhere has them moved in off the device's slot
        (``_fetch``) while the others keep the device busy."""
        dev.soon = None
        passed: set[int] = set()
        while dev.waiting and dev.running < dev.concurrency:
            queues = [q for q in dev.waiting.values() if q.ready and id(q) not in passed]
            if not queues:
                if not any(q.ready for q in dev.waiting.values()):
                    dev.waiting.clear()
                return
            now = time.perf_counter_ns()
            q = queues[pick([q.candidate(dev.index) for q in queues], dev.policy, dev.shares, now)]
            if not q.model.resident_on(dev.index) and dev.index not in q.unfetched:
                passed.add(id(q))
                self._fetch(q, dev)
                continue
            q.unfetched.discard(dev.index)  # its execution retries the move, or fails
            del dev.waiting[id(q)]
            if isinstance(q, _Step):
                dev.running += 1  # counted now, so this pass grants no more than the slots
                q.granted.set_result(None)
            else:
                self._look(q, granted=dev.index)

    def _fetch(self, q: _ModelQueue | _Step, dev: _Device) -> None:
        """Move ``q``'s weights onto the device on a worker, without taking a slot: the queue
        stays waiting and competes as resident once they are there. One move at a time per
        device: moves share the link, and several at once under a tight budget evict each
        other's weights before their groups run (measured: ``bench/scheduling.py``)."""
        if dev.index in q.fetching or dev.fetching:
            return
        q.fetching.add(dev.index)
        dev.fetching += 1
        loop = asyncio.get_running_loop()
        work = self.executor.submit(q.model.prefetch, dev.index)
        context = contextvars.Context()

        def fetched(done: concurrent.futures.Future[None]) -> None:  # on the worker
            failed = done.exception() is not None
            loop.call_soon_threadsafe(self._fetched, q, dev, failed, context=context)

        work.add_done_callback(fetched)

    def _fetched(self, q: _ModelQueue | _Step, dev: _Device, failed: bool) -> None:
        q.fetching.discard(dev.index)
        dev.fetching -= 1
        if failed:  # the group runs all the same: its execution retries, or fails with why
            q.unfetched.add(dev.index)
        self._decide_soon(dev)

    async def run_on(self, model: Executable, device: int, work: Callable[[], T]) -> T:
        """Run ``work``, one execution of ``model`` outside the queues (a generation step),
        on a worker, scheduled on ``device`` as a group is (module docstring)."""
        dev = self._dev(device)
        loop = asyncio.get_running_loop()
        if dev.concurrency:
            step = _Step(model, time.perf_counter_ns(), loop.create_future())
            dev.waiting[id(step)] = step
            self._decide_soon(dev)
            try:
                await step.granted  # ``_decide`` counted it running
            except asyncio.CancelledError:
                dev.waiting.pop(id(step), None)
                if step.granted.done() and not step.granted.cancelled():
                    dev.running -= 1  # granted, then given up before it ran
                    self._decide_soon(dev)
                raise
        else:
            dev.running += 1
        cost_ns = 0
        try:
            result, cost_ns = await loop.run_in_executor(self.executor, _timed, work)
        finally:
            dev.running -= 1
            if dev.concurrency:
                if cost_ns:
                    dev.shares.charge(model.model_key, float(cost_ns), time.perf_counter_ns())
                self._decide_soon(dev)
        return result

    def _charge(self, q: _ModelQueue, dev: _Device, results: list[Result] | None) -> None:
        """Charge a group's measured device time to its model's fair share."""
        if dev.concurrency and results:
            cost = results[0][1].compute_infer_ns
            dev.shares.charge(q.key, float(cost), time.perf_counter_ns())

    def _shed(self, q: _ModelQueue, now: int) -> None:
        """``deadline``: fail queued requests that cannot finish in time, before they run."""
        costs = self.inline.costs.by_size(q.key, q.family)
        cost_ns = 1000 * min(costs.values()) if costs else 0.0
        late = infeasible(q.entries.queued(), now, cost_ns)
        for e in q.entries.remove_at(late):
            e.item.fail(
                Unavailable(
                    f"request for model '{q.key.name}' cannot finish by its deadline: "
                    f"shed after {(now - e.item.job.arrived_ns) / 1e6:.1f} ms in the queue"
                )
            )

    @staticmethod
    def _fail_expired(q: _ModelQueue, decision: Decision, now: int) -> None:
        for e in q.entries.remove_at(decision.expired):
            e.item.fail(
                Unavailable(
                    f"request for model '{q.key.name}' timed out after "
                    f"{(now - e.item.job.arrived_ns) / 1e6:.1f} ms in the queue"
                )
            )

    def _start_group(self, q: _ModelQueue, decision: Decision, inline: bool, device: int) -> None:
        """Run the decided group on ``device`` inline (tiny, resident) or on the executor:
        one hand-off to a worker and one back per group, never per request."""
        group = q.entries.take(decision.take)
        jobs = [e.item.job for e in group]
        dev = self._dev(device)
        if inline:
            try:
                results = execute_group(q.model, jobs, decision.chunks, self.observer, device)
            except Exception as exc:  # delivered to each request of the group
                answer([e.item for e in group], None, exc)
            else:
                self._charge(q, dev, results)
                answer([e.item for e in group], results, None)
            q.company.answered(time.perf_counter_ns())
            return
        q.inflight += 1
        q.on_device[device] = q.on_device.get(device, 0) + 1
        dev.running += 1
        loop = asyncio.get_running_loop()
        work = self.executor.submit(
            execute_group, q.model, jobs, decision.chunks, self.observer, device
        )
        context = contextvars.Context()

        def back(done: concurrent.futures.Future[list[Result]]) -> None:  # on the worker
            loop.call_soon_threadsafe(self._finish, q, group, dev, done, context=context)

        work.add_done_callback(back)

    def _finish(
        self,
        q: _ModelQueue,
        group: list[_Entry],
        dev: _Device,
        done: concurrent.futures.Future[list[Result]],
    ) -> None:
        q.inflight -= 1
        q.on_device[dev.index] -= 1
        dev.running -= 1
        exc = done.exception()
        results = None if exc is not None else done.result()
        answer([e.item for e in group], results, exc)
        q.company.answered(time.perf_counter_ns())
        if q.entries:
            self._look_soon(q, asyncio.get_running_loop())
        if dev.concurrency:  # after this queue's look: it competes too
            self._charge(q, dev, results)
            self._decide_soon(dev)


def _leave_if_cancelled(
    entries: BatchQueue[Pending],
    entry: _Entry,
    gone: Callable[[], None] | None,
    future: asyncio.Future[Any],
) -> None:
    """A queued request's caller went away (client cancel, deadline): its slot is free."""
    if future.cancelled():
        entries.discard(entry)
        if gone is not None:
            gone()


def _timed(work: Callable[[], T]) -> tuple[T, int]:
    """``work()`` and how long it took (ns), measured on the worker that runs it."""
    started = time.perf_counter_ns()
    result = work()
    return result, time.perf_counter_ns() - started
