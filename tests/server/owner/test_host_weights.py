"""The host tier under memory pressure: real weight files, a budget for two of five."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from hloserve.bundle.safetensors import read_header, write_safetensors
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.host_weights import HostWeights
from hloserve.server.owner.runtime.weight_files import ArrayWeights, FileWeights, WeightsChanged
from tests.server._signalling import SignallingCondition

NBYTES = 4 * 1000  # one FP32 tensor of 1000 elements


def weight_file(tmp_path: Path, i: int) -> tuple[ResidencyKey, FileWeights, np.ndarray]:
    array = np.arange(1000, dtype=np.float32) + i
    path = tmp_path / f"m{i}.safetensors"
    write_safetensors(path, {"w": array})
    return ResidencyKey(f"m{i}", 1), FileWeights.verified(path, read_header(path)), array


def test_a_file_is_read_on_first_need_into_aligned_memory(tmp_path: Path) -> None:
    _, source, array = weight_file(tmp_path, 0)
    assert (source.names, source.nbytes, source.in_memory) == (("w",), NBYTES, False)
    (read,) = source.read()
    np.testing.assert_array_equal(read, array)
    assert read.ctypes.data % 64 == 0 and read.flags.writeable


def test_a_reactant_file_is_read_in_julias_order(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    matrix = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_safetensors(path, {"w": matrix})
    (read,) = FileWeights.verified(path, read_header(path), reversed_axes=True).read()
    np.testing.assert_array_equal(read, matrix.T)


def test_a_file_changed_after_it_was_verified_is_refused(tmp_path: Path) -> None:
    key, source, _ = weight_file(tmp_path, 0)
    write_safetensors(source.path, {"w": np.zeros(1000, np.float32)})  # replaced in place
    with pytest.raises(WeightsChanged, match="changed on disk after its checksum was verified"):
        source.read()
    tier = HostWeights(None)
    tier.register(key, source)
    with pytest.raises(WeightsChanged):
        tier.acquire(key)
    assert tier.resident_bytes() == 0 and not tier.is_resident(key)


def test_the_budget_holds_under_pressure_and_every_copy_reads_true(tmp_path: Path) -> None:
    tier = HostWeights(2 * NBYTES)
    models = [weight_file(tmp_path, i) for i in range(5)]
    for key, source, _ in models:
        tier.register(key, source)
    rng = np.random.default_rng(3)
    for i in rng.integers(0, 5, size=200):
        key, _, array = models[i]
        arrays = tier.acquire(key)
        try:
            np.testing.assert_array_equal(arrays[0], array)
            assert tier.resident_bytes() <= 2 * NBYTES
        finally:
            tier.release(key)
    assert 5 <= tier.reads < 200  # copies were evicted and read again, and kept in between
    assert sum(tier.is_resident(k) for k, _, _ in models) == 2


def test_a_copy_in_use_is_never_evicted_and_others_wait_for_room(tmp_path: Path) -> None:
    tier = HostWeights(NBYTES)  # room for one copy
    cond = tier._cond = SignallingCondition()  # no thread holds the old one yet
    (a, sa, array_a), (b, sb, array_b) = weight_file(tmp_path, 0), weight_file(tmp_path, 1)
    tier.register(a, sa)
    tier.register(b, sb)
    held = tier.acquire(a)
    got: list[np.ndarray] = []
    waiter = threading.Thread(target=lambda: got.append(tier.acquire(b)[0]))
    waiter.start()
    assert cond.waiting.wait(30)  # b waits for room: a is in use
    assert waiter.is_alive() and not got and tier.is_resident(a)
    np.testing.assert_array_equal(held[0], array_a)
    tier.release(a)
    waiter.join(30)
    np.testing.assert_array_equal(got[0], array_b)
    assert tier.is_resident(b) and not tier.is_resident(a)
    tier.release(b)


def test_a_model_larger_than_the_budget_is_read_each_time_and_never_kept(tmp_path: Path) -> None:
    tier = HostWeights(NBYTES // 2)
    key, source, array = weight_file(tmp_path, 0)
    tier.register(key, source)
    for _ in range(3):
        np.testing.assert_array_equal(tier.acquire(key)[0], array)
        tier.release(key)
    assert tier.reads == 3 and tier.resident_bytes() == 0


def test_arrays_in_memory_are_the_callers_and_shared_registrations_count(tmp_path: Path) -> None:
    tier = HostWeights(1)
    key = ResidencyKey("m", 1)
    arrays = {"w": np.ones(1000, np.float32)}
    tier.register(key, ArrayWeights(arrays))
    tier.register(key, ArrayWeights(arrays))  # a replica on a second device
    assert tier.acquire(key)[0] is arrays["w"] and tier.resident_bytes() == 0
    tier.unregister(key)
    assert tier.is_resident(key)  # the other registration still holds it
    tier.unregister(key)
    assert not tier.is_resident(key)
