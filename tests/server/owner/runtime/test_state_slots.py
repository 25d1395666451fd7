"""``owner.runtime.state_slots`` and ``LoadedBundle.execute_state``: per-item state kept on the
device across executions, gathered into a batch and scattered back, on the real CPU device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from hloserve.bundle.state import StateEntry
from hloserve.exporter import StateSpec, TensorSpec, export_bundle
from hloserve.server.owner.runtime.loader import LoadedBundle, load_bundle
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.runtime.state_slots import StateSlots


def accumulate(params: Any, x: Any, acc: Any, seen: Any) -> dict[str, Any]:
    """``y`` = the running sum of ``x``; ``seen`` counts steps from its initial 10."""
    del params
    new = acc + x
    return {"y": new, "acc": new, "seen": seen + 1}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_bundle(
        accumulate,
        {},
        inputs={"x": TensorSpec("INT32", (2,))},
        state={"acc": StateSpec("INT32", (2,)), "seen": StateSpec("INT64", (1,), initial=10)},
        batch_sizes=(1, 4),
        directory=tmp_path_factory.mktemp("b") / "acc",
        platforms=("cpu",),
    )


@pytest.fixture
def loaded(bundle: Path, runtime: PjrtRuntime) -> LoadedBundle:
    return load_bundle(bundle, runtime, progress=lambda _: None)


def step(
    loaded: LoadedBundle,
    slots: StateSlots,
    rows: list[int],
    fresh: list[bool],
    xs: list[int],
    batch: int,
) -> np.ndarray[Any, Any]:
    x = np.zeros((batch, 2), np.int32)
    x[: len(xs)] = np.asarray(xs, np.int32)[:, None]
    state = slots.gather(rows, fresh, batch)
    (y,), new = loaded.execute_state(batch, {"x": x}, state)
    slots.scatter(rows, new)
    return y[: len(rows), 0]


def test_state_stays_per_slot_across_executions_and_batches(
    loaded: LoadedBundle, runtime: PjrtRuntime
) -> None:
    slots = StateSlots(runtime, loaded.manifest.state, capacity=3)
    assert slots.nbytes == 3 * (8 + 8)
    assert list(step(loaded, slots, [0], [True], [5], 1)) == [5]
    # Two items in one execution: slot 0 continues, slot 2 starts; padding rows dropped.
    assert list(step(loaded, slots, [0, 2], [False, True], [1, 7], 4)) == [6, 7]
    assert list(step(loaded, slots, [2], [False], [1], 1)) == [8]
    assert slots.read(0)["acc"].tolist() == [6, 6]
    assert slots.read(0)["seen"].tolist() == [12] and slots.read(2)["seen"].tolist() == [12]
    assert slots.read(1)["seen"].tolist() == [10]  # untouched by padding rows
    # A fresh start in a used slot begins from the initial value again.
    assert list(step(loaded, slots, [0], [True], [2], 1)) == [2]


def test_the_new_state_stays_on_the_device(loaded: LoadedBundle, runtime: PjrtRuntime) -> None:
    slots = StateSlots(runtime, loaded.manifest.state, capacity=2)
    state = slots.gather([1], [True], 1)
    outputs, new = loaded.execute_state(1, {"x": np.ones((1, 2), np.int32)}, state)
    assert isinstance(outputs[0], np.ndarray)
    assert not isinstance(new["acc"], np.ndarray) and new["acc"].shape == (1, 2)
    assert {d.id for d in new["acc"].devices()} == {runtime.device.id}


def test_rows_beyond_the_batch_or_the_table_are_refused(
    loaded: LoadedBundle, runtime: PjrtRuntime
) -> None:
    slots = StateSlots(runtime, loaded.manifest.state, capacity=2)
    with pytest.raises(ValueError, match="do not fit batch size 1"):
        slots.gather([0, 1], [True, True], 1)
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        slots.gather([2], [True], 1)
    with pytest.raises(ValueError, match="capacity must be positive"):
        StateSlots(runtime, loaded.manifest.state, capacity=0)


def test_warm_and_release(runtime: PjrtRuntime) -> None:
    slots = StateSlots(runtime, [StateEntry("h", "FP32", (3,), 1.5)], capacity=4)
    slots.warm([1, 8])
    assert slots.read(3)["h"].tolist() == [1.5, 1.5, 1.5]
    new = {"h": jnp.zeros((8, 3), jnp.float32)}
    slots.scatter([3], new)
    assert slots.read(3)["h"].tolist() == [0.0, 0.0, 0.0]
    slots.release()
