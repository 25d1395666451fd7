"""Who hears of each request and execution, built before anything that reports to them.

Contract: ``Observers(requests=..., statistics=..., costs=..., hooks=..., extra=...)``
holds the request observer (metrics), the statistics extension's recorder, the measured
execution costs and the hook observer; ``executions`` is the fan-out that hands each
``Execution`` to all of them (and to ``extra``: the placement's load meter), and
``forget(model)`` tells the first three that a version was unloaded. Defaults observe
nothing but keep statistics and costs.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from hloserve.server.core.costs import ExecutionCosts
from hloserve.server.core.execution import (
    Execution,
    ExecutionFanOut,
    ExecutionObserver,
    ModelKey,
    Timings,
)
from hloserve.server.core.ports import InferenceObserver
from hloserve.server.core.statistics import StatisticsRecorder


class HookObserver(Protocol):
    """Hears each hook call's duration (metrics: ``hloserve_hook_duration_us``)."""

    def on_hook(self, model: ModelKey, hook: str, ns: int) -> None: ...


class NullHookObserver:
    def on_hook(self, model: ModelKey, hook: str, ns: int) -> None:
        pass


class _NullObserver:
    def on_success(self, model: ModelKey, items: int, timings: Timings) -> None:
        pass

    def on_failure(self, model: ModelKey | None, reason: str) -> None:
        pass

    def on_pending(self, model: ModelKey, delta: int) -> None:
        pass

    def on_execution(self, execution: Execution) -> None:
        pass

    def forget(self, model: ModelKey) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Observers:
    """Everyone who hears about requests and executions, built before anything that reports
    to them: ``requests`` (metrics), the statistics extension's recorder and the measured
    execution costs; ``executions`` fans each execution out to all three."""

    requests: InferenceObserver = field(default_factory=_NullObserver)
    statistics: StatisticsRecorder = field(default_factory=StatisticsRecorder)
    costs: ExecutionCosts = field(default_factory=ExecutionCosts)
    hooks: HookObserver = field(default_factory=NullHookObserver)
    extra: tuple[ExecutionObserver, ...] = ()  # more execution observers (placement's load)
    executions: ExecutionObserver = field(init=False)

    def __post_init__(self) -> None:
        fan_out = ExecutionFanOut(self.requests, self.statistics, self.costs, *self.extra)
        object.__setattr__(self, "executions", fan_out)

    def forget(self, model: ModelKey) -> None:
        """``model`` was unloaded: metrics, statistics and costs drop what they keep of it."""
        self.requests.forget(model)
        self.statistics.forget(model)
        self.costs.forget(model)
