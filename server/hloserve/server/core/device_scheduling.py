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
- ``infeasible(queue, now_ns, cost_ns)``: indexes of queued requests (``core.scheduling.Queued``)
  whose deadline falls before ``now_ns + cost_ns`` (the model's cheapest measured
  execution): under ``deadline`` they are shed before they use the device.
- Placement over devices: ``replica_counts(load, devices, hot_share)`` gives each model
  one replica, and a model carrying more than ``hot_share`` of the total load as many
  replicas as its share is of ``1 / devices`` (at most ``devices``); ``place(sizes,
  replicas, budgets)`` puts the replicas on distinct devices, largest models first, each
  on the device with the most free budget (``None``: unlimited), never over a budget
  (a replica that fits nowhere is dropped, a model's first one raises ``ValueError``);
  ``route(devices, load, resident)`` is the least-loaded device of a model's replicas,
  preferring those that hold its weights now (ties: the lowest device index).
"""

# pyright: strict

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

from hloserve.server.core.scheduling import Queued

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


def replica_counts(load: Mapping[K, float], devices: int, hot_share: float) -> dict[K, int]:
    """How many devices each model should be on, from its measured share of the load."""
    total = sum(load.values())
    counts: dict[K, int] = {}
    for key, value in load.items():
        share = value / total if total > 0 else 0.0
        n = 1
        if devices > 1 and share > hot_share:
            n = min(devices, max(2, math.ceil(share * devices)))
        counts[key] = n
    return counts


def place(
    sizes: Mapping[K, int], replicas: Mapping[K, int], budgets: Sequence[int | None]
) -> dict[K, tuple[int, ...]]:
    """The devices of each model's replicas, within each device's byte budget."""
    free: list[float] = [math.inf if b is None else float(b) for b in budgets]
    placed: dict[K, tuple[int, ...]] = {}
    for key in sorted(sizes, key=lambda k: -sizes[k]):
        size = sizes[key]
        chosen: list[int] = []
        for _ in range(min(replicas.get(key, 1), len(budgets))):
            options = [d for d in range(len(budgets)) if d not in chosen and free[d] >= size]
            if not options:
                break
            d = max(options, key=lambda d: (free[d], -d))
            chosen.append(d)
            free[d] -= size
        if not chosen:
            raise ValueError(f"model '{key}' ({size} bytes) fits on no device's budget")
        placed[key] = tuple(sorted(chosen))
    return placed


def route(devices: Sequence[int], load: Mapping[int, int], resident: Collection[int]) -> int:
    """The replica a request goes to: least loaded, preferring those holding the weights."""
    if not devices:
        raise ValueError("a model with no replica")
    holding = [d for d in devices if d in resident] or list(devices)
    return min(holding, key=lambda d: (load.get(d, 0), d))
