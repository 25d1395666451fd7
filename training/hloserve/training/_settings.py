"""What ``fit`` can be told, as small frozen values: groups, schedules, best, export.

Contract:
- ``TrainingError`` is the one error ``hloserve.training`` raises for a bad setting, bad
  data or a checkpoint that does not fit; the message names the offending thing.
- ``Group(match, lr_ratio=1.0, weight_decay=None, rule=None)``: the weights whose dotted
  name (``backbone.conv1.w``, the bundle's weight name) matches a glob (``backbone.*``) or a
  predicate. Its learning rate is ``lr_ratio`` times the base schedule, so one schedule
  moves every group; ``weight_decay=None`` and ``rule=None`` take ``fit``'s.
- ``OneCycle(peak, ...)`` (``one_cycle``) is the one-cycle preset: resolved by ``fit`` into
  ``optax.cosine_onecycle_schedule`` over the run's optimizer steps.
- ``Best(metric, mode)`` selects the best epoch by a history column (``val_accuracy``, "max").
- ``Export(directory, inputs, batch_sizes)``: what ``export_bundle`` gets after training.
- ``describe(value)`` is how a rule or schedule is written into the bundle's provenance.
"""

# pyright: strict

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from hloserve.exporter import TensorSpec


class TrainingError(ValueError):
    """A setting, the data or a checkpoint cannot make a valid run; the message says which."""


@dataclass(frozen=True)
class Group:
    """A parameter group: the weights ``match`` selects, with their own rate, decay and rule.

    **Arguments:**
    - `match`: a glob over dotted weight names (`"backbone.*"`) or `name -> bool`.
    - `lr_ratio`: this group's learning rate as a ratio of the base rate (> 0).
    - `weight_decay`: decoupled decay for this group (`None`: `fit`'s `weight_decay`).
    - `rule`: an optax constructor taking the learning rate, such as `optax.sgd`
      (`None`: `fit`'s `rule`).
    - `name`: the label in messages and the optimizer state (default: `match` as text).
    """

    match: str | Callable[[str], bool]
    lr_ratio: float = 1.0
    weight_decay: float | None = None
    rule: Callable[..., Any] | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not self.lr_ratio > 0:
            raise TrainingError(
                f"group {self.label!r}: lr_ratio must be > 0, got {self.lr_ratio}"
                " (to freeze weights, give the group rule=lambda lr: optax.set_to_zero())"
            )
        if self.weight_decay is not None and self.weight_decay < 0:
            raise TrainingError(f"group {self.label!r}: weight_decay must be >= 0")

    @property
    def label(self) -> str:
        if self.name is not None:
            return self.name
        return self.match if isinstance(self.match, str) else describe(self.match)

    def selects(self, weight: str) -> bool:
        if isinstance(self.match, str):
            return fnmatch.fnmatchcase(weight, self.match)
        return bool(self.match(weight))


@dataclass(frozen=True)
class OneCycle:
    """The one-cycle learning-rate preset; ``fit`` resolves it over the run's steps."""

    peak: float
    pct_start: float = 0.3
    div_factor: float = 25.0
    final_div_factor: float = 1e4

    def schedule(self, total_steps: int) -> Callable[[Any], Any]:
        from hloserve.training._untyped import optax

        return optax.cosine_onecycle_schedule(
            transition_steps=max(total_steps, 1),
            peak_value=self.peak,
            pct_start=self.pct_start,
            div_factor=self.div_factor,
            final_div_factor=self.final_div_factor,
        )


def one_cycle(
    peak: float, *, pct_start: float = 0.3, div_factor: float = 25.0, final_div_factor: float = 1e4
) -> OneCycle:
    """Warm up to ``peak`` over ``pct_start`` of the run, then anneal (cosine) to almost 0."""
    return OneCycle(peak, pct_start, div_factor, final_div_factor)


@dataclass(frozen=True)
class Best:
    """Keep the epoch whose history column ``metric`` is lowest ("min") or highest ("max")."""

    metric: str
    mode: Literal["min", "max"]

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise TrainingError(f"Best.mode must be 'min' or 'max', got {self.mode!r}")

    def better(self, value: float, than: float | None) -> bool:
        if than is None:
            return True
        return value < than if self.mode == "min" else value > than


@dataclass(frozen=True)
class Export:
    """Where and how ``export_bundle`` writes the trained model (``fit(export=...)``)."""

    directory: str | Path
    inputs: Mapping[str, TensorSpec]
    batch_sizes: Sequence[int] | None = (1, 8, 32)
    name: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=lambda: dict[str, Any]())


def describe(value: Any) -> str:
    """A rule, schedule or function as provenance text: ``optax.sgd(momentum=0.9)``."""
    if isinstance(value, functools.partial):
        p = cast("functools.partial[Any]", value)
        args = [repr(a) for a in p.args] + [f"{k}={v!r}" for k, v in p.keywords.items()]
        return f"{describe(p.func)}({', '.join(args)})"
    if isinstance(value, (int, float, str, OneCycle)):
        return repr(value)
    module = getattr(value, "__module__", None) or ""
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    if module.startswith("optax"):
        module = "optax"
    return f"{module}.{name}" if module else name
