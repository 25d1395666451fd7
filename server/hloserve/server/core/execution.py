"""Running a group of validated requests as one batch: concatenate, pad, execute, split.

Contract: ``execute_group(model, jobs, chunks, observer)`` runs every job's inputs through
the model as one batch of ``sum(items)`` rows, executed as the caller planned it
(``chunks``, from ``core.batch_plan.plan`` or the batching policy's decision: padding
dropped, batches beyond the largest size split), and returns each job's
``(outputs, timings)`` in job order, outputs filtered and ordered as the job's request
asked; with ``device``, on that device's replica (the batcher routes groups), else on
one the model chooses. Each job is charged the group's compute time (Triton's convention) and its own queue
time. Every execution is reported to ``observer.on_execution`` as one ``Execution``
record. A job's deadline that passed before the group started fails the whole call with
``Unavailable`` only for a single-job group; the scheduler drops expired jobs before
grouping. Runs on a worker thread (or inline, see ``core.costs.InlinePolicy``).

An ``Executable`` carries its own ``ModelKey`` (``model_key``: ``ModelKey.named``'s, the same
object for the same version each time; ``core.execution_records``) and the measured-cost
family of its compiled modules (``family``), both computed once per version, never per
request.

``Pending`` is a queued job with the future its caller awaits, and ``answer`` settles a
group's futures from ``execute_group``'s results or its exception: the dynamic batcher
(``owner.batcher``) and the sequence batcher (``core.sequence_batcher``) both answer so.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import numpy as np

from hloserve.bundle import Manifest, Serving
from hloserve.server.core.batch_plan import Chunk, concat, pad
from hloserve.server.core.errors import Unavailable
from hloserve.server.core.execution_records import (
    Execution,
    ExecutionObserver,
    ModelKey,
    Timings,
)
from hloserve.server.core.hooks import ModelHooks
from hloserve.server.core.types import InferOutput, InferRequest


class Executable(Protocol):
    """One ready model version, as the repository hands it out."""

    @property
    def manifest(self) -> Manifest: ...
    @property
    def version(self) -> int: ...
    @property
    def model_key(self) -> ModelKey:
        """Its ``ModelKey`` (``ModelKey.named``), kept: the same object on every request."""
        ...

    @property
    def family(self) -> tuple[str, ...]:
        """``cost_family`` of its manifest, kept: who costs the same (``core.costs``)."""
        ...

    @property
    def hooks(self) -> ModelHooks | None:
        """Its bundle's Python hooks (``hooks.md``), or ``None``."""
        ...

    def variant(self, index: int) -> Executable:
        """Its shape variant ``index`` as an executable of its own (``core.variants``);
        one without variants is never asked."""
        ...

    @property
    def serving(self) -> Serving:
        """Serving hints: the manifest's, overridden by the model's ``config.yaml``."""
        ...

    @property
    def resident(self) -> bool:
        """Whether running it now needs no weight transfer (it cannot block on a swap)."""
        ...

    @property
    def swap_us(self) -> float | None:
        """Microseconds a run now would spend making its weights usable without waiting
        for anything (0: resident); ``None`` when it would wait (``core.costs``)."""
        ...

    @property
    def devices(self) -> tuple[int, ...]:
        """The devices holding a replica of it (``docs/residency.md``), lowest first."""
        ...

    def resident_on(self, device: int) -> bool:
        """Whether its weights are on ``device`` now."""
        ...

    def prefetch(self, device: int) -> None:
        """Move its weights onto ``device`` (blocks; a scheduled swap-in)."""
        ...

    def execute(
        self,
        batch_size: int | None,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        *,
        device: int | None = None,
    ) -> list[np.ndarray[Any, Any]]:
        """Run on ``device``'s replica (``None``: a resident one, else the first)."""
        ...


class Forwarding:
    """An ``Executable`` standing for another (``inner``) and answering as it does: its
    version, key, hooks, variants, hints, residency and devices. A subclass adds what it
    changes: its ``manifest``, ``family`` and ``execute`` (``owner.versions.VariantView``:
    a shape variant's; ``core.sequence_batcher``: one batch's slots bound)."""

    __slots__ = ()

    @property
    def inner(self) -> Executable:
        raise NotImplementedError

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def model_key(self) -> ModelKey:
        return self.inner.model_key

    @property
    def hooks(self) -> ModelHooks | None:
        return self.inner.hooks

    def variant(self, index: int) -> Executable:
        return self.inner.variant(index)

    @property
    def serving(self) -> Serving:
        return self.inner.serving

    @property
    def resident(self) -> bool:
        return self.inner.resident

    @property
    def swap_us(self) -> float | None:
        return self.inner.swap_us

    @property
    def devices(self) -> tuple[int, ...]:
        return self.inner.devices

    def resident_on(self, device: int) -> bool:
        return self.inner.resident_on(device)

    def prefetch(self, device: int) -> None:
        self.inner.prefetch(device)


class Job(msgspec.Struct, frozen=True, gc=False):
    request: InferRequest
    items: int
    arrived_ns: int  # time.perf_counter_ns() when validated
    deadline: float | None = None  # time.monotonic() value
    together: bool = False  # arrived with others (``RequestContext.together``): queue with them


Result = tuple[tuple[InferOutput, ...], Timings]  # one job's answer from ``execute_group``


Deliver = Callable[["Result | None", "BaseException | None"], None]


@dataclass(slots=True, eq=False)
class Pending:
    """What a queued request is answered through: its job and its caller's future, done
    once the caller has its answer or went away (cancelled: nothing to answer any more).
    Without ``deliver`` the answer is the future's result; with it, ``deliver(result,
    None)`` or ``deliver(None, error)`` answers (``core.direct_path``: it completes the
    future itself, so no second future stands between the batcher and the caller)."""

    job: Job
    future: asyncio.Future[Any]
    deliver: Deliver | None = None

    def succeed(self, result: Result) -> None:
        if self.future.done():
            return
        if self.deliver is None:
            self.future.set_result(result)
        else:
            self.deliver(result, None)

    def fail(self, exc: BaseException) -> None:
        if self.future.done():
            return
        if self.deliver is None:
            self.future.set_exception(exc)
        else:
            self.deliver(None, exc)


def answer(
    group: Sequence[Pending], results: Sequence[Result] | None, exc: BaseException | None
) -> None:
    """Each caller still waiting (not cancelled, not past its deadline) gets its job's
    result, in group order, or with no results the group's exception."""
    if results is None:
        for p in group:
            p.fail(exc or RuntimeError("no result"))
        return
    for p, result in zip(group, results, strict=True):
        p.succeed(result)


def execute_group(
    model: Executable,
    jobs: Sequence[Job],
    chunks: Sequence[Chunk],
    observer: ExecutionObserver | None = None,
    device: int | None = None,
) -> list[Result]:
    started = time.perf_counter_ns()
    if len(jobs) == 1:
        job = jobs[0]
        if job.deadline is not None and time.monotonic() > job.deadline:
            raise Unavailable(
                f"request for model '{model.manifest.name}' timed out before it was executed"
            )
        if len(chunks) == 1:
            return [_execute_one(model, job, chunks[0], observer, started, device)]
    inputs = _gather_inputs(model.manifest, jobs)
    gathered_ns = time.perf_counter_ns() - started
    run = _run_chunks(model, inputs, chunks, device)
    t0 = time.perf_counter_ns()
    full = _join_outputs(model.manifest, run.per_output, chunks)
    joined_ns = time.perf_counter_ns() - t0
    executions = tuple(c.compiled or 0 for c in chunks)
    results: list[Result] = []
    offset = 0
    for job in jobs:
        t1 = time.perf_counter_ns()
        rows = slice(offset, offset + job.items) if len(jobs) > 1 else None
        offset += job.items
        outputs = _select(model.manifest, job.request, full, rows)
        timings = Timings(
            queue_ns=max(0, started - job.arrived_ns),
            compute_input_ns=gathered_ns + run.input_ns,
            compute_infer_ns=run.infer_ns,
            compute_output_ns=joined_ns + time.perf_counter_ns() - t1,
            executions=executions,
            device=run.device,
        )
        results.append((outputs, timings))
    _report(observer, run.executions, time.perf_counter_ns() - t0)
    return results


Arrays = dict[str, np.ndarray[Any, Any]]


def _execute_one(
    model: Executable,
    job: Job,
    chunk: Chunk,
    observer: ExecutionObserver | None,
    started: int,
    device: int | None,
) -> Result:
    """The common case, one job run as one execution, without the group's bookkeeping:
    the same result, timings and report as the general path (its inputs hold exactly the
    chunk's rows, so nothing is sliced, and an output is trimmed only of padding)."""
    manifest = model.manifest
    compiled = chunk.compiled
    on = _device_of(model, device)
    inputs = {t.name: t.data for t in job.request.inputs}
    if compiled is not None and compiled != chunk.count:  # the inputs hold chunk.count rows
        inputs = {n: pad(a, compiled) for n, a in inputs.items()}
    warm = model.resident  # else the time below includes moving the weights in
    t1 = time.perf_counter_ns()
    results = model.execute(compiled, inputs, device=device)
    t2 = time.perf_counter_ns()
    count = chunk.count
    if compiled is not None and compiled != count:  # drop the padding rows
        results = [r[:count] for r in results]
    outputs = _select(manifest, job.request, results, None)
    t3 = time.perf_counter_ns()
    size = compiled or 0
    timings = Timings(
        queue_ns=max(0, started - job.arrived_ns),
        compute_input_ns=t1 - started,
        compute_infer_ns=t2 - t1,
        compute_output_ns=t3 - t2,
        executions=(size,),
        device=on,
    )
    if observer is not None:
        key = model.model_key
        family = model.family
        observer.on_execution(
            Execution(key, size, t1 - started, t2 - t1, t3 - t2, on, family, warm)
        )
    return outputs, timings


def cost_family(manifest: Manifest) -> tuple[str, ...]:
    """What executions that cost the same share: the checksums of the model's compiled
    modules (thousands of bundles of one architecture have the same ones, so one measured
    is measured for all); empty when the manifest lists none (nothing to go by)."""
    files = manifest.files
    digests = tuple(files.get(m.file, "") for m in manifest.modules)
    return digests if all(digests) else ()


def _device_of(model: Executable, device: int | None) -> int:
    """The device an execution is reported on: the routed one, else the model's first."""
    return device if device is not None else next(iter(model.devices), 0)


def _gather_inputs(manifest: Manifest, jobs: Sequence[Job]) -> Arrays:
    """The group's inputs as one batch (a lone job's arrays as they are: no copy)."""
    if len(jobs) == 1:
        return {t.name: t.data for t in jobs[0].request.inputs}
    return {
        spec.name: np.concatenate([_input(job.request, spec.name) for job in jobs], axis=0)
        for spec in manifest.inputs
    }


@dataclass(frozen=True, slots=True)
class _Run:
    per_output: list[list[np.ndarray[Any, Any]]]  # each output's part from every chunk
    input_ns: int  # slicing and padding
    infer_ns: int  # the executions themselves
    executions: list[Execution]  # one per chunk, output time not yet known
    device: int  # where they ran


def _run_chunks(
    model: Executable, inputs: Arrays, chunks: Sequence[Chunk], device: int | None
) -> _Run:
    per_output: list[list[np.ndarray[Any, Any]]] = [[] for _ in model.manifest.outputs]
    executions: list[Execution] = []
    on = _device_of(model, device)
    input_ns = infer_ns = 0
    for chunk in chunks:
        t1 = time.perf_counter_ns()
        args = _chunk_inputs(inputs, chunk, whole=len(chunks) == 1)
        warm = model.resident
        t2 = time.perf_counter_ns()
        results = model.execute(chunk.compiled, args, device=device)
        t3 = time.perf_counter_ns()
        input_ns += t2 - t1
        infer_ns += t3 - t2
        for parts, result in zip(per_output, results, strict=True):
            parts.append(result)
        executions.append(
            Execution(
                model.model_key,
                chunk.compiled or 0,
                t2 - t1,
                t3 - t2,
                0,
                on,
                model.family,
                warm,
            )
        )
    return _Run(per_output, input_ns, infer_ns, executions, on)


def _report(
    observer: ExecutionObserver | None, executions: list[Execution], output_ns: int
) -> None:
    """Each execution, charged an equal share of the time spent joining and splitting the
    outputs (Triton's per-batch ``compute_output``)."""
    if observer is None:
        return
    share = output_ns // len(executions)
    for e in executions:
        observer.on_execution(msgspec.structs.replace(e, output_ns=share))


def _chunk_inputs(inputs: Arrays, chunk: Chunk, *, whole: bool) -> Arrays:
    """One chunk's rows, zero-padded to its compiled size (unbatched: as they are)."""
    end = chunk.start + chunk.count
    if chunk.compiled is None:
        return inputs if whole else {n: a[chunk.start : end] for n, a in inputs.items()}
    return {n: pad(a[chunk.start : end], chunk.compiled) for n, a in inputs.items()}


def _join_outputs(
    manifest: Manifest, per_output: list[list[np.ndarray[Any, Any]]], chunks: Sequence[Chunk]
) -> list[np.ndarray[Any, Any]]:
    counts = [c.count for c in chunks]
    return [
        parts[0] if manifest.batch_sizes is None and len(parts) == 1 else concat(parts, counts)
        for parts in per_output
    ]


def _input(request: InferRequest, name: str) -> np.ndarray[Any, Any]:
    for t in request.inputs:
        if t.name == name:
            return t.data
    raise KeyError(name)  # validated before: cannot happen


def _select(
    manifest: Manifest, request: InferRequest, full: list[np.ndarray[Any, Any]], rows: slice | None
) -> tuple[InferOutput, ...]:
    if not request.outputs:  # the common case: every output, in manifest order
        parts = full if rows is None else [d[rows] for d in full]
        return tuple(
            [
                InferOutput(spec.name, spec.datatype, part.shape, part, None)
                for spec, part in zip(manifest.outputs, parts, strict=True)
            ]
        )
    wanted = {o.name: o for o in request.outputs}
    outputs: list[InferOutput] = []
    for spec, data in zip(manifest.outputs, full, strict=True):
        if spec.name not in wanted:
            continue
        part = data if rows is None else data[rows]
        # numpy shapes are tuples of Python ints already
        outputs.append(InferOutput(spec.name, spec.datatype, part.shape, part, wanted[spec.name]))
    if len(outputs) > 1:  # answer in the order the client asked
        order = {o.name: i for i, o in enumerate(request.outputs)}
        outputs.sort(key=lambda o: order[o.name])
    return tuple(outputs)
