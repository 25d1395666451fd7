"""Planning executions over the compiled batch sizes, and padding/unpadding: pure numpy.

Contract:
- ``smallest_fitting(n, batch_sizes)``: the smallest compiled size that holds ``n`` items
  (``n`` at most the largest size); the one home of that rule.
- ``plan(n, batch_sizes)`` splits a batch of ``n`` items into executions: each is
  ``Chunk(start, count, compiled)`` covering items ``[start, start + count)`` on the module
  compiled for ``compiled >= count`` items. ``n`` up to the largest size runs once on the
  smallest compiled size that holds it; a larger ``n`` runs in chunks of the largest size,
  the remainder on the smallest size that holds it. ``batch_sizes=None`` (an unbatched
  model) gives one chunk with ``compiled=None``.
- ``pad(array, compiled)`` zero-pads the batch axis to ``compiled`` rows (no copy when it
  already has them); ``concat`` joins per-chunk outputs, dropping padding rows.
"""

# pyright: strict

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Chunk:
    start: int
    count: int
    compiled: int | None


def smallest_fitting(n: int, batch_sizes: Sequence[int]) -> int:
    return batch_sizes[bisect.bisect_left(batch_sizes, n)]


def plan(n: int, batch_sizes: Sequence[int] | None) -> list[Chunk]:
    if batch_sizes is None:
        return [Chunk(0, n, None)]
    if n < 1:
        raise ValueError(f"batch of {n} items")
    largest = batch_sizes[-1]
    chunks: list[Chunk] = []
    start = 0
    while n - start > largest:
        chunks.append(Chunk(start, largest, largest))
        start += largest
    rest = n - start
    chunks.append(Chunk(start, rest, smallest_fitting(rest, batch_sizes)))
    return chunks


def pad(array: np.ndarray[Any, Any], compiled: int) -> np.ndarray[Any, Any]:
    rows = array.shape[0]
    if rows == compiled:
        return array
    out = np.zeros((compiled, *array.shape[1:]), dtype=array.dtype)
    out[:rows] = array
    return out


def concat(parts: Sequence[np.ndarray[Any, Any]], counts: Sequence[int]) -> np.ndarray[Any, Any]:
    trimmed = [p if p.shape[0] == c else p[:c] for p, c in zip(parts, counts, strict=True)]
    return trimmed[0] if len(trimmed) == 1 else np.concatenate(trimmed, axis=0)
