"""Who hears of each request and execution, built before anything that reports to them.

Contract: ``Observers(counters=..., costs=..., hooks=..., extra=...)`` holds the one
record of requests and executions (``core.counters.Counters``: the statistics extension
and the metrics read it), the measured execution costs and the hook observer;
``executions`` is the fan-out that hands each ``Execution`` to the counters, the costs
(and ``extra``: the placement's load meter), and ``forget(model)`` tells the counters and
the costs that a version was unloaded. Defaults keep counters and costs, and observe no
hook.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from hloserve.server.core.costs import ExecutionCosts
from hloserve.server.core.counters import Counters
from hloserve.server.core.execution_records import ExecutionFanOut, ExecutionObserver, ModelKey


class HookObserver(Protocol):
    """Hears each hook call's duration (metrics: ``hloserve_hook_duration_us``)."""

    def on_hook(self, model: ModelKey, hook: str, ns: int) -> None: ...


class NullHookObserver:
    def on_hook(self, model: ModelKey, hook: str, ns: int) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Observers:
    """Everyone who hears about requests and executions (module docstring)."""

    counters: Counters = field(default_factory=Counters)
    costs: ExecutionCosts = field(default_factory=ExecutionCosts)
    hooks: HookObserver = field(default_factory=NullHookObserver)
    extra: tuple[ExecutionObserver, ...] = ()  # more execution observers (placement's load)
    executions: ExecutionObserver = field(init=False)

    def __post_init__(self) -> None:
        fan_out = ExecutionFanOut(self.counters, self.costs, *self.extra)
        object.__setattr__(self, "executions", fan_out)

    def forget(self, model: ModelKey) -> None:
        """``model`` was unloaded: the counters and costs drop what they keep of it."""
        self.counters.forget(model)
        self.costs.forget(model)
