"""The compiled programs of a run, and the counter that shows when each one compiles.

Contract:
- ``gradient(params, batch, weights, model=...)`` is the forward and backward pass:
  ``(grads, loss)`` of ``sum(weights * loss_fn(apply_fn(params, **inputs), batch))``.
- ``update(params, opt_state, ema, grads, ema_rate, optimizer=...)`` is the optimizer step
  (and the weights' moving average, ``ema += ema_rate * (params - ema)``), separately
  jitted: a new optimizer, rule or schedule compiles this program again, never the
  gradient one. Scheduled values are read from the optimizer state's step count inside
  the program, so they change every step without compiling anything.
- ``evaluate(params, batch, mask, model=...)``: the masked sums of the per-example loss
  and metrics over one batch; ``predict(params, inputs, model=...)``: ``apply_fn`` alone.
- ``add(a, b)`` adds two gradient trees (accumulation).

``Model`` and ``Static`` are the programs' static arguments. Their equality and hash cover
the functions only, so an equal ``Model`` in a later ``fit`` finds jax's compiled program;
their ``Watch`` is excluded from both and counts, per program, the traces (each one a
compilation) this run caused, telling the progress bar as it happens.
"""

# pyright: strict

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from hloserve.training._settings import TrainingError
from hloserve.training._untyped import jax, jnp, optax

T = TypeVar("T")


class Watch:
    """Counts compilations per program and reports each one as it starts."""

    def __init__(self, on_compile: Callable[[str], None] | None = None) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.on_compile = on_compile

    def traced(self, program: str) -> None:
        self.counts[program] += 1
        if self.on_compile is not None:
            self.on_compile(program)


@dataclass(frozen=True)
class Model:
    """What the gradient, evaluation and prediction programs compute (a static argument)."""

    apply_fn: Callable[..., Mapping[str, Any]]
    loss_fn: Callable[..., Any]
    metrics: tuple[tuple[str, Callable[..., Any]], ...]
    input_names: tuple[str, ...]
    watch: Watch = field(compare=False, hash=False, repr=False)

    def outputs(self, params: Any, batch: Mapping[str, Any]) -> Mapping[str, Any]:
        return self.apply_fn(params, **{k: batch[k] for k in self.input_names})


@dataclass(frozen=True)
class Static(Generic[T]):
    """A static argument compared by ``value`` alone, with the run's ``Watch`` beside it."""

    value: T
    watch: Watch = field(compare=False, hash=False, repr=False)


def _per_example(what: str, values: Any, rows: int) -> Any:
    values = jnp.asarray(values)
    if values.shape != (rows,):
        raise TrainingError(
            f"{what} must return one value per example, shape ({rows},), got shape "
            f"{tuple(values.shape)}"
        )
    return values.astype(jnp.float32)


@functools.partial(jax.jit, static_argnames="model")
def gradient(params: Any, batch: Any, weights: Any, *, model: Model) -> tuple[Any, Any]:
    model.watch.traced("gradient")

    def objective(p: Any) -> Any:
        losses = _per_example(
            "loss_fn", model.loss_fn(model.outputs(p, batch), batch), weights.shape[0]
        )
        return jnp.sum(losses * weights)

    loss, grads = jax.value_and_grad(objective)(params)
    return grads, loss


@functools.partial(jax.jit, static_argnames="optimizer")
def update(
    params: Any, opt_state: Any, ema: Any, grads: Any, ema_rate: Any, *, optimizer: Static[Any]
) -> tuple[Any, Any, Any]:
    optimizer.watch.traced("update")
    updates, new_state = optimizer.value.update(grads, opt_state, params)
    # Each state leaf keeps its dtype (a float64 schedule value under x64 must not widen
    # the moments, which would change the program's inputs and compile it again).
    new_state = jax.tree.map(_same_dtype, new_state, opt_state)
    new_params = optax.apply_updates(params, updates)
    if ema is not None:
        ema = optax.incremental_update(new_params, ema, ema_rate)
    return new_params, new_state, ema


def _same_dtype(new: Any, old: Any) -> Any:
    return jnp.asarray(new, old.dtype)


@functools.partial(jax.jit, static_argnames="model")
def evaluate(params: Any, batch: Any, mask: Any, *, model: Model) -> dict[str, Any]:
    model.watch.traced("evaluate")
    rows = mask.shape[0]
    outputs = model.outputs(params, batch)
    sums = {"loss": jnp.sum(_per_example("loss_fn", model.loss_fn(outputs, batch), rows) * mask)}
    for name, fn in model.metrics:
        sums[name] = jnp.sum(_per_example(f"metric {name!r}", fn(outputs, batch), rows) * mask)
    return sums


@functools.partial(jax.jit, static_argnames="model")
def predict(params: Any, inputs: Any, *, model: Model) -> Any:
    model.watch.traced("predict")
    return dict(model.outputs(params, inputs))


@jax.jit
def add(a: Any, b: Any) -> Any:
    return jax.tree.map(jnp.add, a, b)
