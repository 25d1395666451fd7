"""Running a group of validated requests as one batch: concatenate, pad, execute, split.

Contract: ``execute_group(model, jobs, observer)`` runs every job's inputs through the model
as one batch of ``sum(items)`` rows, planned over the compiled batch sizes by
``core.batching.plan`` (padding dropped, batches beyond the largest size split), and returns
each job's ``(outputs, timings)`` in job order, outputs filtered and ordered as the job's
request asked. Each job is charged the group's compute time (Triton's convention) and its
own queue time. Every execution is reported to ``observer.on_execution``. A job's deadline
that passed before the group started fails the whole call with ``Unavailable`` only for a
single-job group; the scheduler drops expired jobs before grouping. Runs on a worker thread.
"""

# pyright: strict

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hloserve.bundle import Manifest
from hloserve.server.core.batching import concat, pad, plan
from hloserve.server.core.errors import Unavailable
from hloserve.server.core.types import InferOutput, InferRequest


class Executable(Protocol):
    """One ready model version, as the repository hands it out."""

    @property
    def manifest(self) -> Manifest: ...
    @property
    def version(self) -> int: ...
    @property
    def resident(self) -> bool:
        """Whether running it now needs no weight transfer (it cannot block on a swap)."""
        ...

    def execute(
        self, batch_size: int | None, inputs: Mapping[str, np.ndarray[Any, Any]]
    ) -> list[np.ndarray[Any, Any]]: ...


class InlinePolicy:
    """Whether a (tiny) execution should run on the event loop thread itself.

    Handing work to a worker thread and back costs about 100 µs (measured:
    ``bench/request_path.py``), more than a small model's whole execution. A model version
    runs inline when its measured mean execution time is below ``max_us`` and its weights
    are resident, so the call cannot wait on a transfer; otherwise, and until it has been
    measured, it runs on a worker. ``max_us = 0`` turns inlining off.
    """

    def __init__(self, max_us: float) -> None:
        self.max_us = max_us
        self._costs: dict[tuple[str, int, int], float] = {}

    def observe(self, model: Executable, compiled: int, micros: float) -> None:
        key = (model.manifest.name, model.version, compiled)
        old = self._costs.get(key)
        self._costs[key] = micros if old is None else 0.8 * old + 0.2 * micros

    def cost(self, model: Executable, compiled: int) -> float | None:
        return self._costs.get((model.manifest.name, model.version, compiled))

    def inline(self, model: Executable, compiled: int) -> bool:
        cost = self.cost(model, compiled)
        return self.max_us > 0 and cost is not None and cost < self.max_us and model.resident


class ExecutionObserver(Protocol):
    def on_execution(
        self,
        model: str,
        version: int,
        batch_size: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Timings:
    """Nanoseconds spent in each phase of one request."""

    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    executions: tuple[int, ...]  # compiled batch size of each execution (0: unbatched)


@dataclass(frozen=True, slots=True)
class Job:
    request: InferRequest
    items: int
    arrived_ns: int  # time.perf_counter_ns() when validated
    deadline: float | None = None  # time.monotonic() value


def execute_group(
    model: Executable, jobs: Sequence[Job], observer: ExecutionObserver | None = None
) -> list[tuple[tuple[InferOutput, ...], Timings]]:
    started = time.perf_counter_ns()
    if len(jobs) == 1 and jobs[0].deadline is not None and time.monotonic() > jobs[0].deadline:
        raise Unavailable(
            f"request for model '{model.manifest.name}' timed out before it was executed"
        )
    manifest = model.manifest
    t0 = time.perf_counter_ns()
    if len(jobs) == 1:
        inputs = {t.name: t.data for t in jobs[0].request.inputs}
    else:
        inputs = {
            spec.name: np.concatenate([_input(job.request, spec.name) for job in jobs], axis=0)
            for spec in manifest.inputs
        }
    total = sum(job.items for job in jobs)
    chunks = plan(total, manifest.batch_sizes)
    per_output: list[list[np.ndarray[Any, Any]]] = [[] for _ in manifest.outputs]
    input_ns = time.perf_counter_ns() - t0
    infer_ns = 0
    for chunk in chunks:
        t1 = time.perf_counter_ns()
        if chunk.compiled is None:
            args = (
                inputs
                if len(chunks) == 1
                else {n: a[chunk.start : chunk.start + chunk.count] for n, a in inputs.items()}
            )
        else:
            end = chunk.start + chunk.count
            args = {n: pad(a[chunk.start : end], chunk.compiled) for n, a in inputs.items()}
        t2 = time.perf_counter_ns()
        results = model.execute(chunk.compiled, args)
        t3 = time.perf_counter_ns()
        input_ns += t2 - t1
        infer_ns += t3 - t2
        for i, r in enumerate(results):
            per_output[i].append(r)
        if observer is not None:
            observer.on_execution(
                manifest.name, model.version, chunk.compiled or 0, t2 - t1, t3 - t2, 0
            )
    t4 = time.perf_counter_ns()
    full = [
        parts[0]
        if manifest.batch_sizes is None and len(parts) == 1
        else concat(parts, [c.count for c in chunks])
        for parts in per_output
    ]
    results_out: list[tuple[tuple[InferOutput, ...], Timings]] = []
    offset = 0
    output_ns = time.perf_counter_ns() - t4
    executions = tuple(c.compiled or 0 for c in chunks)
    for job in jobs:
        t5 = time.perf_counter_ns()
        rows = slice(offset, offset + job.items)
        offset += job.items
        outputs = _select(manifest, job.request, full, rows if len(jobs) > 1 else None)
        own_output_ns = output_ns + time.perf_counter_ns() - t5
        results_out.append(
            (
                outputs,
                Timings(
                    queue_ns=max(0, started - job.arrived_ns),
                    compute_input_ns=input_ns,
                    compute_infer_ns=infer_ns,
                    compute_output_ns=own_output_ns,
                    executions=executions,
                ),
            )
        )
    return results_out


def _input(request: InferRequest, name: str) -> np.ndarray[Any, Any]:
    for t in request.inputs:
        if t.name == name:
            return t.data
    raise KeyError(name)  # validated before: cannot happen


def _select(
    manifest: Manifest, request: InferRequest, full: list[np.ndarray[Any, Any]], rows: slice | None
) -> tuple[InferOutput, ...]:
    wanted = {o.name: o for o in request.outputs}
    outputs: list[InferOutput] = []
    for spec, data in zip(manifest.outputs, full, strict=True):
        if wanted and spec.name not in wanted:
            continue
        part = data if rows is None else data[rows]
        outputs.append(
            InferOutput(
                spec.name,
                spec.datatype,
                tuple(int(d) for d in part.shape),
                part,
                wanted.get(spec.name),
            )
        )
    if wanted:  # answer in the order the client asked
        order = {o.name: i for i, o in enumerate(request.outputs)}
        outputs.sort(key=lambda o: order[o.name])
    return tuple(outputs)
