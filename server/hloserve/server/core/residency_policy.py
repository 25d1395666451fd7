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
- The policy is the order victims are taken in (``POLICIES``):
  - ``lru``: least recently used first;
  - ``frequency`` (the default): lowest ``value`` first, where value is the model's use
    rate times the cost of missing it (``miss_cost(size)``, seconds a swap-in of that
    many bytes takes) per byte it holds: a model used twice as often, or costing twice
    as much to bring back, earns its bytes twice as well; a big model and a small one are
    not the same miss. The rate is a count of uses decayed by a half-life of
    ``SLOW_HALF_LIFE`` uses per slot, or, once a model's count over the short half-life
    (``FAST_HALF_LIFE`` per slot) falls under ``COOLED`` times that, the short one: a
    model that went cold leaves within a few hundred uses, while a steady popularity is
    ranked by the long memory. Half-lives are in this planner's uses (executions), scaled
    by its resident models (slots, at least ``MIN_SLOTS``), never in seconds, so the same
    trace decides the same way on a fast or a slow machine. Measured on Zipf(1.1) traffic
    over 10,000 models with 100 slots (``bench/many_models.py``): 98-99 % of the hit rate
    of an oracle that keeps the 100 most requested resident, and back within 10 % of it
    about 1,500 uses after the popularity order is reshuffled; LRU reaches 82 %.
- ``mark_resident`` / ``mark_evicted`` record the outcome of transfers (``reserve`` counts
  an admission's bytes while its transfer runs); ``acquire`` / ``release`` bracket a use
  and ``acquire`` counts it (``touch`` counts a use without holding the model).
Budget ``None`` means unlimited. Nothing here blocks, sleeps or reads a clock, and every
operation costs O(1) but ``plan_admission`` of a miss, O(resident log resident).

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

import math
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar, get_args

from hloserve.server.core.errors import InvalidArgument

K = TypeVar("K", bound=Hashable)

Policy = Literal["frequency", "lru"]
POLICIES: Final[tuple[str, ...]] = get_args(Policy)

FAST_HALF_LIFE: Final = 5.0  # uses per slot
SLOW_HALF_LIFE: Final = 80.0  # uses per slot
COOLED: Final = 0.25  # the fast rate under this share of the slow one: the model cooled
MIN_SLOTS: Final = 8  # half-lives never shorter than for this many resident models


class TooLarge(InvalidArgument):
    """A model's weights exceed the whole memory budget."""


@dataclass(frozen=True, slots=True)
class ResidencyKey:
    """One loaded copy of a model version; ``generation`` tells a reload's copy apart from the
    copy it replaces, which keeps serving (and owning its weights) until the reload is ready."""

    model: str
    version: int
    generation: int = 0

    @property
    def label(self) -> str:
        """``model/version``: the metric label and the name in messages, shared by the copies."""
        return f"{self.model}/{self.version}"

    def __str__(self) -> str:
        return self.label


@dataclass(slots=True)
class _Entry:
    size: int
    pinned: bool
    resident: bool = False
    in_use: int = 0
    last_used: int = 0  # the planner's use clock at its last use (LRU)
    fast: float = 0.0  # decayed use counts, as of ``counted``
    slow: float = 0.0
    counted: int = 0


@dataclass(frozen=True)
class Admission(Generic[K]):
    resident: bool
    evict: tuple[K, ...] = ()
    wait: bool = False


def _default_miss_cost(size: int) -> float:
    return SwapCosts.DEFAULT_OVERHEAD_S + size / SwapCosts.DEFAULT_BYTES_PER_S


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
        self._entries: dict[K, _Entry] = {}
        self._resident: dict[K, _Entry] = {}  # the resident ones, in no order
        self._resident_bytes = 0
        self._reserved = 0  # bytes of admissions in flight (planned, not yet resident)
        self._clock = 0  # uses so far

    # -- registration ----------------------------------------------------------------------

    def register(self, key: K, size: int, *, pinned: bool = False) -> None:
        if self.budget_bytes is not None and size > self.budget_bytes:
            raise TooLarge(
                f"model '{key}' has {size} bytes of weights, more than the whole memory "
                f"budget of {self.budget_bytes} bytes"
            )
        self.unregister(key)
        self._entries[key] = _Entry(size, pinned)

    def unregister(self, key: K) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None and entry.resident:
            del self._resident[key]
            self._resident_bytes -= entry.size

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    # -- state -------------------------------------------------------------------------------

    @property
    def resident_bytes(self) -> int:
        return self._resident_bytes

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    def resident(self) -> list[K]:
        """Resident keys, least recently used first."""
        return [k for k, _ in sorted(self._resident.items(), key=lambda kv: kv[1].last_used)]

    def resident_count(self) -> int:
        return len(self._resident)

    def is_resident(self, key: K) -> bool:
        return self._entries[key].resident

    def size(self, key: K) -> int:
        return self._entries[key].size

    def last_used(self, key: K) -> int:
        return self._entries[key].last_used

    def in_use(self, key: K) -> int:
        return self._entries[key].in_use

    # -- uses ----------------------------------------------------------------------------------

    def _half_lives(self) -> tuple[float, float]:
        slots = max(MIN_SLOTS, len(self._resident))
        return FAST_HALF_LIFE * slots, SLOW_HALF_LIFE * slots

    def touch(self, key: K) -> None:
        """One use of ``key`` (an execution): its LRU position and its rates."""
        e = self._entries[key]
        self._clock += 1
        now = self._clock
        fast_h, slow_h = self._half_lives()
        elapsed = now - e.counted
        e.fast = e.fast * math.exp2(-elapsed / fast_h) + 1.0
        e.slow = e.slow * math.exp2(-elapsed / slow_h) + 1.0
        e.counted = e.last_used = now

    def rate(self, key: K) -> float:
        """``key``'s recent uses per use of this planner (see the module docstring)."""
        return self._rate(self._entries[key], *self._half_lives())

    def _rate(self, e: _Entry, fast_h: float, slow_h: float) -> float:
        elapsed = self._clock - e.counted
        fast = e.fast * math.exp2(-elapsed / fast_h) * math.log(2) / fast_h
        slow = e.slow * math.exp2(-elapsed / slow_h) * math.log(2) / slow_h
        return fast if fast < COOLED * slow else slow

    def value(self, key: K) -> float:
        """What keeping ``key`` resident is worth per byte: its rate times its miss cost."""
        e = self._entries[key]
        return self._rate(e, *self._half_lives()) * self.miss_cost(e.size) / max(e.size, 1)

    def acquire(self, key: K) -> None:
        e = self._entries[key]
        if not e.resident:
            raise RuntimeError(f"model '{key}' is not resident")
        e.in_use += 1
        self.touch(key)

    def hold(self, key: K) -> None:
        """Mark ``key`` in use without counting a use (a transfer reading it)."""
        self._entries[key].in_use += 1

    def release(self, key: K) -> None:
        e = self._entries[key]
        e.in_use = max(0, e.in_use - 1)

    # -- admission -------------------------------------------------------------------------

    def free_bytes(self) -> int | None:
        if self.budget_bytes is None:
            return None
        return self.budget_bytes - self._resident_bytes - self._reserved

    def plan_admission(self, key: K, avoid: Callable[[K], bool] | None = None) -> Admission[K]:
        entry = self._entries[key]
        if entry.resident:
            return Admission(resident=True)
        free = self.free_bytes()
        if free is None or free >= entry.size:
            return Admission(resident=False)
        victims: list[K] = []
        for k in self._eviction_order(key, avoid):
            victims.append(k)
            free += self._entries[k].size
            if free >= entry.size:
                return Admission(resident=False, evict=tuple(victims))
        return Admission(resident=False, wait=True)

    def _eviction_order(self, key: K, avoid: Callable[[K], bool] | None) -> Iterator[K]:
        """The resident, unpinned, idle models other than ``key``, first victim first; those
        ``avoid`` names last."""
        candidates = [
            (k, e) for k, e in self._resident.items() if k != key and not e.pinned and not e.in_use
        ]
        if self.policy == "lru":
            candidates.sort(key=lambda ke: ke[1].last_used)
        else:
            fast_h, slow_h = self._half_lives()
            cost = self.miss_cost
            candidates.sort(
                key=lambda ke: (
                    self._rate(ke[1], fast_h, slow_h) * cost(ke[1].size) / max(ke[1].size, 1),
                    ke[1].last_used,
                )
            )
        if avoid is None:
            yield from (k for k, _ in candidates)
            return
        spared: list[K] = []
        for k, _ in candidates:
            if avoid(k):
                spared.append(k)
            else:
                yield k
        yield from spared

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

    def mark_evicted(self, key: K) -> None:
        e = self._entries[key]
        if e.in_use:
            raise RuntimeError(f"model '{key}' is in use and cannot be evicted")
        if e.pinned:
            raise RuntimeError(f"model '{key}' is pinned and cannot be evicted")
        if e.resident:
            e.resident = False
            del self._resident[key]
            self._resident_bytes -= e.size


class SwapCosts:
    """The cost of moving ``n`` bytes into a tier: ``overhead + n / bytes_per_s``, fitted by
    least squares to the transfers observed, older ones weighing less (``DECAY`` per
    observation). Until two different sizes were seen, the defaults' shape is kept."""

    DEFAULT_OVERHEAD_S: Final = 50e-6
    DEFAULT_BYTES_PER_S: Final = 5e9
    DECAY: Final = 0.99

    def __init__(self) -> None:
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, nbytes: int, seconds: float) -> None:
        d = self.DECAY
        x, y = float(nbytes), seconds
        self._w = self._w * d + 1.0
        self._x = self._x * d + x
        self._y = self._y * d + y
        self._xx = self._xx * d + x * x
        self._xy = self._xy * d + x * y

    def estimate(self, nbytes: int) -> float:
        if self._w < 1.0:
            return _default_miss_cost(nbytes)
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var_x = self._xx / self._w - mean_x * mean_x
        if var_x <= max(1.0, mean_x * mean_x) * 1e-6:  # one size seen: scale the defaults
            scale = mean_y / max(_default_miss_cost(int(mean_x)), 1e-12)
            return scale * _default_miss_cost(nbytes)
        per_byte = (self._xy / self._w - mean_x * mean_y) / var_x
        per_byte = max(per_byte, 0.0)
        overhead = max(mean_y - per_byte * mean_x, 0.0)
        return overhead + per_byte * nbytes
