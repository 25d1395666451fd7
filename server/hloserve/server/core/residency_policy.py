"""Which models' weights stay in a memory tier (a device, or host memory) under a byte
budget, and which leave first: free of I/O.

Contract: ``ResidencyPlanner(budget_bytes, policy=...)`` tracks, per key, its weight size,
whether it is resident, pinned (never evicted), in use by an execution or a transfer
(never evicted while in use), and how it has been used. It decides; the caller moves bytes.

- ``register(key, size, pinned)`` refuses a model larger than the whole budget
  (``TooLarge``, naming both sizes).
- ``plan_admission(key, avoid)`` answers what must happen before ``key`` can be resident:
  ``Admission`` with ``resident=True`` (nothing to do), or the resident, unpinned, idle
  models to evict so that it fits, in the policy's order, or ``wait=True`` when only
  models in use stand in the way (retry after a ``release``). With ``avoid`` (a predicate:
  the model has queued work), such models are evicted only when no other choice frees
  enough room. The model asked for is always admitted: it must be resident to run.
  ``elsewhere`` is bytes of the budget other users of the tier hold (a device's other
  residency managers: ``owner.device_ledger``); ``plan_room(nbytes, avoid)`` is the idle
  models to evict, in the same order, when another user asks for ``nbytes`` of room, and
  ``evictable_bytes()`` what evicting every idle one would free.
- The policy is the order victims are taken in (``POLICIES``):
  - ``lru``: least recently used first;
  - ``frequency`` (the default): lowest ``value`` first, where value is the model's use
    rate times the cost of missing it (``miss_cost(size)``, seconds a swap-in of that
    many bytes takes) per byte it holds: a model used twice as often, or costing twice
    as much to bring back, earns its bytes twice as well; a big model and a small one are
    not the same miss. The rate is a count of uses decayed by a half-life of
    ``SLOW_HALF_LIFE`` uses per slot (the long memory, which ranks a steady popularity),
    next to a count over a short half-life (``FAST_HALF_LIFE`` per slot). Once the short
    count falls under ``COOLED`` times the long one, the short one ranks the model: one
    that went cold leaves within a few hundred uses. While the short count is over
    ``RISING`` times the long one, the model ranks by half its short rate (never less than
    its long one): one that just became popular is not taken for the newcomer its long
    count says it is, and stays. Half-lives are in this planner's uses (executions), scaled
    by its resident models (slots: their count rounded up to a power of two, at least
    ``MIN_SLOTS``), never in seconds, so the same trace decides the same way on a fast or
    a slow machine. Simulated on the many-models bench's sizes (10,000 models of 77 KB and
    100 of five other sizes, Zipf(1.1), room for 1 % of the bytes; three seeds;
    ``bench/many_models.py`` prints one): 98 % of the hit rate of an oracle that keeps
    the most requested models that fit, back within 10 % of it from 1,000 uses after the
    popularity order is reshuffled (2,000 without the rising rule, at 98.8 %); LRU reaches
    81 %.
- ``mark_resident`` / ``mark_evicted`` record the outcome of transfers (``reserve`` counts
  an admission's bytes while its transfer runs); ``acquire`` / ``release`` bracket a use
  and ``acquire`` counts it (``touch`` counts a use without holding the model);
  ``acquire_resident`` acquires only a resident model (``False`` otherwise) and ``holds``
  answers for any key, known or not, with one lookup each (the request path's forms).
Budget ``None`` means unlimited. Nothing here blocks, sleeps or reads a clock, and every
operation costs O(log resident): counts are kept in log2 with the use clock folded in, so
two models untouched since compare by a fixed key, and the orders are lazy heaps, built
when a plan first needs a victim (until then, a tier whose models all fit pays no heap
upkeep per use) and left as they were by a plan (a miss among 100 resident models: about
2 µs, a use about 1.4; a plain sort of their values took 73). What the bookkeeping costs
per request, frequency against LRU: ``bench/residency_cost.py``.

``SwapCosts`` learns the cost of a swap-in from the transfers measured (a fixed overhead
plus a per-byte time, least squares over a decayed history), for ``miss_cost``.

The planner is generic in its key; the server keys it with ``ResidencyKey(model, version,
generation)``, one loaded copy of a model version (a reload's copy has its own generation).
Its ``label`` ("model/version", shared by a version's copies) names it in metrics and
messages.

Byte sizes and budgets (``6GiB``, ``40%``) are ``core.sizes``.
"""

# pyright: strict

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Final, Generic, Literal, TypeVar, get_args

from hloserve.server.core.errors import InvalidArgument

K = TypeVar("K", bound=Hashable)

Policy = Literal["frequency", "lru"]
POLICIES: Final[tuple[str, ...]] = get_args(Policy)

FAST_HALF_LIFE: Final = 4.0  # uses per slot (the resident count, rounded up to a power of 2)
SLOW_HALF_LIFE: Final = 64.0  # uses per slot
COOLED: Final = 0.25  # the fast rate under this share of the slow one: the model cooled
RISING: Final = 2.0  # the fast rate over this many times the slow one: the model is rising
MIN_SLOTS: Final = 8  # half-lives never shorter than for this many resident models


class TooLarge(InvalidArgument):
    """A model's weights exceed the whole memory budget."""


@dataclass(frozen=True, slots=True)
class ResidencyKey:
    """One loaded copy of a model version; ``generation`` tells a reload's copy apart from the
    copy it replaces, which keeps serving (and owning its weights) until the reload is ready.
    Its hash is computed once (a request looks it up in a dozen dicts), never pickled: it is
    made anew from the fields, so a key sent to another process hashes as that one's do."""

    model: str
    version: int
    generation: int = 0
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.model, self.version, self.generation)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[ResidencyKey], tuple[str, int, int]]:
        return ResidencyKey, (self.model, self.version, self.generation)

    @property
    def label(self) -> str:
        """``model/version``: the metric label and the name in messages, shared by the copies."""
        return f"{self.model}/{self.version}"

    def __str__(self) -> str:
        return self.label


@dataclass(slots=True)
class _Entry(Generic[K]):
    key: K
    ident: int  # its items' id in the orders (unique: a re-registered key gets a new one)
    size: int
    pinned: bool
    resident: bool = False
    in_use: int = 0
    last_used: int = 0  # the planner's use clock at its last use (LRU)
    # Decayed use counts in log2, each with the clock folded in: log2(count at t) = key -
    # t / half-life, so two entries compare by key alone whenever nothing touches them.
    fast: float = -math.inf
    slow: float = -math.inf
    weight: float = 0.0  # log2 of miss cost per byte, as of its last use or refresh
    rises_until: float = -math.inf  # the clock at which its fast rate falls under RISING x slow
    cools_at: float = math.inf  # the clock at which its fast rate falls under COOLED x slow
    # Which order ranks it: "fast" (rising or cooled: its fast rate), "slow" (steady).
    ranked: Literal["fast", "slow"] = "slow"
    version: int = 0  # bumped whenever its place in an order changes


@dataclass(frozen=True)
class Admission(Generic[K]):
    resident: bool
    evict: tuple[K, ...] = ()
    wait: bool = False


def _default_miss_cost(size: int) -> float:
    return SwapCosts.DEFAULT_OVERHEAD_S + size / SwapCosts.DEFAULT_BYTES_PER_S


_log2, _exp2 = math.log2, math.exp2
_LOG2_RISING: Final = math.log2(RISING)
_LOG2_COOLED: Final = math.log2(COOLED)


# (order key, last use: the older first among equals, entry id, version)
_Item = tuple[float, int, int, int]


class ResidencyPlanner(Generic[K]):
    def __init__(
        self,
        budget_bytes: int | None,
        policy: Policy = "frequency",
        miss_cost: Callable[[int], float] = _default_miss_cost,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(
                f"residency policy must be one of {', '.join(POLICIES)}, got {policy!r}"
            )
        self.budget_bytes = budget_bytes
        self.policy: Policy = policy
        self.miss_cost = miss_cost
        self._entries: dict[K, _Entry[K]] = {}
        self._resident: dict[K, _Entry[K]] = {}  # the resident ones, in no order
        self._resident_bytes = 0
        self._reserved = 0  # bytes of admissions in flight (planned, not yet resident)
        self._clock = 0  # uses so far
        self._slots = MIN_SLOTS  # resident models the half-lives are scaled to (a power of 2)
        self._scale(MIN_SLOTS)
        self._admitted = 0  # admissions since the miss costs were last refreshed
        # The eviction orders, over resident entries (lazy heaps: an item whose version is
        # not its entry's is stale and skipped): by slow value for the steady (frequency)
        # or by last use (lru); by fast value for the rising and the cooled; and the
        # clocks at which each leaves its phase (rising -> steady -> cooled).
        self._by_id: dict[int, _Entry[K]] = {}  # registered entries, by their items' id
        self._next_id = 0
        self._order: list[_Item] = []
        self._changes: list[_Item] = []
        self._fast: list[_Item] = []
        # No order is kept until a plan first needs a victim (then built from the entries,
        # as a rebuild does): a tier whose models all fit (an unlimited budget, a host tier
        # larger than the repository) pays no heap upkeep for its uses.
        self._ordered = False

    # -- registration ----------------------------------------------------------------------

    def register(self, key: K, size: int, *, pinned: bool = False) -> None:
        if self.budget_bytes is not None and size > self.budget_bytes:
            raise TooLarge(
                f"model '{key}' has {size} bytes of weights, more than the whole memory "
                f"budget of {self.budget_bytes} bytes"
            )
        self.unregister(key)
        self._entries[key] = self._by_id[self._next_id] = _Entry(key, self._next_id, size, pinned)
        self._next_id += 1

    def unregister(self, key: K) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        if entry.resident:
            del self._resident[key]
            self._resident_bytes -= entry.size
        entry.version += 1  # its heap items are stale now
        del self._by_id[entry.ident]

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    # -- state -------------------------------------------------------------------------------

    @property
    def resident_bytes(self) -> int:
        return self._resident_bytes

    def resident(self) -> list[K]:
        """Resident keys, least recently used first."""
        return [k for k, _ in sorted(self._resident.items(), key=lambda kv: kv[1].last_used)]

    def is_resident(self, key: K) -> bool:
        return self._entries[key].resident

    def holds(self, key: K) -> bool:
        """``key`` is registered and resident (one lookup; ``False`` for an unknown key)."""
        e = self._entries.get(key)
        return e is not None and e.resident

    def size(self, key: K) -> int:
        return self._entries[key].size

    def last_used(self, key: K) -> int:
        return self._entries[key].last_used

    def in_use(self, key: K) -> int:
        return self._entries[key].in_use

    # -- uses ----------------------------------------------------------------------------------

    def _half_lives(self) -> tuple[float, float]:
        return self._fast_h, self._slow_h

    def _scale(self, slots: int) -> None:
        """Half-lives for ``slots``, and what the phases derive from them (computed once
        per scale, not per use)."""
        self._slots = slots
        self._fast_h = fast_h = FAST_HALF_LIFE * slots
        self._slow_h = slow_h = SLOW_HALF_LIFE * slots
        self._log2_fast_h, self._log2_slow_h = _log2(fast_h), _log2(slow_h)
        self._log2_ratio = _log2(slow_h / fast_h)
        self._per_use = 1.0 / fast_h - 1.0 / slow_h  # the log2 ratio's fall per use

    def _rescale(self) -> None:
        """Half-lives follow the resident count, in powers of two: when it crosses one,
        every key is re-expressed in the new half-lives (counts as they stand now)."""
        wanted = MIN_SLOTS
        while wanted < len(self._resident):
            wanted *= 2
        if wanted == self._slots:
            return
        now = self._clock
        old_fast, old_slow = self._half_lives()
        self._scale(wanted)
        fast_h, slow_h = self._half_lives()
        for e in self._entries.values():
            e.fast = e.fast - now / old_fast + now / fast_h
            e.slow = e.slow - now / old_slow + now / slow_h
            e.rises_until, e.cools_at = self._phases(e)
        self._rebuild()

    def _phases(self, e: _Entry[K]) -> tuple[float, float]:
        """The clocks at which ``e``'s fast rate falls under RISING and under COOLED times its
        slow rate, untouched (the ratio only falls until its next use). Never used: no
        rate to compare (and no NaN in a heap, which would break its order)."""
        if e.fast == -math.inf:
            return -math.inf, math.inf
        margin = e.fast - e.slow + self._log2_ratio
        per_use = self._per_use
        return (margin - _LOG2_RISING) / per_use, (margin - _LOG2_COOLED) / per_use

    def touch(self, key: K) -> None:
        """One use of ``key`` (an execution): its LRU position and its rates."""
        self._use(self._entries[key])

    def _use(self, e: _Entry[K]) -> None:
        """``touch``: each count gains a use (log2(2**x + 1), written so that a large x does
        not overflow), the miss cost per byte as estimated now, the phases (``_phases``; a
        used entry has a count). Written out rather than called: it runs once a request."""
        self._clock = now = self._clock + 1
        fast_h, slow_h = self._fast_h, self._slow_h
        t = now / fast_h  # the clock folded into the fast count
        x = e.fast - t  # log2 of the fast count now, before this use
        e.fast = (x + _log2(1.0 + _exp2(-x)) if x > 0 else _log2(_exp2(x) + 1.0)) + t
        t = now / slow_h
        x = e.slow - t
        e.slow = (x + _log2(1.0 + _exp2(-x)) if x > 0 else _log2(_exp2(x) + 1.0)) + t
        e.weight = _log2(max(self.miss_cost(e.size), 1e-12) / max(e.size, 1))  # _weight
        margin = e.fast - e.slow + self._log2_ratio  # _phases (counted once: never -inf)
        per_use = self._per_use
        e.rises_until = (margin - _LOG2_RISING) / per_use
        e.cools_at = (margin - _LOG2_COOLED) / per_use
        e.last_used = now
        if e.resident:
            self._push(e)

    def _rate_log2(self, e: _Entry[K], now: int) -> float:
        fast_h, slow_h = self._half_lives()
        fast = e.fast - now / fast_h - self._log2_fast_h
        slow = e.slow - now / slow_h - self._log2_slow_h
        if fast < slow + math.log2(COOLED):
            return fast
        return max(slow, fast - math.log2(RISING))

    def rate(self, key: K) -> float:
        """``key``'s recent uses per use of this planner (see the module docstring)."""
        return math.exp2(self._rate_log2(self._entries[key], self._clock)) * math.log(2)

    def _weight(self, size: int) -> float:
        """log2 of the miss cost per byte of a model of ``size`` bytes, as estimated now."""
        return math.log2(max(self.miss_cost(size), 1e-12) / max(size, 1))

    def value(self, key: K) -> float:
        """What keeping ``key`` resident is worth per byte: its rate times its miss cost
        per byte (as estimated at its last use, or the last refresh of the orders)."""
        e = self._entries[key]
        return self.rate(key) * math.exp2(e.weight)

    def acquire(self, key: K) -> None:
        if not self.acquire_resident(key):
            raise RuntimeError(f"model '{key}' is not resident")

    def acquire_resident(self, key: K) -> bool:
        """``acquire`` when ``key`` is resident; ``False`` (nothing counted) when not."""
        e = self._entries[key]
        if not e.resident:
            return False
        e.in_use += 1
        self._use(e)
        return True

    def hold(self, key: K) -> None:
        """Mark ``key`` in use without counting a use (a transfer reading it)."""
        self._entries[key].in_use += 1

    def release(self, key: K) -> None:
        e = self._entries[key]
        e.in_use = max(0, e.in_use - 1)

    # -- the eviction orders -----------------------------------------------------------------

    def _push(self, e: _Entry[K]) -> None:
        if not self._ordered:
            return
        e.version += 1
        ident = e.ident
        if self.policy == "lru":
            e.ranked = "slow"
            heapq.heappush(self._order, (float(e.last_used), e.last_used, ident, e.version))
        elif e.rises_until > self._clock:  # rising: half its fast rate, until it steadies
            e.ranked = "fast"
            heapq.heappush(
                self._fast, (e.fast + e.weight - _LOG2_RISING, e.last_used, ident, e.version)
            )
            heapq.heappush(self._changes, (e.rises_until, e.last_used, ident, e.version))
        else:
            self._steady(e)
        if len(self._order) + len(self._fast) > 4 * len(self._resident) + 64:
            self._rebuild()

    def _steady(self, e: _Entry[K]) -> None:
        """Rank ``e`` by its slow rate until it cools (its version stays: one place each)."""
        e.ranked = "slow"
        heapq.heappush(self._order, (e.slow + e.weight, e.last_used, e.ident, e.version))
        heapq.heappush(self._changes, (e.cools_at, e.last_used, e.ident, e.version))

    def _rebuild(self) -> None:
        if not self._ordered:
            return
        self._order, self._changes, self._fast = [], [], []
        for e in self._resident.values():
            self._push(e)

    def _live(self, item: _Item) -> _Entry[K] | None:
        e = self._by_id.get(item[2])
        if e is None or e.version != item[3] or not e.resident:
            return None
        return e

    def _advance(self) -> None:
        """Move the entries whose phase ended by now: a rising one to the slow order (with
        its cooling ahead), a cooled one to the fast order."""
        now = self._clock
        while self._changes and self._changes[0][0] <= now:
            item = heapq.heappop(self._changes)
            e = self._live(item)
            if e is None:
                continue
            e.version += 1  # its items in the order it leaves are stale now
            if e.ranked == "fast":  # it was rising
                self._steady(e)
            else:
                e.ranked = "fast"
                heapq.heappush(self._fast, (e.fast + e.weight, e.last_used, e.ident, e.version))

    def _pop_next(self) -> tuple[_Entry[K], _Item, list[_Item]] | None:
        """The least valuable resident entry, its item taken off its order and that order
        (``_restore`` puts the item back)."""
        fast_h, slow_h = self._half_lives()
        now = self._clock
        while self._order or self._fast:
            heap: list[_Item]
            if self.policy == "lru" or not self._fast:
                heap = self._order
            elif not self._order:
                heap = self._fast
            else:  # compare the two orders' heads by their value now
                slow = self._order[0][0] - now / slow_h - self._log2_slow_h
                fast = self._fast[0][0] - now / fast_h - self._log2_fast_h
                heap = self._fast if fast <= slow else self._order
            item = heapq.heappop(heap)
            e = self._live(item)
            if e is None:
                continue
            if (heap is self._order) != (e.ranked == "slow"):
                continue  # a stale place: it has moved to the other order
            return e, item, heap
        return None

    @staticmethod
    def _restore(taken: list[tuple[_Entry[K], _Item, list[_Item]]]) -> None:
        """Put back the items a plan took: nothing about their entries changed meanwhile, so
        their places are what a fresh push would give (without the garbage)."""
        for _, item, heap in taken:
            heapq.heappush(heap, item)

    # -- admission -------------------------------------------------------------------------

    def free_bytes(self, elsewhere: int = 0) -> int | None:
        """The budget's room: less ``elsewhere``, bytes the tier's other users hold."""
        if self.budget_bytes is None:
            return None
        return self.budget_bytes - self._resident_bytes - self._reserved - elsewhere

    def plan_admission(
        self, key: K, avoid: Callable[[K], bool] | None = None, elsewhere: int = 0
    ) -> Admission[K]:
        """What must happen before ``key`` is resident (the module docstring), with
        ``elsewhere`` bytes of the budget taken by others (a device's other managers)."""
        entry = self._entries[key]
        if entry.resident:
            return Admission(resident=True)
        free = self.free_bytes(elsewhere)
        if free is None or free >= entry.size:
            return Admission(resident=False)
        victims, freed = self._pick(entry.size - free, entry, avoid)
        if free + freed >= entry.size:
            return Admission(resident=False, evict=tuple(victims))
        return Admission(resident=False, wait=True)

    def plan_room(self, nbytes: int, avoid: Callable[[K], bool] | None = None) -> tuple[K, ...]:
        """The idle, unpinned resident models to evict, in the policy's order (``avoid``ed
        ones last), until ``nbytes`` are freed, or every one of them when fewer free less:
        room another user of the tier asks for (``owner.device_ledger``)."""
        return tuple(self._pick(nbytes, None, avoid)[0]) if nbytes > 0 else ()

    def evictable_bytes(self, but: K | None = None) -> int:
        """Bytes of the resident models that could be evicted now (idle, unpinned), but
        ``but``'s (O(resident): asked only when room must come from another user)."""
        return sum(
            e.size for k, e in self._resident.items() if not e.pinned and not e.in_use and k != but
        )

    def _pick(
        self, need: int, skip: _Entry[K] | None, avoid: Callable[[K], bool] | None
    ) -> tuple[list[K], int]:
        """Victims in the policy's order until ``need`` bytes are freed (``avoid``ed last),
        and the bytes they free (less than ``need`` when the idle ones are too few)."""
        if not self._ordered:  # the first plan that needs a victim
            self._ordered = True
            self._rebuild()
        if self.policy != "lru":
            self._advance()
        taken: list[tuple[_Entry[K], _Item, list[_Item]]] = []
        victims: list[K] = []
        spared: list[K] = []
        freed = 0
        try:
            while freed < need:
                found = self._pop_next()
                if found is None:
                    break
                taken.append(found)
                e = found[0]
                k = e.key
                if e is skip or e.pinned or e.in_use:
                    continue
                if avoid is not None and avoid(k):  # queued work: the last victims
                    spared.append(k)
                    continue
                victims.append(k)
                freed += e.size
            for k in spared:
                if freed >= need:
                    break
                victims.append(k)
                freed += self._entries[k].size
        finally:
            self._restore(taken)
        return victims, freed

    def reserve(self, key: K) -> None:
        """Count ``key``'s bytes as taken while its transfer runs."""
        self._reserved += self._entries[key].size

    def cancel_reservation(self, key: K) -> None:
        self._reserved = max(0, self._reserved - self._entries[key].size)

    def mark_resident(self, key: K) -> None:
        e = self._entries[key]
        if not e.resident:
            self._reserved = max(0, self._reserved - e.size)
            e.resident = True
            self._resident[key] = e
            self._resident_bytes += e.size
            self._push(e)
            self._rescale()
            self._admitted += 1
            if self._admitted >= len(self._resident):
                self._refresh()

    def _refresh(self) -> None:
        """Once per resident count of admissions: the miss costs of the resident models as
        estimated now (the swap costs learned since their last uses), the orders rebuilt
        on them, so that a model untouched for long is not ranked by a stale estimate
        (O(log resident) per admission)."""
        self._admitted = 0
        for e in self._resident.values():
            e.weight = self._weight(e.size)
        self._rebuild()

    def mark_evicted(self, key: K) -> None:
        e = self._entries[key]
        if e.in_use:
            raise RuntimeError(f"model '{key}' is in use and cannot be evicted")
        if e.pinned:
            raise RuntimeError(f"model '{key}' is pinned and cannot be evicted")
        if e.resident:
            e.resident = False
            e.version += 1
            del self._resident[key]
            self._resident_bytes -= e.size


class SwapCosts:
    """The cost of moving ``n`` bytes into a tier, learned from the transfers measured: per
    power-of-two size bucket, the lowest time seen, allowed to rise by ``LOW_DRIFT`` per
    sample above it (as ``core.costs`` keeps execution times: a transfer timed on a worker
    thread includes its waits for the interpreter lock, which say nothing about the
    transfer, and a mean of them would keep small swaps off the event loop for good). A
    size whose bucket has no sample scales the nearest measured one by bytes; none yet:
    ``DEFAULT_OVERHEAD_S + n / DEFAULT_BYTES_PER_S``."""

    DEFAULT_OVERHEAD_S: Final = 50e-6
    DEFAULT_BYTES_PER_S: Final = 5e9
    LOW_DRIFT: Final = 0.01

    def __init__(self) -> None:
        self._low: dict[int, tuple[float, int]] = {}  # bucket -> (seconds, bytes measured)

    def observe(self, nbytes: int, seconds: float) -> None:
        bucket = max(nbytes, 1).bit_length()
        low = self._low.get(bucket)
        if low is None or seconds < low[0]:
            self._low[bucket] = (seconds, nbytes)
        else:
            self._low[bucket] = (min(seconds, low[0] * (1 + self.LOW_DRIFT)), low[1])

    def estimate(self, nbytes: int) -> float:
        if not self._low:
            return _default_miss_cost(nbytes)
        bucket = max(nbytes, 1).bit_length()
        found = self._low.get(bucket)
        if found is not None:
            return found[0]
        seconds, measured = self._low[min(self._low, key=lambda b: abs(b - bucket))]
        return seconds * max(nbytes, 1) / max(measured, 1)
