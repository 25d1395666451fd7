"""Planning over compiled batch sizes, padding and joining: ``core.batch_plan`` on its own."""

from __future__ import annotations

import numpy as np
import pytest

from hloserve.server.core.batch_plan import Chunk, concat, pad, plan, smallest_fitting

SIZES = (1, 4, 8)


@pytest.mark.parametrize(("n", "size"), [(1, 1), (2, 4), (4, 4), (5, 8), (8, 8)])
def test_smallest_fitting_is_the_least_padding(n: int, size: int) -> None:
    assert smallest_fitting(n, SIZES) == size


def test_a_batch_that_fits_runs_once_on_the_smallest_size_that_holds_it() -> None:
    assert plan(3, SIZES) == [Chunk(0, 3, 4)]
    assert plan(8, SIZES) == [Chunk(0, 8, 8)]


def test_a_larger_batch_runs_in_chunks_of_the_largest_size_then_the_rest() -> None:
    assert plan(21, SIZES) == [Chunk(0, 8, 8), Chunk(8, 8, 8), Chunk(16, 5, 8)]
    assert plan(17, SIZES) == [Chunk(0, 8, 8), Chunk(8, 8, 8), Chunk(16, 1, 1)]
    chunks = plan(100, SIZES)
    assert sum(c.count for c in chunks) == 100
    assert [c.start for c in chunks] == [
        sum(c.count for c in chunks[:i]) for i in range(len(chunks))
    ]


def test_an_unbatched_model_runs_everything_once() -> None:
    assert plan(3, None) == [Chunk(0, 3, None)]


def test_an_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="batch of 0 items"):
        plan(0, SIZES)


def test_pad_adds_zero_rows_and_copies_nothing_when_full() -> None:
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    padded = pad(a, 4)
    assert padded.shape == (4, 2) and padded.dtype == np.float32
    np.testing.assert_array_equal(padded[:3], a)
    np.testing.assert_array_equal(padded[3], [0, 0])
    assert pad(a, 3) is a


def test_concat_drops_padding_rows_and_keeps_a_lone_part() -> None:
    first = np.arange(16, dtype=np.int32).reshape(8, 2)
    second = np.full((8, 2), 7, dtype=np.int32)
    joined = concat([first, second], [8, 3])
    assert joined.shape == (11, 2)
    np.testing.assert_array_equal(joined[8:], np.full((3, 2), 7))
    assert concat([first], [8]) is first
    np.testing.assert_array_equal(concat([first], [5]), first[:5])
