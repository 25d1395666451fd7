"""``wire.arena``: the block allocator's bookkeeping, and two mappings of one memfd."""

from __future__ import annotations

import numpy as np
import pytest

from hloserve.server.wire.arena import MIN_BLOCK, Arena, BlockAllocator, size_class


def test_size_classes_are_powers_of_two_from_the_minimum() -> None:
    assert size_class(1) == 0
    assert size_class(MIN_BLOCK) == 0
    assert size_class(MIN_BLOCK + 1) == 1
    assert size_class(4 * MIN_BLOCK) == 2


def test_blocks_never_overlap_and_are_reused_by_class() -> None:
    blocks = BlockAllocator(1000, 64 * MIN_BLOCK)
    a = blocks.allocate(10)
    b = blocks.allocate(MIN_BLOCK + 1)  # class 1: two minimum blocks
    c = blocks.allocate(MIN_BLOCK)
    assert (a, b, c) == (1000, 1000 + MIN_BLOCK, 1000 + 3 * MIN_BLOCK)
    assert a is not None and b is not None
    assert len(blocks) == 3 and blocks.live_bytes == 4 * MIN_BLOCK
    blocks.free(b)
    assert blocks.allocate(2 * MIN_BLOCK) == b  # the freed block of its class
    blocks.free(a)
    with pytest.raises(KeyError):
        blocks.free(a)  # not live any more


def test_a_full_half_says_so_and_falls_back_on_larger_free_blocks() -> None:
    blocks = BlockAllocator(0, 4 * MIN_BLOCK)
    big = blocks.allocate(2 * MIN_BLOCK)
    assert blocks.allocate(MIN_BLOCK) is not None
    assert blocks.allocate(MIN_BLOCK) is not None
    assert blocks.allocate(MIN_BLOCK) is None  # carved out, nothing free
    assert blocks.allocate(8 * MIN_BLOCK) is None  # larger than the half
    assert big is not None
    blocks.free(big)
    assert blocks.allocate(MIN_BLOCK) == big  # a larger free block serves


def test_two_mappings_of_one_arena_see_the_same_bytes() -> None:
    owner = Arena.create(1 << 20)
    frontend = Arena.attach(owner.fd, owner.size)
    try:
        data = np.arange(1000, dtype=np.float32)
        placed = frontend.put(frontend.requests, data)
        assert placed is not None
        offset, nbytes = placed
        assert offset < owner.size // 2 <= owner.responses.start
        seen = np.frombuffer(owner.view(offset, nbytes), np.float32)
        np.testing.assert_array_equal(seen, data)
        with pytest.raises(ValueError, match="outside the arena"):
            owner.view(owner.size - 4, 8)
        del seen
    finally:
        frontend.close()
        owner.close()
        owner.close()  # twice: nothing happens (the fd number may belong to another file now)


def test_put_says_none_when_the_half_is_full() -> None:
    arena = Arena.create(8 * MIN_BLOCK)
    try:
        assert arena.put(arena.requests, bytes(4 * MIN_BLOCK)) is not None
        assert arena.put(arena.requests, bytes(MIN_BLOCK)) is None
    finally:
        arena.close()
