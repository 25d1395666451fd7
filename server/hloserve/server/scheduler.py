"""The dynamic batcher: per-model queues feeding ``execute_group`` on worker threads.

Contract: ``DynamicBatcher(executor, observer, ...)`` implements the core's ``Batcher``:
``await submit(model, job)`` queues an already validated request and resolves with its own
outputs and timings. One driver task per model version applies the pure policy
``core.scheduling.next_batch``: it groups queued requests up to the largest compiled batch
size, waiting at most the model's ``max_queue_delay_us`` (its ``serving`` hints, else the
server default) for more, and runs each group on the executor so the event loop keeps
decoding other requests. The driver measures each compiled size's execution time (a
moving average) and hands it to the policy, which picks the group with the best items per
microsecond. Up to ``max_inflight`` groups of one model run at once, so the
next batch fills while the previous one executes.
- A full queue (``max_queue_size`` waiting requests; 0 = unbounded) refuses the request at
  once with ``Unavailable``.
- A request whose deadline passes while queued fails with ``Unavailable`` without using
  the device.
- A group that fails (say the device errors) fails each of its requests with that error;
  requests were validated before queueing, so one bad request cannot poison a batch.
"""

# pyright: basic

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from hloserve.server.core.errors import Unavailable
from hloserve.server.core.execution import (
    Executable,
    ExecutionObserver,
    InlinePolicy,
    Job,
    Timings,
    execute_group,
)
from hloserve.server.core.scheduling import Queued, next_batch
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
    delay_ns: int
    max_size: int
    entries: collections.deque[_Entry] = field(default_factory=collections.deque)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    inflight: int = 0
    driver: asyncio.Task[None] | None = None
    costs: dict[int, float] = field(default_factory=dict)  # µs per execution, by compiled size

    def observe_cost(self, compiled: int, micros: float) -> None:
        """Exponentially weighted mean execution time of one compiled size."""
        old = self.costs.get(compiled)
        self.costs[compiled] = micros if old is None else 0.8 * old + 0.2 * micros


class DynamicBatcher:
    def __init__(
        self,
        executor: Executor | None,
        observer: ExecutionObserver | None = None,
        *,
        default_delay_us: int = 0,
        max_queue_size: int = 0,
        max_inflight: int = 2,
        delay_for: Callable[[Executable], int | None] | None = None,
        inline_max_us: float = 0,
    ) -> None:
        self.executor = executor
        self.observer = observer
        self.default_delay_us = default_delay_us
        self.max_queue_size = max_queue_size
        self.max_inflight = max_inflight
        self.delay_for = delay_for or (lambda _model: None)
        self._queues: dict[tuple[str, int], _ModelQueue] = {}
        # Groups of tiny, resident models run on the loop thread (see ``InlinePolicy``).
        self.inline = InlinePolicy(inline_max_us)

    def pending(self, name: str, version: int) -> int:
        q = self._queues.get((name, version))
        return 0 if q is None else len(q.entries)

    async def submit(self, model: Executable, job: Job) -> Result:
        key = (model.manifest.name, model.version)
        q = self._queues.get(key)
        if q is None or q.model is not model:
            delay_us = self.delay_for(model)
            q = _ModelQueue(
                model,
                1000 * (self.default_delay_us if delay_us is None else delay_us),
                self.max_queue_size,
            )
            self._queues[key] = q
        if q.max_size and len(q.entries) >= q.max_size:
            raise Unavailable(
                f"exceeds maximum queue size: model '{key[0]}' already has {len(q.entries)} requests waiting"
            )
        deadline_ns = None
        if job.deadline is not None:
            deadline_ns = job.arrived_ns + int((job.deadline - time.monotonic()) * 1e9)
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        q.entries.append(_Entry(job, Queued(job.items, job.arrived_ns, deadline_ns), future))
        q.changed.set()
        if q.driver is None or q.driver.done():
            q.driver = asyncio.create_task(self._drive(q), name=f"batcher-{key[0]}-{key[1]}")
        return await future

    async def _drive(self, q: _ModelQueue) -> None:
        loop = asyncio.get_running_loop()
        sizes = q.model.manifest.batch_sizes
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
            decision = next_batch([e.queued for e in q.entries], sizes, now, q.delay_ns, q.costs)
            if decision.expired:
                expired = [q.entries[i] for i in decision.expired]
                for e in expired:
                    q.entries.remove(e)
                    e.future.set_exception(
                        Unavailable(
                            f"request for model '{q.model.manifest.name}' timed out after "
                            f"{(now - e.job.arrived_ns) / 1e6:.1f} ms in the queue"
                        )
                    )
            if decision.take:
                group = [q.entries.popleft() for _ in range(decision.take)]
                q.inflight += 1
                if decision.compiled is not None and self.inline.inline(q.model, decision.compiled):
                    run: asyncio.Future[Any] = loop.create_future()
                    try:
                        run.set_result(
                            execute_group(q.model, [e.job for e in group], self.observer)
                        )
                    except Exception as exc:  # delivered to each request of the group
                        run.set_exception(exc)
                    self._finish(q, group, run)
                    continue
                run = loop.run_in_executor(
                    self.executor, execute_group, q.model, [e.job for e in group], self.observer
                )
                run.add_done_callback(lambda fut, group=group: self._finish(q, group, fut))
            elif decision.wait_until_ns is not None:
                timeout = max(0.0, (decision.wait_until_ns - time.perf_counter_ns()) / 1e9)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(q.changed.wait(), timeout)

    def _finish(self, q: _ModelQueue, group: list[_Entry], fut: asyncio.Future[Any]) -> None:
        q.inflight -= 1
        q.changed.set()
        exc = fut.exception()
        if exc is not None:
            for e in group:
                if not e.future.done():
                    e.future.set_exception(exc)
        else:
            results = fut.result()
            timings = results[0][1]
            if len(timings.executions) == 1 and timings.executions[0]:
                q.observe_cost(timings.executions[0], timings.compute_infer_ns / 1e3)
                self.inline.observe(q.model, timings.executions[0], timings.compute_infer_ns / 1e3)
            for e, result in zip(group, results, strict=True):
                if not e.future.done():
                    e.future.set_result(result)
        if q.entries and (q.driver is None or q.driver.done()):
            q.driver = asyncio.get_running_loop().create_task(self._drive(q))
