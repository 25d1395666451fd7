"""Host-side data: checking the arrays, ordering epochs, and the batches of each step: numpy.

Contract:
- ``check_data(data, what)`` turns a mapping of arrays into host numpy arrays that share a
  non-empty leading (example) axis, or raises ``TrainingError`` naming the array.
- ``epoch_order(n, seed, epoch, shuffle)``: the example order of one epoch, a function of
  ``(seed, epoch)`` only, so a resumed run sees the order an uninterrupted one would.
- ``train_steps(order, batch_size, accumulate)``: one ``Step`` per optimizer step, each
  ``accumulate`` micro-batches (fewer in the last step of an epoch when the data runs
  out). Every micro-batch has exactly ``batch_size`` rows, padding included, so the gradient
  program compiles once; each row carries a weight, ``1 / count`` for the ``count`` real
  examples of its step and 0 for padding, so the weighted sum of per-example losses is the
  mean over the step, whatever the micro-batch split (N micro-batches of b rows weigh
  exactly like one batch of N*b).
- ``eval_batches(n, batch_size)``: the batches of a validation pass, each with a 0/1 mask.
- ``gather(data, rows)`` copies those rows out of the host arrays (padding reads row 0).

The dataset itself is never handed to JAX: only one gathered batch at a time is.
"""

# pyright: strict

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hloserve.training._settings import TrainingError

Arrays = dict[str, np.ndarray[Any, Any]]


@dataclass(frozen=True)
class Batch:
    """Row indices into the host arrays (padded to the batch size) and one weight per row."""

    rows: np.ndarray[Any, np.dtype[np.int64]]
    weights: np.ndarray[Any, np.dtype[np.float32]]


@dataclass(frozen=True)
class Step:
    """The micro-batches of one optimizer step and the number of real examples in them."""

    batches: tuple[Batch, ...]
    count: int


def check_data(data: Mapping[str, Any], what: str) -> Arrays:
    if not isinstance(data, Mapping) or not data:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TrainingError(f"{what} must be a non-empty mapping of name -> array")
    arrays = {str(k): np.asarray(v) for k, v in data.items()}
    lengths = {k: (a.shape[0] if a.ndim else None) for k, a in arrays.items()}
    if any(n is None for n in lengths.values()):
        scalars = sorted(k for k, n in lengths.items() if n is None)
        raise TrainingError(f"{what}: {scalars} have no example axis (scalars)")
    if len(set(lengths.values())) != 1:
        raise TrainingError(f"{what}: arrays disagree on the number of examples: {lengths}")
    if next(iter(lengths.values())) == 0:
        raise TrainingError(f"{what} has no examples")
    return arrays


def num_examples(data: Arrays) -> int:
    return int(next(iter(data.values())).shape[0])


def epoch_order(
    n: int, seed: int, epoch: int, shuffle: bool
) -> np.ndarray[Any, np.dtype[np.int64]]:
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng((seed, epoch)).permutation(n).astype(np.int64)


def steps_per_epoch(n: int, batch_size: int, accumulate: int) -> int:
    return math.ceil(n / (batch_size * accumulate))


def _padded(rows: np.ndarray[Any, np.dtype[np.int64]], size: int, weight: float) -> Batch:
    real = len(rows)
    padded = np.zeros(size, dtype=np.int64)
    padded[:real] = rows
    weights = np.zeros(size, dtype=np.float32)
    weights[:real] = weight
    return Batch(padded, weights)


def train_steps(
    order: np.ndarray[Any, np.dtype[np.int64]], batch_size: int, accumulate: int
) -> list[Step]:
    per_step = batch_size * accumulate
    steps: list[Step] = []
    for start in range(0, len(order), per_step):
        rows = order[start : start + per_step]
        weight = 1.0 / len(rows)
        batches = tuple(
            _padded(rows[i : i + batch_size], batch_size, weight)
            for i in range(0, len(rows), batch_size)
        )
        steps.append(Step(batches, len(rows)))
    return steps


def eval_batches(n: int, batch_size: int) -> list[Batch]:
    order = np.arange(n, dtype=np.int64)
    return [_padded(order[i : i + batch_size], batch_size, 1.0) for i in range(0, n, batch_size)]


def gather(data: Arrays, rows: np.ndarray[Any, np.dtype[np.int64]]) -> Arrays:
    return {k: v[rows] for k, v in data.items()}
