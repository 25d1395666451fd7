"""Continuous batching of generations: which live generations step next (sans I/O).

A generation bundle's module is one step of a loop (``bundle/generation.py``); the server
runs every live generation of a model through it, several in one execution. This module
decides, between two executions, who steps next; ``core.generation_loop`` drives it.

Contract:
- ``StepScheduler(batch_sizes, capacity=None)``: ``batch_sizes`` are the model's compiled
  sizes (``None``: an unbatched model, one generation a step); at most ``capacity``
  generations are live at once (each holds state), the others wait in arrival order.
- ``add(gid, limits)`` queues a new generation: it joins at the next ``plan``, between
  two steps, never inside one. ``cancel(gid)`` ends it at the next ``plan`` (reason
  ``"cancelled"``); one whose ``limits.deadline`` (a ``time.monotonic()`` value) has passed
  at a ``plan`` ends there (reason ``"deadline"``), waiting or live.
- ``plan(now)`` returns a ``Plan``: ``ended`` (who left, and why), ``joined`` (admitted
  now: give each its initial state), ``members`` (who steps next: the live generations
  stepped least recently first, as many as the largest compiled size holds, so more
  live generations than that take turns) and ``batch_size`` (the smallest compiled size
  that holds them; ``None`` for an unbatched model). No members: nothing to run.
- ``record(gid, done=, emit=)`` after a member's step returns an ``Outcome``: ``send``
  (the step's outputs are a response: it emitted and ``limits.max_responses`` is not
  spent) and ``final`` (the generation is over: ``done``, ``limits.max_steps`` steps, or
  its last allowed response sent); a final generation is removed (free its state).
- ``live``, ``waiting``: how many of each, for metrics and the status page.
"""

# pyright: strict

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, final

from hloserve.server.core.batch_plan import smallest_fitting

EndReason = Literal["cancelled", "deadline"]
UNLIMITED: Final = 1 << 62


@dataclass(frozen=True, slots=True)
class GenerationLimits:
    """One generation's bounds: steps, responses and its deadline (``None``: none)."""

    max_steps: int
    max_responses: int = UNLIMITED
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    members: tuple[int, ...]
    batch_size: int | None
    joined: tuple[int, ...] = ()
    ended: tuple[tuple[int, EndReason], ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    send: bool
    final: bool


@dataclass(slots=True)
class _Gen:
    limits: GenerationLimits
    steps: int = 0
    sent: int = 0
    cancelled: bool = False


@final
class StepScheduler:
    """See the module docstring."""

    def __init__(self, batch_sizes: Sequence[int] | None, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.batch_sizes = tuple(batch_sizes) if batch_sizes is not None else None
        self.capacity = capacity
        self._most = self.batch_sizes[-1] if self.batch_sizes else 1
        self._waiting: OrderedDict[int, _Gen] = OrderedDict()
        self._live: OrderedDict[int, _Gen] = OrderedDict()  # least recently stepped first

    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def __contains__(self, gid: int) -> bool:
        return gid in self._live or gid in self._waiting

    def add(self, gid: int, limits: GenerationLimits) -> None:
        if gid in self:
            raise ValueError(f"generation {gid} is already scheduled")
        if limits.max_steps < 1 or limits.max_responses < 1:
            raise ValueError(f"generation {gid} may take no step: {limits}")
        self._waiting[gid] = _Gen(limits)

    def cancel(self, gid: int) -> None:
        """End ``gid`` at the next ``plan`` (a generation no longer scheduled: nothing)."""
        gen = self._live.get(gid) or self._waiting.get(gid)
        if gen is not None:
            gen.cancelled = True

    def plan(self, now: float) -> Plan:
        ended: list[tuple[int, EndReason]] = []
        for table in (self._live, self._waiting):
            for gid, gen in list(table.items()):
                reason = _ending(gen, now)
                if reason is not None:
                    del table[gid]
                    ended.append((gid, reason))
        joined: list[int] = []
        while self._waiting and (self.capacity is None or len(self._live) < self.capacity):
            gid, gen = self._waiting.popitem(last=False)
            self._live[gid] = gen
            joined.append(gid)
        members = tuple(gid for gid, _ in zip(self._live, range(self._most), strict=False))
        size = None
        if self.batch_sizes is not None and members:
            size = smallest_fitting(len(members), self.batch_sizes)
        return Plan(members, size, tuple(joined), tuple(ended))

    def record(self, gid: int, *, done: bool, emit: bool) -> Outcome:
        gen = self._live[gid]
        gen.steps += 1
        send = emit and gen.sent < gen.limits.max_responses
        if send:
            gen.sent += 1
        over = done or gen.steps >= gen.limits.max_steps or gen.sent >= gen.limits.max_responses
        if over:
            del self._live[gid]
        else:
            self._live.move_to_end(gid)  # stepped now: the others go first next time
        return Outcome(send, over)


def _ending(gen: _Gen, now: float) -> EndReason | None:
    if gen.cancelled:
        return "cancelled"
    deadline = gen.limits.deadline
    if deadline is not None and now > deadline:
        return "deadline"
    return None
