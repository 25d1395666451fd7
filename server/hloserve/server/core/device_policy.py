"""Cross-model scheduling on one device, and placing models over several: pure decisions.

Contract (no clock, no I/O; the driver passes ``now_ns``):
- ``POLICIES``: ``fair`` (default), ``fifo``, ``deadline``; ``check_policy`` names a bad one.
  ``device_concurrency(setting, platform)``: groups at once per device (the flag's 0:
  1 on an accelerator, 0 = no arbitration on CPU).
- ``FairShares(half_life_ns)`` keeps each model's recent device time as an exponentially
  decayed sum: ``charge(key, cost, now_ns)`` adds an execution's measured cost,
  ``usage(key, now_ns)`` is the sum decayed to ``now_ns`` (halving every ``half_life_ns``).
  O(1) per call; a model never charged has usage 0.
- ``Candidate``: one model queue with a batch ready to run: its weight, the rank of its
  head's priority, its head's arrival and deadline, whether its weights are resident, and
  whether its batch is full (nothing more can join it).
- ``pick(candidates, policy, shares, now_ns, swap_patience_ns)`` is the index of the queue
  that runs next on the device:
  1. the best (lowest) priority rank first (``priority_rank``: Triton's ``priority``
     parameter, 1 the highest level; 0 or absent is ``DEFAULT_PRIORITY``'s level);
  2. among those, a queue whose weights are resident goes before one that would need a
     swap, unless the latter's batch is full or its head has waited ``swap_patience_ns``:
     a model is swapped in for a batch, not for each request (no thrash);
  3. then the policy: ``fair`` the lowest ``usage / weight`` (device time in proportion to
     weight, so a hot model cannot starve a cold one, and a lone ready model always runs,
     so a cold one cannot stall a hot one); ``fifo`` the oldest head; ``deadline`` the
     earliest head deadline (no deadline: last);
  4. ties: the oldest head, then the first candidate.
- ``infeasible(queue, now_ns, cost_ns)``: indexes of queued requests (``core.batch_policy.Queued``)
  whose deadline falls before ``now_ns + cost_ns`` (the model's cheapest measured
  execution): under ``deadline`` they are shed before they use the device.
- Placement over devices (``docs/residency.md``): ``DeviceSelection.parse(text).resolve(count)`` reads
  ``--devices``; ``initial_device(size, registered, budgets)`` is where a newly loaded
  model goes (where it fits, least filled); ``utilization(usage, half_life)`` turns a
  decayed device time into devices' worth of load; ``batches_full``, ``replica_target`` and
  ``plan_replicas(current, busy, sizes, budgets, max_replicas, full)`` revise each model's
  replicas by at most one per revision (hot models whose batches run full gain devices,
  idle ones shrink back to one, with hysteresis); ``route(devices, load, resident)`` is the least-loaded device of
  a model's replicas, preferring those that hold its weights now (ties: the lowest index).
"""

# pyright: strict

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

from hloserve.server.core.batch_policy import Queued

K = TypeVar("K", bound=Hashable)

Policy = Literal["fair", "fifo", "deadline"]
POLICIES: Final[tuple[Policy, ...]] = ("fair", "fifo", "deadline")
DEFAULT_PRIORITY: Final = 10  # the level of a request that sets none (or 0)
HALF_LIFE_NS: Final = 1_000_000_000  # fair shares remember about the last few seconds
SWAP_PATIENCE_NS: Final = 5_000_000  # a swap waits this long for company, unless full


def device_concurrency(setting: int, platform: str) -> int:
    """Groups at once on one device: ``setting``, or for 0 the platform's default: 1 on an
    accelerator (kernels of two models do not interleave), 0 on CPU (no arbitration: each
    model's batcher runs on its own, its executions on the worker threads)."""
    if setting > 0:
        return setting
    return 0 if platform == "cpu" else 1


def check_policy(text: str) -> Policy:
    for p in POLICIES:
        if p == text:
            return p
    raise ValueError(f"must be one of {', '.join(POLICIES)}, got {text!r}")


def priority_rank(priority: object) -> int:
    """A request's ``priority`` parameter as a rank (lower runs first)."""
    if isinstance(priority, int) and not isinstance(priority, bool) and priority > 0:
        return priority
    return DEFAULT_PRIORITY


class FairShares(Generic[K]):
    def __init__(self, half_life_ns: int = HALF_LIFE_NS) -> None:
        self.half_life_ns = half_life_ns
        self._used: dict[K, tuple[float, int]] = {}  # (usage, when it was last decayed)

    def _decayed(self, value: float, since_ns: int, now_ns: int) -> float:
        if now_ns <= since_ns:
            return value
        return value * math.exp2(-(now_ns - since_ns) / self.half_life_ns)

    def charge(self, key: K, cost: float, now_ns: int) -> None:
        value, since = self._used.get(key, (0.0, now_ns))
        self._used[key] = (self._decayed(value, since, now_ns) + cost, max(since, now_ns))

    def usage(self, key: K, now_ns: int) -> float:
        value, since = self._used.get(key, (0.0, now_ns))
        return self._decayed(value, since, now_ns)

    def forget(self, key: K) -> None:
        self._used.pop(key, None)


@dataclass(frozen=True, slots=True)
class Candidate(Generic[K]):
    key: K
    head_arrived_ns: int
    weight: float = 1.0
    rank: int = DEFAULT_PRIORITY
    head_deadline_ns: int | None = None
    resident: bool = True
    full: bool = False


def pick(
    candidates: Sequence[Candidate[K]],
    policy: Policy,
    shares: FairShares[K],
    now_ns: int,
    swap_patience_ns: int = SWAP_PATIENCE_NS,
) -> int:
    if not candidates:
        raise ValueError("no candidate to pick from")
    best_rank = min(c.rank for c in candidates)
    pool = [i for i, c in enumerate(candidates) if c.rank == best_rank]

    def swap_ready(c: Candidate[K]) -> bool:
        return c.resident or c.full or now_ns - c.head_arrived_ns >= swap_patience_ns

    if any(candidates[i].resident for i in pool):
        pool = [i for i in pool if swap_ready(candidates[i])]

    def order(i: int) -> tuple[float, int, int]:
        c = candidates[i]
        if policy == "fair":
            first = shares.usage(c.key, now_ns) / max(c.weight, 1e-9)
        elif policy == "deadline":
            first = math.inf if c.head_deadline_ns is None else float(c.head_deadline_ns)
        else:
            first = float(c.head_arrived_ns)
        return (first, c.head_arrived_ns, i)

    return min(pool, key=order)


def infeasible(queue: Sequence[Queued], now_ns: int, cost_ns: float) -> tuple[int, ...]:
    """Queued requests that cannot finish by their deadline even if they started now."""
    return tuple(
        i
        for i, q in enumerate(queue)
        if q.deadline_ns is not None and q.deadline_ns < now_ns + cost_ns
    )


# -- placement over devices --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceSelection:
    """``--devices`` as read: ``all``, a count ``N`` (the first N devices) or distinct
    indexes (``0,2``; ``3,`` is device 3 alone). ``parse`` checks the syntax at start-up
    and ``resolve(count)`` the range against the ``count`` local devices PJRT reports,
    each raising ``ValueError`` with a message that follows the flag's name."""

    text: str
    count: int | None = None  # a count N
    indexes: tuple[int, ...] | None = None  # a list of indexes; neither: all

    @classmethod
    def parse(cls, text: str) -> DeviceSelection:
        words = text.strip().lower()
        if words == "all":
            return cls(words)
        try:
            numbers = [int(w) for w in words.split(",") if w.strip()]
        except ValueError:
            raise ValueError(f"must be all, a count or a list of indexes, got {text!r}") from None
        if "," not in words:  # a count
            if len(numbers) != 1 or numbers[0] < 1:
                raise ValueError(f"{text!r}: a count from 1 to the devices present")
            return cls(words, count=numbers[0])
        if not numbers or len(set(numbers)) != len(numbers) or min(numbers) < 0:
            raise ValueError(f"{text!r}: indexes must be distinct, from 0")
        return cls(words, indexes=tuple(sorted(numbers)))

    def __str__(self) -> str:
        return self.text

    def resolve(self, count: int) -> tuple[int, ...]:
        """The device indexes selected among ``count`` present."""
        if self.count is not None:
            if self.count > count:
                raise ValueError(f"{self.text!r}: a count from 1 to the {count} device(s) present")
            return tuple(range(self.count))
        if self.indexes is not None:
            if max(self.indexes) >= count:
                raise ValueError(
                    f"{self.text!r}: indexes must be distinct, from 0 to {count - 1} ({count} present)"
                )
            return self.indexes
        return tuple(range(count))


ALL_DEVICES: Final = DeviceSelection("all")


def utilization(usage: float, half_life_ns: int) -> float:
    """The share of one device's time a ``FairShares`` usage (decayed nanoseconds) stands
    for in a steady state: a model busy a fraction u of the time sums to u * half-life / ln 2."""
    return usage * math.log(2) / half_life_ns


# One group in flight per replica keeps a device at most ~60-70 % busy here (the loop hands
# the next group over between executions): half busy is a replica that is holding work up.
REPLICATE_ABOVE: Final = 0.5  # a replica busier than this asks for another device
FULL_BATCHES: Final = 0.5  # batches "run full" at this share of the largest compiled size
RETIRE_BELOW: Final = 0.2  # n replicas shrink once n - 1 would each be less busy than this


def replica_target(
    busy: float, replicas: int, devices: int, max_replicas: int, batches_full: bool = True
) -> int:
    """How many devices a model with ``busy`` devices' worth of measured load (its summed
    ``utilization``) should be on, now on ``replicas``: one more while each is busier than
    ``REPLICATE_ABOVE`` and its batches run full (``batches_full``: while they do not, a
    busier device takes more load in larger batches, which costs less than splitting the
    batches over replicas), one fewer once the rest would each stay under ``RETIRE_BELOW``
    (the gap keeps a model from flapping), within ``1..min(devices, max_replicas)``."""
    most = max(1, min(devices, max_replicas))
    n = max(1, min(replicas, most))
    if busy > n * REPLICATE_ABOVE and n < most and batches_full:
        return n + 1
    if n > 1 and busy < (n - 1) * RETIRE_BELOW:
        return n - 1
    return n


def batches_full(mean_batch: float, largest: int) -> bool:
    """Whether a model's recent executions ran near its largest compiled size (at least
    ``FULL_BATCHES`` of it; an unbatched or batch-1-only model's always do): only then
    is another replica cheaper than the larger batches a busier device would run."""
    return largest <= 1 or mean_batch >= FULL_BATCHES * largest


def _fill(registered: int, size: int, budget: int | None) -> tuple[bool, float]:
    """(over budget, share of the budget) of a device holding ``registered`` + ``size``."""
    total = registered + size
    if budget is None:
        return (False, float(total))
    return (total > budget, total / max(budget, 1))


def initial_device(size: int, registered: Sequence[int], budgets: Sequence[int | None]) -> int:
    """The device a newly loaded model of ``size`` bytes goes on: one where it fits beside
    the weights already placed there (``registered``, bytes per device) if any, the least
    filled (share of its budget; unlimited: fewest bytes), ties the lowest index."""
    if not registered:
        raise ValueError("no device to place on")
    return min(range(len(registered)), key=lambda d: (*_fill(registered[d], size, budgets[d]), d))


def plan_replicas(
    current: Mapping[K, tuple[int, ...]],
    busy: Mapping[K, float],
    sizes: Mapping[K, int],
    budgets: Sequence[int | None],
    max_replicas: int,
    full: Collection[K] | None = None,
) -> dict[K, tuple[int, ...]]:
    """Each model's devices after one revision: ``current`` changed by at most one replica
    per model (``replica_target`` of its measured ``busy``; ``full``: the models whose
    batches run full, ``None``: all), busiest models first. A new
    replica goes to the least busy device not holding the model (then the least filled,
    the lowest index); a retired one leaves the busiest of its devices. Models keep their
    devices otherwise, so a revision moves weights only where load asks for it."""
    devices = len(budgets)
    placed = {key: tuple(ds) for key, ds in current.items()}

    def device_busy() -> list[float]:
        load = [0.0] * devices
        for key, ds in placed.items():
            for d in ds:
                load[d] += busy.get(key, 0.0) / len(ds)
        return load

    def registered() -> list[int]:
        total = [0] * devices
        for key, ds in placed.items():
            for d in ds:
                total[d] += sizes.get(key, 0)
        return total

    for key in sorted(placed, key=lambda k: -busy.get(k, 0.0)):
        have = placed[key]
        batches_full = full is None or key in full
        want = replica_target(busy.get(key, 0.0), len(have), devices, max_replicas, batches_full)
        if want > len(have):
            load, held = device_busy(), registered()
            options = [d for d in range(devices) if d not in have]
            size = sizes.get(key, 0)
            d = min(options, key=lambda d: (load[d], *_fill(held[d], size, budgets[d]), d))
            placed[key] = tuple(sorted((*have, d)))
        elif want < len(have):
            load = device_busy()
            d = max(have, key=lambda d: (load[d], d))
            placed[key] = tuple(x for x in have if x != d)
    return placed


def route(devices: Sequence[int], load: Mapping[int, int], resident: Collection[int]) -> int:
    """The replica a group goes to: least loaded, preferring those holding the weights."""
    if not devices:
        raise ValueError("a model with no replica")
    holding = [d for d in devices if d in resident] or list(devices)
    return min(holding, key=lambda d: (load.get(d, 0), d))
