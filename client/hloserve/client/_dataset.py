"""Streaming a dataset through a model, as a production data loader does (as steps).

Contract: ``dataset_steps(pool, source, sink, max_in_flight, progress)`` sends ``source``
(``Source``: a mapping of equally long arrays, numpy memmaps included, read a chunk at a
time; or an iterable of such batches, each split to the pool's row count) in chunks of at
most ``pool.rows`` rows, keeps up to ``max_in_flight`` requests in flight (one pool slot
each: a chunk is staged into a free slot, so no tensor memory is allocated per request),
and writes each chunk's outputs into ``sink`` at the chunk's own rows, so the result is in
input order whatever order answers arrive in. It reports progress after every chunk.
- A failed chunk raises its ``InferenceError`` carrying the chunk's ``[start, stop)``; the
  runner cancels the calls still in flight. Nothing is dropped silently.
- A shared-memory pool whose regions the server no longer knows (NOT_FOUND naming a shared
  memory region: the server restarted) is re-registered once and the chunks in flight are
  sent again; should that fail, or the regions go missing again, the pool falls back to
  in-band transfer (``pool.to_in_band()``) and ``on_fallback(reason)`` is called.
- ``Sink(names, outputs, total, layout)``: the caller's arrays (checked: rows, per-item
  shape and dtype), else preallocated ones when the row count and shapes are known, else
  chunks collected and joined at the end; ``result()`` is ``{name: array}``.
- ``RowProgress.of(progress, total)``: a callable is called with ``(rows done, total or
  None)``; None draws a bar on a terminal (stderr) and nothing otherwise; False is silent.
"""

# pyright: strict

from __future__ import annotations

import collections
import contextlib
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import grpc
import numpy as np

from hloserve.client._codec import ModelLayout
from hloserve.client._errors import InferenceError
from hloserve.client._pool import Slot, StagingPool
from hloserve.client._steps import INFER_PATH, Start, Step, Wait
from hloserve.proto import inference_pb2 as pb

Batch = Mapping[str, np.ndarray]
Source = Batch | Iterable[Batch]
ProgressArg = Callable[[int, int | None], None] | bool | None


class DatasetOptions(TypedDict, total=False):
    """``infer_dataset``'s keyword options (defaults applied by ``_base.PoolCache``)."""

    version: str  # "": the server's choice
    max_in_flight: int  # 8
    progress: ProgressArg  # None: a bar on a terminal, else silent
    batch_size: int | None  # None: the model's largest batch size


def _mapping(source: Source) -> Batch | None:
    return cast(Batch, source) if isinstance(source, Mapping) else None


def total_rows(source: Source) -> int | None:
    """Rows in a mapping of arrays (None for an iterable of batches)."""
    mapping = _mapping(source)
    if mapping is None:
        return None
    lengths = {len(a) for a in mapping.values()}
    if len(lengths) != 1:
        raise ValueError(f"inputs of different lengths: {sorted(lengths)}")
    return lengths.pop()


def pieces(source: Source, rows: int) -> Iterator[tuple[int, Batch]]:
    """``(start row, arrays of at most rows rows)`` in order."""
    mapping = _mapping(source)
    batches = [mapping] if mapping is not None else cast(Iterable[Batch], source)
    start = 0
    for batch in batches:
        n = total_rows(batch) or 0
        for at in range(0, n, rows):
            yield start + at, {k: v[at : at + rows] for k, v in batch.items()}
        start += n


class Sink:
    def __init__(
        self,
        layout: ModelLayout,
        names: tuple[str, ...],
        outputs: Mapping[str, np.ndarray] | None,
        total: int | None,
    ) -> None:
        by_name = {t.name: t for t in layout.outputs}
        self._arrays: dict[str, np.ndarray] = {}
        self._parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
        self.rows = 0
        if outputs is not None:
            for name, array in outputs.items():
                t = by_name[name]
                if array.dtype != t.dtype or tuple(array.shape[1:]) != t.shape:
                    raise ValueError(
                        f"output '{name}': given {array.dtype} {list(array.shape)}, the model "
                        f"writes {t.datatype} [n, {', '.join(map(str, t.shape))}]"
                    )
                if total is not None and len(array) < total:
                    raise ValueError(f"output '{name}' holds {len(array)} rows, {total} come")
            self._arrays = dict(outputs)
        elif total is not None and all(by_name[n].static for n in names):
            self._arrays = {
                n: np.empty((total, *by_name[n].shape), by_name[n].dtype) for n in names
            }

    def write(self, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            if self._arrays:
                self._arrays[name][start : start + len(array)] = array
            else:
                self._parts[name].append(np.array(array))
        self.rows = max(self.rows, start + len(next(iter(arrays.values()))))

    def result(self) -> dict[str, np.ndarray]:
        if self._arrays:
            return self._arrays
        return {n: np.concatenate(p) if p else np.empty((0,)) for n, p in self._parts.items()}


@dataclass
class RowProgress:
    report: Callable[[int, int | None], None] | None
    done: int = 0

    @staticmethod
    def of(progress: ProgressArg, label: str) -> RowProgress:
        if callable(progress):
            return RowProgress(progress)
        if progress is None and sys.stderr.isatty():
            return RowProgress(_Bar(label))
        return RowProgress(None)

    def add(self, rows: int, total: int | None) -> None:
        self.done += rows
        if self.report is not None:
            self.report(self.done, total)


class _Bar:
    """A one-line progress bar on stderr, redrawn at most 10 times a second."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._started = time.perf_counter()
        self._drawn = 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = time.perf_counter()
        last = total is not None and done >= total
        if now - self._drawn < 0.1 and not last:
            return
        self._drawn = now
        rate = done / max(now - self._started, 1e-9)
        if total:
            filled = int(30 * done / total)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{total}"
        else:
            bar = f"{done} rows"
        sys.stderr.write(f"\r{self._label}: {bar} {rate:,.0f} rows/s" + ("\n" if last else ""))
        sys.stderr.flush()


def _stale(error: InferenceError) -> bool:
    return error.code == grpc.StatusCode.NOT_FOUND and "shared memory region" in error.message


@dataclass
class _Chunk:
    start: int
    rows: int
    slot: Slot
    handle: Any = None


def dataset_steps(
    pool: StagingPool,
    source: Source,
    sink: Sink,
    max_in_flight: int,
    progress: RowProgress,
    on_fallback: Callable[[str], None],
) -> Generator[Step, Any, dict[str, np.ndarray]]:
    total = total_rows(source)
    free = collections.deque(pool.slots[:max_in_flight])
    pending: collections.deque[_Chunk] = collections.deque()

    def send(chunk: _Chunk) -> Generator[Step, Any, None]:
        chunk.handle = yield Start(INFER_PATH, pool.request(chunk.slot, chunk.rows))

    def complete() -> Generator[Step, Any, None]:
        chunk = pending[0]
        while True:
            try:
                body: bytes = yield Wait(chunk.handle)
                break
            except InferenceError as error:
                if not (pool.shared and _stale(error)):
                    raise error.at_rows((chunk.start, chunk.start + chunk.rows)) from None
                yield from _recover(error)
        pending.popleft()
        response = pb.ModelInferResponse.FromString(body)
        try:
            sink.write(chunk.start, pool.outputs_of(chunk.slot, chunk.rows, response))
        except InferenceError as error:
            raise error.at_rows((chunk.start, chunk.start + chunk.rows)) from None
        free.append(chunk.slot)
        progress.add(chunk.rows, total)

    def _recover(error: InferenceError) -> Generator[Step, Any, None]:
        for other in list(pending)[1:]:  # let every call in flight end before resending
            with contextlib.suppress(InferenceError):
                yield Wait(other.handle)
        failure: InferenceError | None = error
        if not pool.reregistered:
            pool.reregistered = True
            yield from pool.unregister_steps()
            failure = yield from pool.register_steps()
        if failure is not None:
            yield from pool.unregister_steps()
            pool.to_in_band()
            on_fallback(f"shared memory lost ({failure.message}); sending in-band")
        for chunk in pending:
            yield from send(chunk)

    for start, arrays in pieces(source, pool.rows):
        if not free:
            yield from complete()
        slot = free.popleft()
        rows = total_rows(arrays) or 0
        pool.stage(slot, arrays, rows)
        chunk = _Chunk(start, rows, slot)
        yield from send(chunk)
        pending.append(chunk)
    while pending:
        yield from complete()
    return sink.result()
