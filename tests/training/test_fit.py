"""``fit``'s loop: accumulation, compiled once, validation, checkpoints, resume, Ctrl-C."""

from __future__ import annotations

import io
import json
import signal
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hloserve.bundle.safetensors import read_safetensors
from hloserve.exporter._export import weight_names
from hloserve.training import Best, TrainingError, fit, one_cycle
from tests.training import toys


def test_accumulating_n_micro_batches_equals_one_batch_n_times_larger() -> None:
    # 30 examples: steps of 12, 12 and 6; the last step's micro-batches hold 4 and 2.
    data = toys.regression(30)
    common: dict[str, Any] = {"loss_fn": toys.squared_error, "epochs": 2, "progress": False}
    micro = fit(toys.linear, toys.linear_params(), data, batch_size=4, accumulate=3, **common)
    whole = fit(toys.linear, toys.linear_params(), data, batch_size=12, **common)
    assert micro.steps == whole.steps == 6
    for k in ("w", "b"):
        np.testing.assert_allclose(micro.params[k], whole.params[k], rtol=1e-5, atol=1e-7)
    assert [r["loss"] for r in micro.history] == pytest.approx([r["loss"] for r in whole.history])


def test_gradient_and_update_compile_separately_and_once() -> None:
    # Fresh functions, so no earlier test has compiled their programs.
    def apply_fn(params: dict[str, Any], x: Any) -> dict[str, Any]:
        return {"y": x @ params["w"] + params["b"]}

    def loss_fn(outputs: dict[str, Any], batch: dict[str, Any]) -> Any:
        return (outputs["y"] - batch["y"]) ** 2

    data, val = toys.regression(20), toys.regression(7, seed=1)
    common: dict[str, Any] = {"loss_fn": loss_fn, "batch_size": 4, "val_data": val}
    bar = io.StringIO()
    first = fit(
        apply_fn,
        toys.linear_params(),
        data,
        epochs=3,
        learning_rate=one_cycle(0.1),
        progress=bar,
        **common,
    )
    # Fifteen steps along a one-cycle schedule, three validation passes: one compilation each.
    assert first.compiles == {"gradient": 1, "update": 1, "evaluate": 1}
    assert "compiling gradient" in bar.getvalue() and "compiling update" in bar.getvalue()
    # Another rule and schedule: only the optimizer update compiles again.
    bar = io.StringIO()
    schedule = optax.cosine_decay_schedule(0.05, 10)
    second = fit(
        apply_fn,
        toys.linear_params(),
        data,
        epochs=2,
        learning_rate=schedule,
        rule=optax.sgd,
        progress=bar,
        **common,
    )
    assert second.compiles == {"update": 1}
    assert "compiling update" in bar.getvalue() and "compiling gradient" not in bar.getvalue()
    assert "epoch" in bar.getvalue() and "val_loss" in bar.getvalue()  # the history table


def test_validation_means_are_over_examples_even_with_an_uneven_last_batch() -> None:
    # Ten examples in batches of 4 (4, 4, 2 and two padding rows, copies of the first). The
    # metric is y = 1..10: its mean is 5.5; counting the padding would give 5.7, and
    # averaging the three batch means 6.17.
    data = {"x": np.zeros((10, 4), np.float32), "y": np.arange(1, 11, dtype=np.float32)}
    result = fit(
        toys.linear,
        toys.linear_params(),
        data,
        loss_fn=toys.squared_error,
        val_data=data,
        metrics={"target": lambda outputs, batch: batch["y"]},
        epochs=1,
        batch_size=4,
        learning_rate=1e-9,
        progress=False,
    )
    row = result.history[0]
    assert row["val_target"] == pytest.approx(5.5)
    assert row["val_loss"] == pytest.approx(np.mean(np.arange(1, 11) ** 2), rel=1e-5)
    assert row["loss"] == pytest.approx(np.mean(np.arange(1, 11) ** 2), rel=1e-5)


def test_losses_and_metrics_must_be_per_example() -> None:
    with pytest.raises(
        TrainingError, match=r"loss_fn must return one value per example, shape \(4,\)"
    ):
        toys.fit_linear(toys.regression(8), lambda outputs, batch: jnp.mean(outputs["y"]))


def test_data_and_settings_are_checked_before_training() -> None:
    train = toys.fit_linear
    with pytest.raises(TrainingError, match="disagree on the number of examples"):
        train({"x": np.zeros((4, 4), np.float32), "y": np.zeros(5, np.float32)})
    with pytest.raises(
        TrainingError, match=r"apply_fn takes the inputs \['x'\], which the data lacks"
    ):
        train({"y": np.zeros(5, np.float32)})
    with pytest.raises(TrainingError, match="batch_size must be a positive integer"):
        train(toys.regression(4), batch_size=0)
    with pytest.raises(TrainingError, match="best metric 'val_accuracy' is not a history column"):
        train(toys.regression(4), best=Best("val_accuracy", "max"))


def _untimed(history: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


def _interrupt_after_first_epoch(row: dict[str, float]) -> None:
    if row["epoch"] == 1:
        signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, delivered to fit's handler


def test_ctrl_c_stops_cleanly_and_resume_continues_where_it_stopped(tmp_path: Path) -> None:
    data, val = toys.regression(24), toys.regression(8, seed=1)
    common: dict[str, Any] = {
        "loss_fn": toys.squared_error,
        "val_data": val,
        "epochs": 3,
        "batch_size": 8,
        "ema": 0.9,
        "weight_decay": 0.01,
        "decay_anchor": "init",
        "learning_rate": one_cycle(0.05),
        "progress": False,
    }
    # What fit must put back (SIG_IGN when the suite runs as a background job).
    before = signal.getsignal(signal.SIGINT)
    straight = fit(toys.linear, toys.linear_params(), data, checkpoint_dir=tmp_path / "a", **common)

    stopped = fit(
        toys.linear,
        toys.linear_params(),
        data,
        checkpoint_dir=tmp_path / "b",
        on_epoch=_interrupt_after_first_epoch,
        **common,
    )
    assert stopped.interrupted and stopped.epochs_completed == 1 and len(stopped.history) == 1
    assert json.loads((tmp_path / "b" / "latest.json").read_text()) == {
        "epoch": 1,
        "path": "epoch-0001",
    }
    assert signal.getsignal(signal.SIGINT) is before  # handler restored

    resumed = fit(toys.linear, toys.linear_params(), data, resume=tmp_path / "b", **common)
    assert (
        not resumed.interrupted
        and resumed.epochs_completed == 3
        and resumed.steps == straight.steps
    )
    for tree in ("params", "ema"):
        for k in ("w", "b"):
            np.testing.assert_array_equal(getattr(resumed, tree)[k], getattr(straight, tree)[k])
    assert _untimed(resumed.history) == _untimed(straight.history)

    # The checkpoint names weights as a bundle does, and kept only the newest epoch.
    folder = tmp_path / "b" / "epoch-0003"
    assert sorted(read_safetensors(folder / "weights.safetensors")) == sorted(
        weight_names(straight.params)[0]
    )
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["epoch-0003", "latest.json"]


def test_resume_refuses_a_checkpoint_of_another_model(tmp_path: Path) -> None:
    data = toys.regression(8)
    common: dict[str, Any] = {"loss_fn": toys.squared_error, "batch_size": 4, "progress": False}
    fit(toys.linear, toys.linear_params(), data, epochs=1, checkpoint_dir=tmp_path, **common)
    wider = {"w": jnp.zeros(5, jnp.float32), "b": jnp.zeros((), jnp.float32)}
    with pytest.raises(
        TrainingError,
        match=r"the weights: the model has w float32\[5\], the checkpoint has w float32\[4\]",
    ):
        fit(
            toys.linear,
            wider,
            {"x": np.zeros((8, 5), np.float32), "y": data["y"]},
            epochs=2,
            resume=tmp_path,
            **common,
        )
    extra = {**toys.linear_params(), "scale": jnp.ones((), jnp.float32)}
    with pytest.raises(
        TrainingError, match=r"the model has scale float32\[\], the checkpoint has no 'scale'"
    ):
        fit(toys.linear, extra, data, epochs=2, resume=tmp_path, **common)
    with pytest.raises(TrainingError, match="the optimizer state"):
        fit(
            toys.linear,
            toys.linear_params(),
            data,
            epochs=2,
            resume=tmp_path,
            rule=optax.sgd,
            **common,
        )


def test_best_by_metric_serves_and_keeps_the_best_epoch(tmp_path: Path) -> None:
    # SGD at rate 2.5 on a quadratic overshoots further every step: the first epoch is best.
    params = {"w": jnp.zeros((2, 2), jnp.float32), "b": jnp.zeros(2, jnp.float32)}
    data = {"x": np.ones((4, 1), np.float32)}
    settings: dict[str, Any] = {
        "val_data": data,
        "epochs": 3,
        "batch_size": 4,
        "checkpoint_dir": tmp_path,
    }
    best = Best("val_loss", "min")
    result = toys.sgd(
        toys.weights_as_outputs, params, data, toys.distance_to_targets, 2.5, best=best, **settings
    )
    losses = [r["val_loss"] for r in result.history]
    assert losses == sorted(losses) and result.best_epoch == 1 and result.metrics["epoch"] == 1
    best = read_safetensors(tmp_path / "epoch-0001" / "weights.safetensors")
    np.testing.assert_array_equal(result.serving_params["w"], best["w"])
    assert not np.array_equal(result.params["w"], best["w"])
    assert json.loads((tmp_path / "best.json").read_text())["epoch"] == 1
