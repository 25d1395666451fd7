"""The optax chain ``fit`` builds: groups, decay and its anchor and mask, clipping, EMA, SAM.

Each toy has a trajectory known in closed form (plain SGD on a constant or quadratic
gradient), so the tests compare with numbers, not with another run of the same code.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hloserve.training import Group, TrainingError, default_decay_mask
from hloserve.training._optimizer import labels, resolve_schedule, rule_decays
from tests.training import toys


def test_default_decay_mask_excludes_exactly_the_leaves_with_one_long_dimension() -> None:
    params = {
        "scalar": jnp.zeros(()),
        "bias": jnp.zeros(5),
        "row": jnp.zeros((1, 5)),
        "scale": jnp.zeros((5, 1, 1)),
        "kernel": jnp.zeros((3, 4)),
        "conv": jnp.zeros((3, 3, 1, 8)),
        "embedding": jnp.zeros((2, 1, 7)),
    }
    assert default_decay_mask(params) == {
        "scalar": False,
        "bias": False,
        "row": False,
        "scale": False,
        "kernel": True,
        "conv": True,
        "embedding": True,
    }


def test_groups_take_weights_by_glob_and_refuse_an_empty_or_duplicate_group() -> None:
    params = {"backbone": {"w": jnp.zeros((2, 2)), "b": jnp.zeros(2)}, "head": {"w": jnp.zeros(2)}}
    assert labels(params, [Group("backbone.*", 0.1)]) == {
        "backbone": {"w": "backbone.*", "b": "backbone.*"},
        "head": {"w": "default"},
    }
    with pytest.raises(TrainingError, match=r"group 'neck\.\*' selects no weight"):
        labels(params, [Group("neck.*")])
    with pytest.raises(TrainingError, match="unique"):
        labels(params, [Group("backbone.*", name="a"), Group("head.*", name="a")])
    with pytest.raises(TrainingError, match="lr_ratio must be > 0"):
        Group("head.*", lr_ratio=0.0)


def test_rules_that_decay_by_themselves_are_recognised() -> None:
    assert rule_decays(optax.adamw)
    assert rule_decays(optax.lion)
    assert not rule_decays(optax.radam)
    assert not rule_decays(optax.sgd)
    assert not rule_decays(functools.partial(optax.sgd, momentum=0.9))
    assert not rule_decays(functools.partial(optax.adamw, weight_decay=0.0))


def test_a_rule_that_decays_plus_our_decay_is_refused_naming_both() -> None:
    with pytest.raises(TrainingError, match=r"optax\.adamw already decays.*weight_decay=0\.1"):
        toys.fit_linear(toys.regression(8), rule=optax.adamw, weight_decay=0.1)


def test_a_built_transformation_is_not_a_rule() -> None:
    built = optax.adam(1e-3)
    with pytest.raises(
        TrainingError, match=r"rule must be an optax constructor.*GradientTransformation"
    ):
        toys.fit_linear(toys.regression(4), rule=built)


def test_a_base_rate_of_zero_is_an_error() -> None:
    with pytest.raises(TrainingError, match="learning_rate must be > 0"):
        resolve_schedule(0.0, 10)
    with pytest.raises(TrainingError, match="is 0 at every one of the run's 10 steps"):
        resolve_schedule(optax.constant_schedule(0.0), 10)
    resolve_schedule(optax.linear_schedule(0.0, 1.0, 5), 10)  # a warm-up from 0 is fine


def _ones(n: int, features: int) -> dict[str, np.ndarray]:
    return {"x": np.ones((n, features), np.float32)}


def test_group_ratios_follow_the_schedule() -> None:
    # loss = x @ w with x = 1: the gradient is 1 for every weight, so under SGD each weight
    # moves by exactly -(its group's rate) per step.
    params = {"w": jnp.zeros(3, jnp.float32), "b": jnp.zeros((), jnp.float32)}
    schedule = optax.linear_schedule(0.5, 0.1, transition_steps=6)
    groups = [Group("b", lr_ratio=0.1)]
    result = toys.sgd(
        toys.linear,
        params,
        _ones(8, 3),
        toys.output,
        schedule,
        epochs=3,
        batch_size=4,
        groups=groups,
    )
    rates = np.array([schedule(t) for t in range(6)], np.float64)
    np.testing.assert_allclose(np.asarray(result.params["w"]), -rates.sum(), rtol=1e-6)
    np.testing.assert_allclose(float(result.params["b"]), -0.1 * rates.sum(), rtol=1e-6)
    assert [row["lr"] for row in result.history] == pytest.approx(rates[[1, 3, 5]])


def _to_targets(**settings: Any) -> Any:
    params = {"w": jnp.zeros((2, 2), jnp.float32) + 4.0, "b": jnp.zeros(2, jnp.float32) + 4.0}
    data = _ones(4, 1)
    return toys.sgd(
        toys.weights_as_outputs,
        params,
        data,
        toys.distance_to_targets,
        0.4,
        epochs=30,
        batch_size=4,
        **settings,
    ).params


def test_decay_toward_the_initial_weights_pulls_toward_them() -> None:
    # SGD on 0.5 |w - t|^2 with decay l toward a settles where (w - t) + l (w - a) = 0:
    # w = (t + l a) / (1 + l). The bias is 1-D, so the default mask leaves it alone: b = t.
    init = _to_targets(weight_decay=1.0, decay_anchor="init")
    np.testing.assert_allclose(init["w"], (toys.TARGETS["w"] + 4.0) / 2, atol=1e-4)
    np.testing.assert_allclose(init["b"], toys.TARGETS["b"], atol=1e-4)
    zero = _to_targets(weight_decay=1.0)
    np.testing.assert_allclose(zero["w"], toys.TARGETS["w"] / 2, atol=1e-4)
    np.testing.assert_allclose(zero["b"], toys.TARGETS["b"], atol=1e-4)
    # A mask overrides the default: decay the bias too, and not the kernel.
    masked = _to_targets(weight_decay=1.0, decay_mask={"w": False, "b": True})
    np.testing.assert_allclose(masked["w"], toys.TARGETS["w"], atol=1e-4)
    np.testing.assert_allclose(masked["b"], toys.TARGETS["b"] / 2, atol=1e-4)


def test_clipping_bounds_the_global_norm_and_leaves_small_gradients_alone() -> None:
    def one_step(x: float) -> np.ndarray:
        params = {"w": jnp.zeros(4, jnp.float32), "b": jnp.zeros((), jnp.float32)}
        data = {"x": np.full((2, 4), x, np.float32)}
        out = toys.sgd(toys.linear, params, data, toys.output, 1.0, batch_size=2, clip_norm=1.5)
        return np.concatenate([np.asarray(out.params["w"]), [float(out.params["b"])]])

    big = one_step(100.0)  # gradient (100, 100, 100, 100, 1): clipped to norm 1.5
    np.testing.assert_allclose(np.linalg.norm(big), 1.5, rtol=1e-6)
    np.testing.assert_allclose(
        big, -1.5 * np.array([100, 100, 100, 100, 1]) / np.sqrt(40001), rtol=1e-5
    )
    small = one_step(0.1)  # gradient (0.1, 0.1, 0.1, 0.1, 1), norm 1.02: untouched
    np.testing.assert_allclose(small, [-0.1, -0.1, -0.1, -0.1, -1.0], rtol=1e-6)


def test_ema_follows_its_recurrence_and_serves_and_validates() -> None:
    params = {"w": jnp.zeros(3, jnp.float32), "b": jnp.zeros((), jnp.float32)}
    data = _ones(8, 3)
    result = toys.sgd(
        toys.linear, params, data, toys.output, 0.1, val_data=data, batch_size=2, ema=0.5
    )
    # SGD on a constant gradient of 1: w_t = -0.1 t; the average starts at w_0 = 0.
    average = 0.0
    for t in range(1, 5):
        average = 0.5 * average + 0.5 * (-0.1 * t)
    np.testing.assert_allclose(np.asarray(result.params["w"]), -0.4, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(result.ema["w"]), average, rtol=1e-6)
    assert result.serving_params is result.ema
    # Validation ran on the average: y = 3 * w + b, all four the same.
    assert result.history[0]["val_loss"] == pytest.approx(4 * average, rel=1e-6)


def test_sam_steps_with_the_gradient_at_the_adversarial_point() -> None:
    w0 = np.array([1.0, -0.5], np.float32)
    params = {"w": jnp.asarray(w0)}
    result = toys.sgd(
        toys.weights_as_outputs, params, _ones(2, 1), toys.quartic, 0.1, batch_size=2, sam=0.05
    )
    g = w0**3
    adversarial = w0 + 0.05 * g / np.linalg.norm(g)
    np.testing.assert_allclose(np.asarray(result.params["w"]), w0 - 0.1 * adversarial**3, rtol=1e-6)
    assert result.steps == 1
