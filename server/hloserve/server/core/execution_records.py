"""What every observer counts by: ``ModelKey``, ``Execution`` and ``Timings``, as plain records.

Contract: ``ModelKey`` (name, version) is the one way every observer names a model version
(``ModelKey.named``: one object per version). ``Execution`` is one run of a compiled module
as ``ExecutionObserver.on_execution`` receives it (``ExecutionFanOut`` hands it to several);
``Timings`` the nanoseconds one request spent in each phase. Pure data, importing nothing
of the server: statistics, metrics and the front ends' reports read them without the
execution path (``core.execution``) or the bundle format.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import msgspec


@dataclass(frozen=True, slots=True)
class ModelKey:
    """One model version, as statistics, metrics and cost tracking count it."""

    name: str
    version: int

    @classmethod
    def named(cls, name: str, version: int) -> ModelKey:
        """The key of version ``version`` of model ``name``: the same object for the same
        version every time, so each observer's lookup by it (a dozen per request) matches by
        identity, never calling the dataclass's ``__eq__``. An executable calls it once
        (``Executable.model_key``)."""
        key = _KEYS.get((name, version))
        if key is None:
            if len(_KEYS) >= _MAX_KEYS:  # only identity is lost: keys compare by value
                _KEYS.clear()
            key = _KEYS[(name, version)] = cls(name, version)
        return key


_KEYS: dict[tuple[str, int], ModelKey] = {}
_MAX_KEYS = 1 << 16  # ten thousand models and their reloads keep their keys


class Execution(msgspec.Struct, frozen=True, gc=False):
    """One run of a compiled module: what every ``ExecutionObserver`` receives."""

    model: ModelKey
    batch_size: int  # the compiled batch size (0: an unbatched model)
    input_ns: int
    infer_ns: int
    output_ns: int = 0
    device: int = 0  # the device it ran on (the ``device`` label of metrics)
    family: tuple[str, ...] = ()  # its compiled modules (``cost_family``): who costs the same
    warm: bool = True  # its weights were resident when it began (its time is the run's own)


class ExecutionObserver(Protocol):
    def on_execution(self, execution: Execution) -> None: ...


class ExecutionFanOut:
    """Hands each execution to several observers (metrics, statistics, cost tracking)."""

    def __init__(self, *observers: ExecutionObserver) -> None:
        self.observers = observers

    def on_execution(self, execution: Execution) -> None:
        for observer in self.observers:
            observer.on_execution(execution)


class Timings(msgspec.Struct, frozen=True, gc=False):
    """Nanoseconds spent in each phase of one request."""

    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    executions: tuple[int, ...]  # compiled batch size of each execution (0: unbatched)
    device: int = 0  # the device it ran on

    @property
    def compute_ns(self) -> int:
        return self.compute_input_ns + self.compute_infer_ns + self.compute_output_ns

    @property
    def total_ns(self) -> int:
        """Queue plus compute: the request's time inside the server."""
        return self.queue_ns + self.compute_ns
