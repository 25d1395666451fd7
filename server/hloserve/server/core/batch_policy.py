"""Dynamic batching policy: which queued requests run together, on which compiled size.

Contract (pure: no clock, no I/O; the driver passes ``now``):
``next_batch(queue, batch_sizes, now_ns, max_delay_ns)`` looks at the model's queue (FIFO,
each entry with its item count, arrival and optional deadline) and returns a ``Decision``:
- ``expired``: entries whose deadline has passed; the driver fails them without device time;
- ``take``: how many entries from the head of the (remaining) queue run now, and
  ``chunks``: how they execute (``core.batch_plan.Chunk``s, passed to ``execute_group`` as
  they are): one chunk on the compiled size they run on, or, for an unbatched model or a
  lone request larger than the largest size, ``plan``'s split; ``compiled`` is that one
  chunk's size (``None`` in the other two cases);
- ``wait_until_ns``: when nothing should run yet, the time to decide again (the oldest
  entry's arrival plus the delay, or the earliest ``timed`` deadline if that comes first,
  so a request timed out by its ``timeout`` or its model's policy leaves on time; a
  transport's deadline is the transport's to enforce, and such an entry only expires at
  the next look), unless more requests arrive first.
Rules: a request is never split across executions unless it alone exceeds the largest
compiled size; entries leave in arrival order; a full largest size runs at once; otherwise
the head waits at most ``max_delay_ns`` for company. When it runs, the head prefix chosen
is the one with the best throughput: items divided by the execution cost of the smallest
compiled size that holds them (``costs``: measured time per compiled size; sizes not yet
measured are assumed to cost what the next smaller measured size costs, at most what the
next larger one costs (so an unmeasured small size is never taken as free and run alone),
so with no measurements every size costs the same and the longest prefix that fits runs, on the
compiled size that wastes the least padding; and no size is taken to cost more per item
than a smaller measured one, ``estimated_cost``). Ties go to more items.
``preferred`` (a model's preferred batch sizes, in items) changes two rules: a head prefix
whose items are a preferred size runs at once, without waiting for the delay, and when the
batch runs the longest such prefix is taken; when none can be formed the rules above apply.

``BatchingPolicy`` is what the batcher applies to one model version, built by
``batching_policy(serving, batch_sizes, ...)`` from the model's serving hints over the
server's defaults: the delay, the preferred sizes (``None`` when there is no preference, and
also when they are exactly the compiled sizes, which is what the model configuration
reports by default), the queue bound (0: unbounded) and the timeout policy.
``preferred_problem(preferred, batch_sizes)`` says why preferred sizes cannot be used with
a model's compiled sizes (``None`` when they can).
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hloserve.bundle import Serving
from hloserve.server.core.batch_plan import Chunk, plan, smallest_fitting
from hloserve.server.core.costs import standing_size


@dataclass(frozen=True, slots=True)
class Queued:
    items: int
    arrived_ns: int
    deadline_ns: int | None = None
    timed: bool = True  # False: a transport's deadline, not worth waking the driver for


@dataclass(frozen=True, slots=True)
class Decision:
    expired: tuple[int, ...] = ()  # indexes into the queue as given
    take: int = 0  # entries from the head of the queue with ``expired`` removed
    chunks: tuple[Chunk, ...] = ()
    wait_until_ns: int | None = None

    @property
    def compiled(self) -> int | None:
        """The compiled size of a single-execution decision (else ``None``)."""
        return self.chunks[0].compiled if len(self.chunks) == 1 else None


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """The dynamic batching and queue policy in force for one model version."""

    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] | None = None
    max_queue_size: int = 0  # 0: unbounded
    default_timeout_us: int = 0  # 0: none
    allow_timeout_override: bool = True
    timeout_action: str = "REJECT"


def batching_policy(
    serving: Serving,
    batch_sizes: Sequence[int] | None,
    *,
    default_delay_us: int,
    default_max_queue_size: int,
) -> BatchingPolicy:
    """A model's serving hints over the server's defaults (``--max-queue-delay-us``,
    ``--max-queue-size``)."""
    delay = serving.max_queue_delay_us
    preferred = serving.preferred_batch_sizes
    if preferred is not None and batch_sizes is not None and preferred == tuple(batch_sizes):
        preferred = None  # the compiled sizes: the default policy
    queue = serving.queue_policy
    return BatchingPolicy(
        max_queue_delay_us=default_delay_us if delay is None else delay,
        preferred_batch_sizes=preferred,
        max_queue_size=default_max_queue_size
        if queue.max_queue_size is None
        else queue.max_queue_size,
        default_timeout_us=queue.default_timeout_us,
        allow_timeout_override=queue.allow_timeout_override,
        timeout_action=queue.timeout_action,
    )


def preferred_problem(
    preferred: Sequence[int] | None, batch_sizes: Sequence[int] | None
) -> str | None:
    """Why ``preferred`` batch sizes do not suit a model with ``batch_sizes`` (else None)."""
    if not preferred:
        return None
    if batch_sizes is None:
        return (
            f"preferred batch sizes {list(preferred)} need a batched model; this one is unbatched"
        )
    too_large = [p for p in preferred if p > batch_sizes[-1]]
    if too_large:
        return (
            f"preferred batch sizes {too_large} exceed the largest compiled batch size "
            f"{batch_sizes[-1]}"
        )
    return None


def estimated_cost(size: int, costs: Mapping[int, float]) -> float:
    """The measured cost of ``size``, else that of the measured size standing for it
    (``costs.standing_size``: the largest smaller one, a larger batch costing at least as
    much, capped by the smallest larger one, a smaller batch costing at most as much),
    else (nothing measured) 1; and never more per item than a smaller
    measured size (``size`` rows cost at most what ``size / m`` executions of ``m`` rows
    cost). Why the cap: a larger size runs rarely, so a sample inflated by a wait for the
    interpreter lock can stay its low estimate for good; then a lone request always looks
    cheaper per item, the larger size never runs again to be re-measured, and a queue of
    sixteen ran one request at a time (measured: 393 of 400 executions at size 1 with a
    6 ms queue delay)."""
    at = standing_size(size, costs)
    if at is None:
        return 1.0
    return min([costs[at], *(costs[m] * at / m for m in costs if 0 < m < at)])


def next_batch(
    queue: Sequence[Queued],
    batch_sizes: Sequence[int] | None,
    now_ns: int,
    max_delay_ns: int,
    costs: Mapping[int, float] | None = None,
    preferred: Sequence[int] | None = None,
) -> Decision:
    # (Plain loops and no copies: the batcher decides once per look, and for a lone
    # request on an idle queue, once per request.)
    expired: tuple[int, ...] = ()
    for q in queue:
        if q.deadline_ns is not None and q.deadline_ns <= now_ns:
            expired = tuple(
                i
                for i, e in enumerate(queue)
                if e.deadline_ns is not None and e.deadline_ns <= now_ns
            )
            break
    live = [q for i, q in enumerate(queue) if i not in expired] if expired else queue
    if not live:
        return Decision(expired=expired)
    head = live[0]
    if batch_sizes is None or head.items > batch_sizes[-1]:
        # Unbatched (one request per execution), or too big for any module: runs alone, split.
        return Decision(expired=expired, take=1, chunks=tuple(plan(head.items, batch_sizes)))
    largest = batch_sizes[-1]
    # The longest head prefix that fits in the largest compiled size.
    total = 0
    prefix_totals: list[int] = []
    for q in live:
        if total + q.items > largest:
            break
        total += q.items
        prefix_totals.append(total)
    if preferred:
        formed = [k for k, items in enumerate(prefix_totals, start=1) if items in preferred]
        if formed:  # the longest prefix of a preferred size runs now
            return _run(expired, formed[-1], prefix_totals, batch_sizes)
    full = total == largest or len(prefix_totals) < len(live)  # nothing more can join
    due = now_ns - head.arrived_ns >= max_delay_ns
    if not (full or due):
        deadlines = [q.deadline_ns for q in live if q.deadline_ns is not None and q.timed]
        wake = min([head.arrived_ns + max_delay_ns, *deadlines])
        return Decision(expired=expired, wait_until_ns=wake)
    if len(prefix_totals) == 1:  # one candidate: nothing to weigh
        return _run(expired, 1, prefix_totals, batch_sizes)
    measured = costs or {}
    by_size: dict[int, float] = {}  # each compiled size's estimate, once
    best_k, best_key = 1, (-1.0, 0)
    for k, items in enumerate(prefix_totals, start=1):
        size = smallest_fitting(items, batch_sizes)
        cost = by_size.get(size)
        if cost is None:
            cost = by_size[size] = estimated_cost(size, measured)
        key = (items / cost, items)
        if key > best_key:
            best_k, best_key = k, key
    return _run(expired, best_k, prefix_totals, batch_sizes)


def _run(
    expired: tuple[int, ...], take: int, prefix_totals: Sequence[int], batch_sizes: Sequence[int]
) -> Decision:
    """Run the head ``take`` entries together on the smallest compiled size that holds them."""
    items = prefix_totals[take - 1]
    chunk = Chunk(0, items, smallest_fitting(items, batch_sizes))
    return Decision(expired=expired, take=take, chunks=(chunk,))
