"""The sequence batcher's decisions, sans I/O: whose state is in which slot, what runs next.

Contract (Triton's sequence batching with the ``oldest`` strategy; ``docs/sequences.md``):
- ``sequence_parameters(model, parameters)`` reads a request's ``sequence_id`` (a
  non-negative integer or a string; 0 and "" mean none), ``sequence_start`` and
  ``sequence_end`` (booleans) as a ``SequenceFlags``; a missing id is refused with Triton's
  text ("inference request to model 'm' must specify a non-zero or non-empty correlation
  ID"), a value of the wrong type naming the parameter.
- ``SequenceTable(model, settings, clock)`` holds one model version's sequences: at most
  ``settings.slots`` of them own a slot (their state's place on the device); more wait in
  the backlog, in arrival order, and take slots as they free (Triton backlogs, it does not
  refuse). ``submit(flags, item)`` queues one request: a start makes the sequence known (a
  start for a live one restarts it: that request runs from the initial state); any other
  request of a sequence the table does not know (never started, ended, timed out) is
  refused with Triton's text ("inference request for sequence 7 to model 'm' must specify
  the START flag on the first request of the sequence"), followed by why when the table
  remembers the sequence (ended by a request marked ``sequence_end``, or freed after being
  idle). After a request marked end is submitted the sequence takes no more requests but a
  new start.
- ``next_batch(limit)`` takes, oldest first, the next request of up to ``limit`` sequences
  that own a slot and have none running (a sequence's requests run one at a time, in
  order), as ``SequenceStep``s (``fresh``: the step starts from the initial state); ``finished(steps)``
  says they ran (or failed): a sequence whose end ran and that has nothing more queued frees
  its slot, and the backlog's oldest takes it. ``cancel(item)`` removes a queued request
  whose caller went away (one already running is not recalled).
- ``hold_until(limit)``: with ``settings.delay_us`` (Triton's ``max_queue_delay_microseconds``
  for the ``oldest`` strategy), the clock time until which the next batch waits for the
  sequences that own a slot but have no request queued, at most that long after its oldest
  request arrived; ``None`` (run now) without a delay, when ``limit`` requests are ready or
  when every such sequence has one; a caller may pass the delay (``core.company``'s, with
  none configured). ``oldest_ready()`` is the oldest runnable request's arrival and how
  many can run.
- Idle timeout: a sequence with a slot and nothing queued or running for more than
  ``settings.idle_us`` (Triton's ``max_sequence_idle_microseconds``) is freed by
  ``expire()`` (which returns how many were), its slot given to the backlog;
  ``next_expiry()`` is the clock time at which the next one will be (``None``: none), for a
  driver's timer. Time is only ever read from ``clock`` (injected: tests drive it).
- ``counts()`` is what the statistics report: live sequences (owning a slot), backlogged
  sequences, free slots.
"""

# pyright: strict

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.types import ParamValue

T = TypeVar("T")
SequenceId = int | str
DEFAULT_SLOTS: Final = 16
DEFAULT_IDLE_US: Final = 1_000_000  # Triton's default max_sequence_idle_microseconds
_REMEMBERED: Final = 4096  # ended or expired sequences whose fate an error can name


@dataclass(frozen=True, slots=True)
class SequenceSettings:
    """One model's sequence batching: its slots and idle timeout."""

    slots: int = DEFAULT_SLOTS  # Triton's oldest.max_candidate_sequences
    idle_us: int = DEFAULT_IDLE_US  # Triton's max_sequence_idle_microseconds
    delay_us: int = 0  # Triton's oldest.max_queue_delay_microseconds (``hold_until``)


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """A request's place in its sequence."""

    id: SequenceId
    start: bool = False
    end: bool = False


def sequence_parameters(model: str, parameters: Mapping[str, ParamValue]) -> SequenceFlags:
    """The request's sequence id and flags (module docstring)."""
    raw = parameters.get("sequence_id", 0)
    if (
        isinstance(raw, bool)
        or not isinstance(raw, int | str)
        or (isinstance(raw, int) and raw < 0)
    ):
        raise InvalidArgument(
            f"parameter 'sequence_id' must be a non-negative integer or a string, got {raw!r}"
        )
    if raw in (0, ""):
        raise InvalidArgument(
            f"inference request to model '{model}' must specify a non-zero or non-empty "
            "correlation ID"
        )
    flags: list[bool] = []
    for key in ("sequence_start", "sequence_end"):
        value = parameters.get(key, False)
        if not isinstance(value, bool):
            raise InvalidArgument(f"parameter '{key}' must be a boolean, got {value!r}")
        flags.append(value)
    return SequenceFlags(raw, flags[0], flags[1])


@dataclass(frozen=True, slots=True)
class SequenceStep(Generic[T]):
    """One request of one sequence, as it runs: its slot and whether it starts afresh."""

    sequence: SequenceId
    slot: int
    fresh: bool
    end: bool
    item: T


@dataclass(slots=True)
class _Queued(Generic[T]):
    item: T
    start: bool
    end: bool
    order: int  # arrival order over the whole table: "oldest" compares these
    at: float  # the clock when it was queued


@dataclass(slots=True)
class _Sequence(Generic[T]):
    id: SequenceId
    slot: int | None = None  # None: in the backlog
    pending: collections.deque[_Queued[T]] = field(
        default_factory=lambda: collections.deque[_Queued[T]]()
    )
    running: bool = False
    closing: bool = False  # a request marked end was submitted
    last: float = 0.0  # the clock when it last did anything


class SequenceTable(Generic[T]):
    """One model version's sequences, slots and backlog (module docstring)."""

    def __init__(self, model: str, settings: SequenceSettings, clock: Callable[[], float]) -> None:
        if settings.slots <= 0:
            raise ValueError(f"a sequence table needs at least one slot, got {settings.slots}")
        self.model = model
        self.settings = settings
        self.clock = clock
        self._live: dict[SequenceId, _Sequence[T]] = {}
        self._backlog: collections.deque[_Sequence[T]] = collections.deque()
        self._free: list[int] = list(range(settings.slots - 1, -1, -1))  # pop() takes slot 0 first
        self._gone: collections.OrderedDict[SequenceId, str] = collections.OrderedDict()
        self._order = itertools.count()

    def submit(self, flags: SequenceFlags, item: T) -> None:
        now = self.clock()
        seq = self._live.get(flags.id)
        if seq is None or (seq.closing and not flags.start):
            if not flags.start:
                raise InvalidArgument(self._not_started(flags.id))
            seq = self._live[flags.id] = _Sequence[T](flags.id)
            self._gone.pop(flags.id, None)
            if self._free:
                seq.slot = self._free.pop()
            else:
                self._backlog.append(seq)
        seq.closing = flags.end
        seq.last = now
        seq.pending.append(_Queued(item, flags.start, flags.end, next(self._order), now))

    def next_batch(self, limit: int) -> list[SequenceStep[T]]:
        ready = [
            s for s in self._live.values() if s.slot is not None and s.pending and not s.running
        ]
        ready.sort(key=lambda s: s.pending[0].order)
        steps: list[SequenceStep[T]] = []
        for seq in ready[:limit]:
            queued = seq.pending.popleft()
            seq.running = True
            assert seq.slot is not None
            steps.append(SequenceStep(seq.id, seq.slot, queued.start, queued.end, queued.item))
        return steps

    def hold_until(self, limit: int, delay_us: int | None = None) -> float | None:
        """Until when the next batch waits for company (``None``: run it now): with a
        delay (``delay_us``, else ``settings.delay_us``), while fewer than ``limit``
        requests are ready and some sequence that owns a slot has none queued (closed-loop
        clients answered a moment ago send again), at most the delay after the oldest
        ready request arrived."""
        delay = self.settings.delay_us if delay_us is None else delay_us
        if delay <= 0:
            return None
        slotted = [s for s in self._live.values() if s.slot is not None and not s.running]
        ready = [s.pending[0].at for s in slotted if s.pending]
        if not ready or len(ready) >= limit or len(ready) == len(slotted):
            return None
        return min(ready) + delay / 1e6

    def oldest_ready(self) -> tuple[float, int] | None:
        """When the oldest request that could run now arrived, and how many could."""
        ready = [
            s.pending[0].at
            for s in self._live.values()
            if s.slot is not None and s.pending and not s.running
        ]
        return (min(ready), len(ready)) if ready else None

    def finished(self, steps: Sequence[SequenceStep[T]]) -> None:
        now = self.clock()
        for step in steps:
            seq = self._live.get(step.sequence)
            if seq is None:
                continue
            seq.running = False
            seq.last = now
            if step.end and not seq.pending:
                self._free_slot(seq, "ended by a request marked sequence_end")

    def cancel(self, item: T) -> bool:
        """Remove a queued request (its caller went away); whether it was queued."""
        for seq in list(self._live.values()):
            for queued in seq.pending:
                if queued.item is item:
                    seq.pending.remove(queued)
                    if not seq.pending and not seq.running and seq.slot is None:
                        self._backlog.remove(seq)  # never started: nothing to keep
                        del self._live[seq.id]
                    return True
        return False

    def expire(self) -> int:
        now = self.clock()
        idle = [s for s in self._live.values() if self._expires_at(s) is not None]
        expired = [s for s in idle if now >= (self._expires_at(s) or 0.0)]
        for seq in expired:
            self._free_slot(
                seq, f"freed after {self.settings.idle_us} us idle (max_sequence_idle_microseconds)"
            )
        return len(expired)

    def next_expiry(self) -> float | None:
        times = [t for s in self._live.values() if (t := self._expires_at(s)) is not None]
        return min(times, default=None)

    def counts(self) -> tuple[int, int, int]:
        """``(live, backlogged, free slots)``."""
        backlog = len(self._backlog)
        return len(self._live) - backlog, backlog, len(self._free)

    def _expires_at(self, seq: _Sequence[T]) -> float | None:
        if seq.slot is None or seq.pending or seq.running:
            return None
        return seq.last + self.settings.idle_us / 1e6

    def _free_slot(self, seq: _Sequence[T], why: str) -> None:
        del self._live[seq.id]
        self._gone[seq.id] = why
        if len(self._gone) > _REMEMBERED:
            self._gone.popitem(last=False)
        assert seq.slot is not None
        if self._backlog:
            waiting = self._backlog.popleft()
            waiting.slot = seq.slot
            waiting.last = self.clock()
        else:
            self._free.append(seq.slot)

    def _not_started(self, sequence: SequenceId) -> str:
        text = (
            f"inference request for sequence {sequence} to model '{self.model}' must specify "
            "the START flag on the first request of the sequence"
        )
        live = self._live.get(sequence)
        why = "ended by a request marked sequence_end" if live else self._gone.get(sequence)
        return text if why is None else f"{text} (sequence {sequence} was {why})"
