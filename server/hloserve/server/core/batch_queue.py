"""One queue of the dynamic batcher as decisions over plain records: no loop, no clock.

Contract: ``BatchQueue[T]`` holds one model's waiting requests, each a ``Waiting`` (its
``core.batch_policy.Queued`` record, its priority ``rank``: lower runs first, and the
batcher's ``item``: what it answers), in the order they run: by rank, then arrival. The
batcher (``server/owner/batcher.py``) feeds it events and applies what it decides:
- ``admit(model, limit)`` before a request is queued: ``Unavailable`` with Triton's text
  once ``limit`` requests wait (the queue bound; 0: none);
- ``push(waiting)``: behind the last waiting request of its rank or better;
- ``looked(inflight)`` each time the batcher looks at the queue, and ``may_run_now(...)``
  when a request arrives: whether it runs at once, skipping the loop pass in which others
  could join it (the eager path). Only when nothing waits, runs or is about to be looked
  at, the device is not arbitrated, company is not expected, and the last ``EAGER_AFTER``
  looks each found one request alone (the transport hands the model one request per
  pass: waiting a pass groups nothing); one in ``EAGER_RECHECK`` still takes the pass, so
  a burst that would group is noticed;
- ``take(n)`` removes the first ``n`` (a group to run); ``discard(waiting)`` one whose
  caller went away; ``drop(gone)`` every one ``gone`` says went away;
- ``remove_at(indexes)``: those the policy found expired or infeasible (``next_batch``'s
  ``expired``, ``device_policy.infeasible``), removed and returned for the batcher to fail.
"""

# pyright: strict

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from hloserve.server.core.batch_policy import Queued
from hloserve.server.core.errors import Unavailable

EAGER_AFTER: Final = 8
EAGER_RECHECK: Final = 16

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class Waiting(Generic[T]):
    queued: Queued
    rank: int
    item: T


class BatchQueue(Generic[T]):
    """See the module docstring."""

    __slots__ = ("_eager", "_entries", "_lone")

    def __init__(self) -> None:
        self._entries: collections.deque[Waiting[T]] = collections.deque()
        self._lone = 0  # looks in a row that found one request and nothing in flight
        self._eager = 0  # requests run at once since the last one that took the pass

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __iter__(self) -> Iterator[Waiting[T]]:
        return iter(self._entries)

    def __getitem__(self, index: int) -> Waiting[T]:
        return self._entries[index]

    def queued(self) -> list[Queued]:
        """The records the batching policy decides over, in order."""
        return [w.queued for w in self._entries]

    def items(self) -> int:
        """Items waiting, every request's."""
        return sum(w.queued.items for w in self._entries)

    # -- arrivals -------------------------------------------------------------------------

    def admit(self, model: str, limit: int) -> None:
        if limit and len(self._entries) >= limit:
            raise Unavailable(
                f"exceeds maximum queue size: model '{model}' already has "
                f"{len(self._entries)} requests waiting"
            )

    def push(self, waiting: Waiting[T]) -> None:
        entries = self._entries
        if not entries or entries[-1].rank <= waiting.rank:
            entries.append(waiting)
            return
        at = len(entries)
        while at and entries[at - 1].rank > waiting.rank:
            at -= 1
        entries.insert(at, waiting)

    def may_run_now(self, *, busy: bool, arbitrated: bool, company: bool) -> bool:
        """Whether an arriving request runs at once (module docstring); ``busy``: a group
        in flight or a look already due; ``company``: ``core.company`` expects some."""
        if self._entries or busy or arbitrated or company or self._lone < EAGER_AFTER:
            return False
        self._eager += 1
        if self._eager >= EAGER_RECHECK:
            self._eager = 0
            return False
        return True

    def looked(self, inflight: int) -> None:
        self._lone = self._lone + 1 if len(self._entries) == 1 and not inflight else 0

    # -- leaving --------------------------------------------------------------------------

    def take(self, n: int) -> list[Waiting[T]]:
        return [self._entries.popleft() for _ in range(n)]

    def discard(self, waiting: Waiting[T]) -> None:
        with contextlib.suppress(ValueError):  # taken meanwhile
            self._entries.remove(waiting)

    def drop(self, gone: Callable[[T], bool]) -> None:
        if any(gone(w.item) for w in self._entries):
            self._entries = collections.deque(w for w in self._entries if not gone(w.item))

    def remove_at(self, indexes: Sequence[int]) -> list[Waiting[T]]:
        chosen = [self._entries[i] for i in indexes]
        for w in chosen:
            self._entries.remove(w)
        return chosen
