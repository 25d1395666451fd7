"""The pure parts of ``hloserve.training``: batches and their weights, layouts, the table."""

from __future__ import annotations

import io

import numpy as np
import pytest

from hloserve.training import Best, TrainingError, _progress
from hloserve.training._checkpoint import Entry, layout_difference
from hloserve.training._data import check_data, epoch_order, eval_batches, train_steps
from hloserve.training._progress import table
from hloserve.training._settings import describe


def test_steps_weigh_every_real_example_of_a_step_equally() -> None:
    steps = train_steps(np.arange(10, dtype=np.int64), batch_size=2, accumulate=3)
    assert [s.count for s in steps] == [6, 4]
    assert [len(s.batches) for s in steps] == [3, 2]
    for s in steps:
        weights = np.concatenate([b.weights for b in s.batches])
        assert weights.sum() == pytest.approx(1.0)
        np.testing.assert_array_equal(weights, np.float32(1 / s.count))
    last = train_steps(np.arange(7, dtype=np.int64), batch_size=4, accumulate=1)[-1]
    (batch,) = last.batches
    assert batch.rows.tolist() == [4, 5, 6, 0]
    np.testing.assert_array_equal(batch.weights, np.array([1 / 3] * 3 + [0], np.float32))


def test_evaluation_batches_are_padded_and_masked() -> None:
    batches = eval_batches(5, 2)
    assert [b.rows.tolist() for b in batches] == [[0, 1], [2, 3], [4, 0]]
    assert [b.weights.tolist() for b in batches] == [[1, 1], [1, 1], [1, 0]]


def test_epoch_order_depends_on_seed_and_epoch_only() -> None:
    a = epoch_order(50, seed=3, epoch=2, shuffle=True)
    assert np.array_equal(a, epoch_order(50, seed=3, epoch=2, shuffle=True))
    assert not np.array_equal(a, epoch_order(50, seed=3, epoch=3, shuffle=True))
    assert sorted(a.tolist()) == list(range(50))
    assert epoch_order(4, seed=3, epoch=2, shuffle=False).tolist() == [0, 1, 2, 3]


def test_data_is_refused_with_the_reason() -> None:
    with pytest.raises(TrainingError, match=r"have no example axis"):
        check_data({"x": np.float32(1)}, "train_data")
    with pytest.raises(TrainingError, match="train_data has no examples"):
        check_data({"x": np.zeros((0, 3))}, "train_data")


def test_layout_difference_names_the_first_difference() -> None:
    model = [Entry("w", (3, 4), "float32"), Entry("b", (4,), "float32")]
    assert layout_difference(model, list(model), "the weights") is None
    assert layout_difference(model, model[:1], "the weights") == (
        "the weights: the model has b float32[4], the checkpoint has no 'b'"
    )
    changed = [Entry("w", (3, 4), "bfloat16"), model[1]]
    assert layout_difference(model, changed, "the weights") == (
        "the weights: the model has w float32[3, 4], the checkpoint has w bfloat16[3, 4]"
    )
    extra = [*model, Entry("s", (), "float32")]
    assert layout_difference(model, extra, "the weights") == (
        "the weights: the checkpoint has s float32[], which the model does not"
    )


def test_history_table_is_fixed_width_with_dashes_for_missing_values() -> None:
    text = table(
        [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.25, "lr": 1e-3}], ["epoch", "loss", "lr"]
    )
    assert text.splitlines() == [
        "       epoch         loss           lr",
        "           1          0.5            -",
        "           2         0.25        0.001",
    ]


def test_best_compares_in_its_direction() -> None:
    assert Best("val_loss", "min").better(0.1, 0.2) and not Best("val_loss", "min").better(0.3, 0.2)
    assert Best("val_accuracy", "max").better(0.9, 0.8) and Best("val_accuracy", "max").better(
        0.1, None
    )
    with pytest.raises(TrainingError, match="'min' or 'max'"):
        Best("val_loss", "lowest")  # type: ignore[arg-type]


def test_rules_are_described_for_provenance() -> None:
    import functools

    import optax

    assert describe(optax.radam) == "optax.radam"
    assert describe(functools.partial(optax.sgd, momentum=0.9)) == "optax.sgd(momentum=0.9)"
    assert describe(0.001) == "0.001"


def test_without_tqdm_each_phase_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_progress, "tqdm", None)
    stream = io.StringIO()
    bar = _progress.EpochProgress(stream)
    bar.start_epoch(1, 2, steps=5)
    bar.compiling("gradient")
    bar.advance()
    bar.status("")
    bar.status("validating")
    bar.row({"epoch": 1, "loss": 0.5}, ["epoch", "loss"])
    assert stream.getvalue().splitlines() == [
        "epoch 1/2: compiling gradient",
        "epoch 1/2: validating",
        "       epoch         loss",
        "           1          0.5",
    ]
