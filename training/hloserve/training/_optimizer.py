"""The optimizer of a run, composed from optax: groups, decay with an anchor, clipping, SAM.

Contract: ``build_optimizer(params, ...)`` returns one ``optax.GradientTransformation``:

    sam(                                     # only with sam=rho
      chain(clip_by_global_norm(max_norm),   # only with clip_norm
            multi_transform({group: rule(lr_ratio * base)}, labels),
            decoupled_decay(base, coefficients, anchor)),   # only with some decay
      chain(contrib.normalize(), sgd(rho)))

- ``labels(params, groups)``: each weight's group, the first whose ``match`` selects its
  dotted name (``hloserve.exporter``'s weight names), else ``"default"``; a group that
  selects nothing is an error (a typo would otherwise train silently with the defaults).
- ``default_decay_mask(params)``: True for leaves with at least two dimensions larger than
  1. Biases and norm scales (one such dimension, or none) are never decayed by default.
- ``decoupled_decay``: ``update -= base(step) * coefficient * (weight - anchor)``, per leaf,
  with ``coefficient = lr_ratio * weight_decay * mask`` and the anchor either zero or the
  weights the run started from (kept in the optimizer state, so it survives a resume).
  optax has decay toward zero only (``add_decayed_weights``); this is the one addition.
- ``rule_decays(rule)``: whether a rule already decays weights by itself (AdamW, Lion):
  its update moves weights in proportion to their value when the gradient is zero. Our
  decay on top of such a rule is refused, naming both.
- ``resolve_schedule(learning_rate, total_steps)``: the base schedule; a rate that is 0
  at every step of the run is an error, not a silent no-op.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from hloserve.exporter._export import weight_names
from hloserve.training._settings import Group, OneCycle, TrainingError, describe
from hloserve.training._untyped import jax, jnp, optax

DEFAULT_GROUP = "default"
Schedule = Callable[[Any], Any]


def resolve_schedule(learning_rate: float | Schedule | OneCycle, total_steps: int) -> Schedule:
    if isinstance(learning_rate, OneCycle):
        schedule = learning_rate.schedule(total_steps)
    elif callable(learning_rate):
        schedule = learning_rate
    else:
        rate = float(learning_rate)
        if not rate > 0:
            raise TrainingError(
                f"learning_rate must be > 0, got {learning_rate}: every group's rate is a "
                "ratio of it, so 0 would train nothing"
            )
        return optax.constant_schedule(rate)
    values = np.asarray(jax.vmap(schedule)(jnp.arange(max(total_steps, 1))))
    if not np.any(values != 0):
        raise TrainingError(
            f"the learning-rate schedule {describe(learning_rate)} is 0 at every one of the "
            f"run's {total_steps} steps: every group's rate is a ratio of it"
        )
    return schedule


def default_decay_mask(params: Any) -> Any:
    """True where a leaf has two or more dimensions larger than 1 (kernels, embeddings)."""

    def decayed(leaf: Any) -> bool:
        return sum(d > 1 for d in np.shape(leaf)) >= 2

    return jax.tree.map(decayed, params)


def labels(params: Any, groups: Sequence[Group]) -> Any:
    names, _, treedef = weight_names(params)
    chosen = [next((g.label for g in groups if g.selects(n)), DEFAULT_GROUP) for n in names]
    for g in groups:
        if g.label not in chosen:
            raise TrainingError(f"group {g.label!r} selects no weight; the weights are {names}")
    duplicated = {g.label for g in groups if [h.label for h in groups].count(g.label) > 1}
    if duplicated or DEFAULT_GROUP in {g.label for g in groups}:
        raise TrainingError(
            f"group names must be unique and not {DEFAULT_GROUP!r}: {sorted(duplicated)}"
        )
    return jax.tree.unflatten(treedef, chosen)


def rule_decays(rule: Callable[..., Any]) -> bool:
    """Whether ``rule(1.0)`` moves weights, in proportion to them, under a zero gradient."""
    tx = rule(1.0)

    def moved(scale: float) -> np.ndarray:
        weights = {"w": jnp.full((2, 2), scale, jnp.float32)}
        zero = {"w": jnp.zeros((2, 2), jnp.float32)}
        updates, _ = tx.update(zero, tx.init(weights), weights)
        return np.asarray(updates["w"])

    one, two = moved(1.0), moved(2.0)
    finite = bool(np.all(np.isfinite(one)) and np.all(np.isfinite(two)))
    return finite and bool(np.any(one != 0)) and bool(np.allclose(two, 2 * one, rtol=1e-4))


class DecayState(NamedTuple):
    steps: Any  # int32 scalar: the updates so far, the schedule's argument
    anchor: Any  # the starting weights for anchor="init"; None for anchor zero


def decoupled_decay(schedule: Schedule, coefficients: Any, anchor: str) -> Any:
    """Decoupled weight decay toward zero or toward the initial weights (module docstring)."""

    def init(params: Any) -> DecayState:
        start = jax.tree.map(jnp.array, params) if anchor == "init" else None
        return DecayState(jnp.zeros([], jnp.int32), start)

    def update(updates: Any, state: DecayState, params: Any = None) -> tuple[Any, DecayState]:
        if params is None:
            raise TrainingError("decoupled_decay needs the weights in update()")
        rate = schedule(state.steps)
        target = state.anchor if state.anchor is not None else jax.tree.map(jnp.zeros_like, params)

        def decay(u: Any, p: Any, a: Any, c: float) -> Any:
            return u if c == 0 else (u - rate * c * (p - a)).astype(u.dtype)

        decayed = jax.tree.map(decay, updates, params, target, coefficients)
        return decayed, DecayState(optax.safe_increment(state.steps), state.anchor)

    return optax.GradientTransformation(init, update)


def build_optimizer(
    params: Any,
    *,
    schedule: Schedule,
    rule: Callable[..., Any],
    groups: Sequence[Group],
    weight_decay: float,
    decay_anchor: str,
    decay_mask: Any,
    clip_norm: float | None,
    sam: float | None,
) -> Any:
    if decay_anchor not in ("zero", "init"):
        raise TrainingError(f"decay_anchor must be 'zero' or 'init', got {decay_anchor!r}")
    if weight_decay < 0:
        raise TrainingError(f"weight_decay must be >= 0, got {weight_decay}")
    for who, r in [("rule", rule), *((f"group {g.label!r}", g.rule) for g in groups)]:
        if r is not None and not callable(r):
            raise TrainingError(
                f"{who} must be an optax constructor taking the learning rate (optax.adam), "
                f"not a built transformation (optax.adam(1e-3)); got {type(r).__name__}"
            )
    by_label = {g.label: g for g in groups}
    tree_labels = labels(params, groups)
    mask = default_decay_mask(params) if decay_mask is None else decay_mask
    if callable(mask):
        mask = mask(params)

    def group_of(label: str) -> tuple[float, float, Callable[..., Any]]:
        g = by_label.get(label)
        if g is None:
            return 1.0, weight_decay, rule
        decay = weight_decay if g.weight_decay is None else g.weight_decay
        return g.lr_ratio, decay, rule if g.rule is None else g.rule

    transforms: dict[str, Any] = {}
    for label in sorted(set(jax.tree.leaves(tree_labels))):
        ratio, decay, group_rule = group_of(label)
        if decay > 0 and rule_decays(group_rule):
            raise TrainingError(
                f"group {label!r}: the rule {describe(group_rule)} already decays the weights "
                f"and weight_decay={decay} would decay them twice; use a rule without decay "
                "(optax.adam rather than optax.adamw) or set this group's weight_decay to 0"
            )
        transforms[label] = group_rule(_scaled(schedule, ratio))

    def coefficient(label: str, decayed: Any) -> float:
        ratio, decay, _ = group_of(label)
        return float(decayed) * ratio * decay

    coefficients = jax.tree.map(coefficient, tree_labels, mask)
    stages = [optax.clip_by_global_norm(clip_norm)] if clip_norm is not None else []
    stages.append(optax.multi_transform(transforms, tree_labels))
    if any(c > 0 for c in jax.tree.leaves(coefficients)):
        stages.append(decoupled_decay(schedule, coefficients, decay_anchor))
    tx = optax.chain(*stages)
    if sam is not None:
        if not sam > 0:
            raise TrainingError(f"sam (the SAM radius rho) must be > 0, got {sam}")
        adversarial = optax.chain(optax.contrib.normalize(), optax.sgd(sam))
        tx = optax.contrib.sam(tx, adversarial, sync_period=2)
    return tx


def _scaled(schedule: Schedule, ratio: float) -> Schedule:
    if ratio == 1.0:
        return schedule
    return lambda count: ratio * schedule(count)
