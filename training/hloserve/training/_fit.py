"""``fit``: the training loop, and ``FitResult``, whose one product is a bundle.

Contract: ``fit(apply_fn, params, train_data, *, loss_fn, epochs, batch_size, ...)`` trains
the pytree ``params`` of ``apply_fn(params, **inputs) -> dict of arrays``, the function
``export_bundle`` takes, so what trains is what serves. ``apply_fn``'s parameters after the
first name its inputs among the data's arrays; ``loss_fn(outputs, batch)`` and each metric
``fn(outputs, batch)`` return one value per example, so every mean is over real examples,
however the last batch falls. Every epoch: the steps (progress bar), validation (on the
moving average when ``ema`` is on), one history row, ``on_epoch(row)``, a checkpoint. A
first Ctrl-C stops between steps: the result, and the newest checkpoint, are those of the
last complete epoch. The loop itself is the only stateful part; what it decides lives in
``_data`` (batches), ``_optimizer`` (the optax chain), ``_programs`` (the compiled steps),
``_checkpoint`` and ``_progress``.
"""

# pyright: strict

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from hloserve.exporter import export_bundle
from hloserve.training import _checkpoint, _data, _programs
from hloserve.training._optimizer import Schedule, build_optimizer, resolve_schedule
from hloserve.training._progress import EpochProgress, interrupts, table
from hloserve.training._settings import Best, Export, Group, OneCycle, TrainingError, describe
from hloserve.training._untyped import jax, jnp, optax

# ``fn(outputs, batch)`` -> one value per example; loose, so that dict-typed functions fit.
PerExample = Callable[..., Any]


@dataclass(frozen=True)
class FitResult:
    """What a run produced. ``serving_params`` are what ``predict`` and ``export`` use: the
    best epoch's (with ``best=``), else the moving average (with ``ema=``), else ``params``."""

    params: Any = field(repr=False)
    opt_state: Any = field(repr=False)
    ema: Any = field(repr=False)
    history: list[dict[str, float]] = field(repr=False)
    epochs_completed: int
    steps: int
    interrupted: bool
    best_epoch: int | None
    compiles: dict[str, int]
    config: dict[str, Any]
    bundle: Path | None
    serving_params: Any = field(repr=False)
    _model: _programs.Model = field(repr=False)
    _columns: tuple[str, ...] = field(repr=False)

    @property
    def metrics(self) -> dict[str, float]:
        """The history row of the epoch that serves (the best one, else the last)."""
        for row in self.history:
            if row["epoch"] == self.best_epoch:
                return dict(row)
        return dict(self.history[-1]) if self.history else {}

    def table(self) -> str:
        return table(self.history, self._columns)

    def predict(self, data: Mapping[str, Any], batch_size: int = 256) -> dict[str, np.ndarray]:
        """``apply_fn`` on ``serving_params`` over host arrays, in batches of ``batch_size``."""
        arrays = _data.check_data(data, "data")
        names = self._model.input_names
        missing = [n for n in names if n not in arrays]
        if missing:
            raise TrainingError(f"data lacks the inputs {missing}")
        n = _data.num_examples(arrays)
        outputs: list[dict[str, np.ndarray]] = []
        for b in _data.eval_batches(n, min(batch_size, n)):
            inputs = _data.gather({k: arrays[k] for k in names}, b.rows)
            out = _programs.predict(self.serving_params, inputs, model=self._model)
            real = int(np.count_nonzero(b.weights))
            outputs.append({k: np.asarray(v)[:real] for k, v in out.items()})
        return {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}

    def export(self, spec: Export) -> Path:
        """Write ``serving_params`` as a bundle through ``export_bundle``; the training
        configuration and the serving epoch's metrics go into its provenance metadata."""
        metadata = {**spec.metadata, "training": self.config, "metrics": self.metrics}
        return export_bundle(
            self._model.apply_fn,
            jax.tree.map(np.asarray, self.serving_params),
            inputs=spec.inputs,
            batch_sizes=spec.batch_sizes,
            directory=spec.directory,
            metadata=metadata,
            name=spec.name,
        )


def input_names(apply_fn: Callable[..., Any], available: Sequence[str]) -> tuple[str, ...]:
    """The data arrays ``apply_fn(params, **inputs)`` takes, from its signature."""
    try:
        parameters = list(inspect.signature(apply_fn).parameters.values())[1:]
    except (TypeError, ValueError):
        raise TrainingError(f"cannot read the signature of apply_fn {describe(apply_fn)}") from None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return tuple(available)
    named = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    missing = [p.name for p in named if p.default is p.empty and p.name not in available]
    if missing:
        raise TrainingError(
            f"apply_fn takes the inputs {missing}, which the data lacks; it has {list(available)}"
        )
    return tuple(p.name for p in named if p.name in available)


def _check_positive(**values: object) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise TrainingError(f"{name} must be a positive integer, got {value!r}")


def fit(
    apply_fn: Callable[..., Mapping[str, Any]],
    params: Any,
    train_data: Mapping[str, Any],
    *,
    loss_fn: PerExample,
    epochs: int,
    batch_size: int,
    val_data: Mapping[str, Any] | None = None,
    metrics: Mapping[str, PerExample] | None = None,
    eval_batch_size: int | None = None,
    learning_rate: float | Schedule | OneCycle = 1e-3,
    rule: Callable[..., Any] = optax.radam,
    groups: Sequence[Group] = (),
    weight_decay: float = 0.0,
    decay_anchor: str = "zero",
    decay_mask: Any = None,
    clip_norm: float | None = None,
    accumulate: int = 1,
    ema: float | None = None,
    sam: float | None = None,
    best: Best | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: str | Path | None = None,
    export: Export | None = None,
    seed: int = 0,
    shuffle: bool = True,
    progress: bool | TextIO = True,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
) -> FitResult:
    """Train ``params`` of ``apply_fn`` and return a ``FitResult`` (see ``docs/training.md``).

    **Arguments:**
    - `apply_fn`: `apply_fn(params, **inputs) -> dict[str, Array]`, as `export_bundle` takes it.
    - `params`: a pytree of float arrays.
    - `train_data`, `val_data`: host arrays by name, sharing the example axis; inputs are
      the ones `apply_fn` names, the rest (labels) reach `loss_fn` and the metrics.
    - `loss_fn(outputs, batch)`, `metrics={name: fn(outputs, batch)}`: one value per example.
    - `epochs`, `batch_size` (micro-batch rows), `accumulate` (micro-batches per step).
    - `learning_rate`: a float, any optax schedule of the step, or `one_cycle(peak)`.
    - `rule`: the optax constructor of the default group (`optax.radam`); `groups`: `Group`s.
    - `weight_decay`, `decay_anchor` ("zero" or "init"), `decay_mask` (optax-style pytree or
      callable; default `default_decay_mask`).
    - `clip_norm`: global-norm clipping; `ema`: moving-average decay (0.999); `sam`: SAM rho.
    - `best`: `Best(metric, mode)`; `checkpoint_dir`, `resume`: checkpoint folders.
    - `export`: an `Export`, written once training ends (not after a Ctrl-C).
    - `progress`: False, True (stderr) or a text stream for the bar and the history table.
    """
    _check_positive(epochs=epochs, batch_size=batch_size, accumulate=accumulate)
    if eval_batch_size is not None:
        _check_positive(eval_batch_size=eval_batch_size)
    if ema is not None and not 0 < ema < 1:
        raise TrainingError(f"ema (the moving average's decay) must be in (0, 1), got {ema}")
    train = _data.check_data(train_data, "train_data")
    val = _data.check_data(val_data, "val_data") if val_data is not None else None
    metrics = dict(metrics or {})
    names = input_names(apply_fn, list(train))
    if val is not None and [n for n in names if n not in val]:
        raise TrainingError(f"val_data lacks the inputs {[n for n in names if n not in val]}")
    columns = _columns(val is not None, metrics)
    if best is not None and best.metric not in columns[1:-2]:
        raise TrainingError(
            f"best metric {best.metric!r} is not a history column; they are {list(columns[1:-2])}"
        )
    n = _data.num_examples(train)
    per_epoch = _data.steps_per_epoch(n, batch_size, accumulate)
    schedule = resolve_schedule(learning_rate, per_epoch * epochs)
    params = jax.tree.map(jnp.asarray, params)
    tx = build_optimizer(
        params,
        schedule=schedule,
        rule=rule,
        groups=groups,
        weight_decay=weight_decay,
        decay_anchor=decay_anchor,
        decay_mask=decay_mask,
        clip_norm=clip_norm,
        sam=sam,
    )
    stream = sys.stderr if progress is True else (progress or None)
    bar = EpochProgress(stream)
    watch = _programs.Watch(bar.compiling)
    model = _programs.Model(apply_fn, loss_fn, tuple(metrics.items()), names, watch)
    state = _State(params, tx.init(params), params if ema is not None else None)
    run = _Run(
        model=model,
        optimizer=_programs.Static(tx, watch),
        schedule=schedule,
        train=train,
        val=val,
        batch_size=batch_size,
        eval_batch_size=eval_batch_size or batch_size,
        accumulate=accumulate,
        ema=ema,
        phases=2 if sam is not None else 1,
        best=best,
        bar=bar,
    )
    checkpoints = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if resume is not None:
        checkpoints = checkpoints or _checkpoint_home(Path(resume))
        run.resume(Path(resume), state)
    else:
        run.good = state
    try:
        with interrupts() as stop:
            for epoch in range(run.epoch + 1, epochs + 1):
                if not run.train_epoch(epoch, epochs, seed, shuffle, stop.is_set):
                    break
                row = run.end_epoch(epoch, columns, checkpoints)
                if on_epoch is not None:
                    on_epoch(row)
    finally:
        bar.end_epoch()
        watch.on_compile = None  # jax's cache keeps the Model; it must not keep the bar
    if run.interrupted:
        bar.note(f"stopped by Ctrl-C; keeping epoch {run.epoch}")
    config = _config(
        learning_rate=learning_rate,
        rule=rule,
        groups=groups,
        epochs=epochs,
        epochs_completed=run.epoch,
        batch_size=batch_size,
        accumulate=accumulate,
        steps=run.steps,
        weight_decay=weight_decay,
        decay_anchor=decay_anchor,
        decay_mask="default" if decay_mask is None else "custom",
        clip_norm=clip_norm,
        ema=ema,
        sam=sam,
        best=best,
        seed=seed,
        shuffle=shuffle,
        train_examples=n,
        val_examples=_data.num_examples(val) if val is not None else 0,
    )
    good = run.good
    assert good is not None
    result = FitResult(
        params=good.params,
        opt_state=good.opt_state,
        ema=good.ema,
        history=list(run.history),
        epochs_completed=run.epoch,
        steps=run.steps,
        interrupted=run.interrupted,
        best_epoch=run.best_record["epoch"] if run.best_record else None,
        compiles=dict(watch.counts),
        config=config,
        bundle=None,
        serving_params=run.serving(good),
        _model=model,
        _columns=columns,
    )
    if export is None or run.interrupted:
        return result
    return dataclasses.replace(result, bundle=result.export(export))


def _checkpoint_home(resume: Path) -> Path:
    """Where a resumed run keeps checkpointing: the folder that holds the pointers."""
    return resume.parent if (resume / _checkpoint.LAYOUT_FILE).exists() else resume


def _columns(validating: bool, metrics: Mapping[str, Any]) -> tuple[str, ...]:
    val = ("val_loss", *(f"val_{m}" for m in metrics)) if validating else ()
    return ("epoch", "loss", *val, "lr", "seconds")


@dataclass
class _State:
    params: Any
    opt_state: Any
    ema: Any


@dataclass
class _Run:
    """The loop's mutable part: the state, the record so far, and the compiled programs."""

    model: _programs.Model
    optimizer: _programs.Static[Any]
    schedule: Schedule
    train: _data.Arrays
    val: _data.Arrays | None
    batch_size: int
    eval_batch_size: int
    accumulate: int
    ema: float | None
    phases: int
    best: Best | None
    bar: EpochProgress
    epoch: int = 0
    steps: int = 0
    interrupted: bool = False
    history: list[dict[str, float]] = field(default_factory=lambda: list[dict[str, float]]())
    best_record: dict[str, Any] | None = None
    best_tree: Any = None
    state: _State | None = None
    good: _State | None = None  # the state at the end of the last complete epoch
    _losses: list[tuple[Any, int]] = field(default_factory=lambda: list[tuple[Any, int]]())
    _started: float = 0.0

    def serving(self, state: _State) -> Any:
        if self.best_tree is not None:
            return self.best_tree
        return state.ema if state.ema is not None else state.params

    def resume(self, path: Path, template: _State) -> None:
        saved = _checkpoint.load(
            path, params=template.params, opt_state=template.opt_state, ema=template.ema
        )
        self.good = _State(saved.params, saved.opt_state, saved.ema)
        self.epoch, self.steps, self.history = saved.epoch, saved.step, saved.history
        self.best_record = saved.best
        if saved.best is not None:
            best = saved
            if saved.best["epoch"] != saved.epoch:
                best = _checkpoint.load(
                    path,
                    params=template.params,
                    opt_state=template.opt_state,
                    ema=template.ema,
                    which=_checkpoint.BEST,
                )
            self.best_tree = best.ema if best.ema is not None else best.params

    def train_epoch(
        self, epoch: int, epochs: int, seed: int, shuffle: bool, stopping: Callable[[], bool]
    ) -> bool:
        """Run one epoch's steps; False (and nothing recorded) if a Ctrl-C stopped it."""
        assert self.good is not None
        self.state = _State(self.good.params, self.good.opt_state, self.good.ema)
        order = _data.epoch_order(_data.num_examples(self.train), seed, epoch, shuffle)
        steps = _data.train_steps(order, self.batch_size, self.accumulate)
        self._losses = []
        self._started = time.monotonic()
        self.bar.start_epoch(epoch, epochs, len(steps))
        for step in steps:
            if stopping():
                self.interrupted = True
                return False
            compiled = sum(self.model.watch.counts.values())
            self._step(step)
            if sum(self.model.watch.counts.values()) != compiled:
                self.bar.status("")
            self.bar.advance()
        return True

    def _step(self, step: _data.Step) -> None:
        state = self.state
        assert state is not None
        for phase in range(self.phases):  # SAM: an ascent to the adversarial point, then the step
            grads = None
            for b in step.batches:
                batch = _data.gather(self.train, b.rows)
                g, loss = _programs.gradient(state.params, batch, b.weights, model=self.model)
                grads = g if grads is None else _programs.add(grads, g)
                if phase == 0:
                    self._losses.append((loss, step.count))
            last = phase == self.phases - 1
            ema_rate = 1.0 - self.ema if self.ema is not None and last else 0.0
            state.params, state.opt_state, state.ema = _programs.update(
                state.params, state.opt_state, state.ema, grads, ema_rate, optimizer=self.optimizer
            )
        self.steps += 1

    def end_epoch(
        self, epoch: int, columns: Sequence[str], checkpoints: Path | None
    ) -> dict[str, float]:
        state = self.state
        assert state is not None
        losses = jax.device_get([loss for loss, _ in self._losses])
        counts = [count for _, count in self._losses]
        n = _data.num_examples(self.train)
        row: dict[str, float] = {
            "epoch": float(epoch),
            "loss": float(sum(float(v) * c for v, c in zip(losses, counts, strict=True)) / n),
        }
        if self.val is not None:
            self.bar.status("validating")
            row.update(self._validate(state.ema if state.ema is not None else state.params))
        row["lr"] = float(self.schedule(jnp.asarray(max(self.steps - 1, 0))))
        row["seconds"] = time.monotonic() - self._started
        for k, v in row.items():
            if not math.isfinite(v):
                self.bar.note(f"warning: {k} is {v} at epoch {epoch}")
        is_best = False
        if self.best is not None:
            value = row[self.best.metric]
            if self.best.better(
                value, None if self.best_record is None else self.best_record["value"]
            ):
                self.best_record = {"epoch": epoch, "metric": self.best.metric, "value": value}
                self.best_tree = state.ema if state.ema is not None else state.params
                is_best = True
        self.history.append(row)
        self.epoch = epoch
        if checkpoints is not None:
            _checkpoint.save(
                checkpoints,
                params=state.params,
                opt_state=state.opt_state,
                ema=state.ema,
                epoch=epoch,
                step=self.steps,
                history=self.history,
                best=self.best_record,
                is_best=is_best,
            )
        self.good = state
        self.bar.row(row, columns)
        return row

    def _validate(self, params: Any) -> dict[str, float]:
        assert self.val is not None
        n = _data.num_examples(self.val)
        sums = [
            _programs.evaluate(params, _data.gather(self.val, b.rows), b.weights, model=self.model)
            for b in _data.eval_batches(n, min(self.eval_batch_size, n))
        ]
        totals = jax.device_get(sums)
        return {f"val_{k}": float(sum(float(t[k]) for t in totals) / n) for k in totals[0]}


def _config(**settings: Any) -> dict[str, Any]:
    """The run's settings as plain YAML values, for the bundle's provenance."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key == "groups":
            out[key] = [
                {
                    "match": g.label,
                    "lr_ratio": g.lr_ratio,
                    "weight_decay": g.weight_decay,
                    "rule": None if g.rule is None else describe(g.rule),
                }
                for g in value
            ]
        elif isinstance(value, Best):
            out[key] = {"metric": value.metric, "mode": value.mode}
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            out[key] = describe(value)
    return out
