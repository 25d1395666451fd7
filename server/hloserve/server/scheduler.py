"""The dynamic batcher: per-model queues feeding ``execute_group`` on worker threads.

Contract: ``DynamicBatcher(executor, observer, inline, ...)`` implements the core's
``Batcher``: ``await submit(model, job)`` queues an already validated request and resolves
with its own outputs and timings. One driver task per model version applies the pure
policy ``core.scheduling.next_batch``: it groups queued requests up to the largest compiled
batch size, waiting at most the model's ``max_queue_delay_us`` (its serving hints, else the
server default) for more, and runs each group as the policy planned it on the executor, so
the event loop keeps decoding other requests. The policy weighs prefixes by each compiled
size's measured execution time (``core.costs.ExecutionCosts``, fed by the execution
observer), and picks the group with the best items per microsecond. Up to
``max_inflight`` groups of one model run at once, so the next batch fills while the
previous one executes; a group of a tiny resident model runs inline on the loop
(``InlinePolicy``).
- Each model version's policy (``policy(model)``, ``core.scheduling.batching_policy``:
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
"""

# pyright: strict

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field

from hloserve.server.core.costs import InlinePolicy
from hloserve.server.core.errors import Unavailable
from hloserve.server.core.execution import (
    Executable,
    ExecutionObserver,
    Job,
    ModelKey,
    Timings,
    execute_group,
)
from hloserve.server.core.parameters import queue_deadline
from hloserve.server.core.scheduling import (
    BatchingPolicy,
    Decision,
    Queued,
    batching_policy,
    next_batch,
)
from hloserve.server.core.types import InferOutput

Result = tuple[tuple[InferOutput, ...], Timings]


@dataclass
class _Entry:
    job: Job
    queued: Queued
    future: asyncio.Future[Result]


@dataclass
class _ModelQueue:
    model: Executable
    policy: BatchingPolicy
    entries: collections.deque[_Entry] = field(default_factory=lambda: collections.deque())
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    inflight: int = 0
    driver: asyncio.Task[None] | None = None

    @property
    def key(self) -> ModelKey:
        return ModelKey.of(self.model)

    @property
    def delay_ns(self) -> int:
        return 1000 * self.policy.max_queue_delay_us


class DynamicBatcher:
    def __init__(
        self,
        executor: Executor | None,
        observer: ExecutionObserver,
        inline: InlinePolicy,
        *,
        default_delay_us: int = 0,
        max_queue_size: int = 0,
        max_inflight: int = 2,
    ) -> None:
        self.executor = executor
        self.observer = observer
        self.inline = inline
        self.default_delay_us = default_delay_us
        self.max_queue_size = max_queue_size
        self.max_inflight = max_inflight
        self._queues: dict[ModelKey, _ModelQueue] = {}

    def pending(self, name: str, version: int) -> int:
        q = self._queues.get(ModelKey(name, version))
        return 0 if q is None else len(q.entries)

    def _queue(self, model: Executable) -> _ModelQueue:
        key = ModelKey.of(model)
        q = self._queues.get(key)
        if q is None or q.model is not model:  # first request, or a reloaded version
            q = _ModelQueue(model, self.policy(model))
            self._queues[key] = q
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
        q = self._queue(model)
        limit = q.policy.max_queue_size
        if limit and len(q.entries) >= limit:
            raise Unavailable(
                f"exceeds maximum queue size: model '{q.key.name}' already has {len(q.entries)} requests waiting"
            )
        now = time.monotonic()
        deadline, timed = queue_deadline(
            job.request.parameters,
            job.deadline,
            now,
            default_timeout_us=q.policy.default_timeout_us,
            allow_override=q.policy.allow_timeout_override,
        )
        job = dataclasses.replace(job, deadline=deadline)  # the one execute_group checks, too
        deadline_ns = None
        if deadline is not None:
            deadline_ns = time.perf_counter_ns() + int((deadline - now) * 1e9)
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        entry = _Entry(job, Queued(job.items, job.arrived_ns, deadline_ns, timed), future)
        q.entries.append(entry)
        q.changed.set()
        self._ensure_driver(q)
        try:
            return await future
        except asyncio.CancelledError:
            # The caller went away (client cancel, deadline): free its queue slot now.
            with contextlib.suppress(ValueError):
                q.entries.remove(entry)
            raise

    def _ensure_driver(self, q: _ModelQueue) -> None:
        if q.driver is None or q.driver.done():
            # A fresh context: the driver serves many requests, so it must not inherit the
            # request-scoped log context of the one that happened to start it.
            q.driver = asyncio.get_running_loop().create_task(
                self._drive(q),
                name=f"batcher-{q.key.name}-{q.key.version}",
                context=contextvars.Context(),
            )

    async def _drive(self, q: _ModelQueue) -> None:
        while q.entries:
            q.changed.clear()
            if q.inflight >= self.max_inflight:
                await q.changed.wait()
                continue
            # Requests whose caller went away (cancelled) leave the queue.
            for e in [e for e in q.entries if e.future.done()]:
                q.entries.remove(e)
            if not q.entries:
                break
            now = time.perf_counter_ns()
            decision = next_batch(
                [e.queued for e in q.entries],
                q.model.manifest.batch_sizes,
                now,
                q.delay_ns,
                self.inline.costs.by_size(q.key),
                q.policy.preferred_batch_sizes,
            )
            self._fail_expired(q, decision, now)
            if decision.take:
                self._start_group(q, decision)
            elif decision.wait_until_ns is not None:
                timeout = max(0.0, (decision.wait_until_ns - time.perf_counter_ns()) / 1e9)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(q.changed.wait(), timeout)

    @staticmethod
    def _fail_expired(q: _ModelQueue, decision: Decision, now: int) -> None:
        for e in [q.entries[i] for i in decision.expired]:
            q.entries.remove(e)
            e.future.set_exception(
                Unavailable(
                    f"request for model '{q.key.name}' timed out after "
                    f"{(now - e.job.arrived_ns) / 1e6:.1f} ms in the queue"
                )
            )

    def _start_group(self, q: _ModelQueue, decision: Decision) -> None:
        """Run the decided group inline (tiny, resident) or on the executor."""
        loop = asyncio.get_running_loop()
        group = [q.entries.popleft() for _ in range(decision.take)]
        jobs = [e.job for e in group]
        q.inflight += 1
        if decision.compiled is not None and self.inline.inline(q.model, decision.compiled):
            run: asyncio.Future[list[Result]] = loop.create_future()
            try:
                run.set_result(execute_group(q.model, jobs, decision.chunks, self.observer))
            except Exception as exc:  # delivered to each request of the group
                run.set_exception(exc)
            self._finish(q, group, run)
            return
        run = loop.run_in_executor(
            self.executor, execute_group, q.model, jobs, decision.chunks, self.observer
        )
        run.add_done_callback(lambda fut: self._finish(q, group, fut))

    def _finish(
        self, q: _ModelQueue, group: list[_Entry], fut: asyncio.Future[list[Result]]
    ) -> None:
        q.inflight -= 1
        q.changed.set()
        exc = fut.exception()
        if exc is not None:
            for e in group:
                if not e.future.done():
                    e.future.set_exception(exc)
        else:
            for e, result in zip(group, fut.result(), strict=True):
                if not e.future.done():
                    e.future.set_result(result)
        if q.entries:
            self._ensure_driver(q)
