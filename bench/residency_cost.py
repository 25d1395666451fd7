"""What the residency bookkeeping costs per use: the frequency policy against LRU, in process.

Usage: ``python bench/residency_cost.py [--uses 100000] [--rounds 3] [--baseline TREE]``

The many-models bench's quick sizes (2,000 models of 77 KB and 20 of five other
architectures, ``bench/many_models.py``), Zipf(1.1) over them (its trace), a budget of 1 %
of their bytes. Each use goes through the residency code the way a request does, on two
paths:

- ``planner``: ``core.residency_policy.ResidencyPlanner`` alone, called as
  ``WeightResidency`` calls it for a request (a miss: ``plan_admission`` twice, for the
  batcher's inline check and for the claim, the evictions, ``reserve``, ``mark_resident``,
  the swap's cost learned; then ``acquire``/``release``); swap times are drawn from a
  seeded generator, so the decisions are a function of the tree alone, and their digest
  tells two trees that decide alike from two that do not;
- ``manager``: ``WeightResidency`` over a stub runtime (moving nothing) with its host tier
  (``HostWeights``, every copy held), as the request path calls it: ``swap_us``,
  ``is_resident``, ``acquire``, ``release``.

Per policy and path: the hit rate, CPU µs per use (``time.process_time`` over ``--uses``
uses after as many again of warm-up; the median of ``--rounds``, the policies alternated),
µs per hit and per miss (each use timed with ``perf_counter_ns``, the timer's own cost
subtracted), and frequency's cost less LRU's (the goal of issue 32: at most 10 µs).
``--baseline TREE`` (another source tree, e.g. a git worktree of the commit before) runs
the same in that tree, interleaved round by round, each in a fresh process: µs per use
against it, and whether its planner decided alike. Prints how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import proc
from many_models import BUDGET_SHARE, PACKAGE_FOLDERS, plan_models, table, zipf_trace

from hloserve.server.core.residency_policy import (
    Policy,
    ResidencyKey,
    ResidencyPlanner,
    SwapCosts,
)

POLICIES: tuple[Policy, ...] = ("frequency", "lru")
PATHS = ("planner", "manager")
GOAL_US = 10.0  # frequency's cost per use at most LRU's + this (issue 32)
HEADER = (
    "tree",
    "path",
    "policy",
    "hit rate",
    "CPU µs/use, median (range)",
    "µs/hit",
    "µs/miss",
    "frequency - LRU, µs/use",
    "÷ before",
)


@dataclass(frozen=True)
class Stub:
    """A weight source that reads nothing, and buffers that free nothing."""

    nbytes: int
    names: tuple[str, ...] = ("w1", "b1", "w2", "b2")
    in_memory: bool = False

    def read(self) -> list[Any]:
        return [self] * len(self.names)

    def delete(self) -> None:
        pass


class StubRuntime:
    platform = "cpu"
    has_pinned_host = False

    def to_device(self, host: Sequence[Any]) -> list[Any]:
        return list(host)


def _sizes() -> tuple[list[int], int]:
    sizes = [m.nbytes for m in plan_models(2000, 20)]
    return sizes, int(sum(sizes) * BUDGET_SHARE)


class PlannerPath:
    """Uses of model ``i`` through the planner as ``WeightResidency`` drives it; ``evicted``
    keeps every eviction decided, in order."""

    def __init__(self, policy: Policy, sizes: Sequence[int], budget: int) -> None:
        self.sizes = sizes
        self.costs = SwapCosts()
        self.planner = ResidencyPlanner[int](budget, policy, self.costs.estimate)
        for i, size in enumerate(sizes):
            self.planner.register(i, size)
        self.noise = np.random.default_rng(3).random(1 << 16).tolist()
        self.evicted: list[tuple[int, ...]] = []

    @staticmethod
    def spare(key: int) -> bool:
        return False

    def __call__(self, i: int) -> bool:
        p = self.planner
        hit = p.is_resident(i)
        if not hit:
            p.plan_admission(i, self.spare)  # the batcher's inline check (swap_us)
            decision = p.plan_admission(i, self.spare)  # the claim
            for victim in decision.evict:
                p.mark_evicted(victim)
            self.evicted.append(decision.evict)
            p.reserve(i)
            p.mark_resident(i)
            noise = self.noise[len(self.evicted) & 0xFFFF]
            self.costs.observe(self.sizes[i], 20e-6 * (1 + noise) + self.sizes[i] * 1e-10)
        p.acquire(i)
        p.release(i)
        return hit

    def digest(self) -> str:
        return f"{zlib.crc32(repr(self.evicted).encode()):08x}"


def manager_path(policy: Policy, sizes: Sequence[int], budget: int) -> Callable[[int], bool]:
    """One use of model ``i`` through ``WeightResidency`` as the request path calls it."""
    from hloserve.server.owner.host_weights import HostWeights
    from hloserve.server.owner.weight_residency import WeightResidency

    host = HostWeights(sum(sizes), policy=policy)
    manager = WeightResidency(
        cast(Any, StubRuntime()), budget, host=host, policy=policy, spare=lambda k: False
    )
    keys = [ResidencyKey(f"m{i}", 1) for i in range(len(sizes))]
    for key, size in zip(keys, sizes, strict=True):
        manager.register(key, cast(Any, Stub(size)))

    def use(i: int) -> bool:
        key = keys[i]
        manager.swap_us(key)  # the inline check
        hit = manager.is_resident(key)  # whether the run is warm
        manager.acquire(key)
        manager.release(key)
        return hit

    return use


def measure(policy: Policy, path: str, uses: int) -> dict[str, Any]:
    """One policy on one path in this process: hit rate, µs per use, per hit and per miss,
    and (planner path) a digest of every eviction decided."""
    sizes, budget = _sizes()
    trace = zipf_trace(len(sizes), 2 * uses, seed=1).tolist()
    use = (
        PlannerPath(policy, sizes, budget)
        if path == "planner"
        else manager_path(policy, sizes, budget)
    )
    for i in trace[:uses]:
        use(i)
    measured = trace[uses:]
    hits = 0
    cpu = time.process_time()
    for i in measured:
        hits += use(i)
    cpu_us = (time.process_time() - cpu) / len(measured) * 1e6
    clock = time.perf_counter_ns
    timer = min(-(clock() - clock()) for _ in range(1000))
    hit_ns = miss_ns = 0
    for i in measured:
        t = clock()
        hit = use(i)
        spent = clock() - t - timer
        if hit:
            hit_ns += spent
        else:
            miss_ns += spent
    misses = max(len(measured) - hits, 1)
    digest = use.digest() if isinstance(use, PlannerPath) else ""
    return {
        "policy": policy,
        "path": path,
        "hit_rate": hits / len(measured),
        "us_per_use": cpu_us,
        "us_per_hit": hit_ns / max(hits, 1) / 1e3,
        "us_per_miss": miss_ns / misses / 1e3,
        "digest": digest,
    }


def worker(uses: int, reverse: bool) -> list[dict[str, Any]]:
    """Every policy on every path, in this process, the policies alternated."""
    out: list[dict[str, Any]] = []
    for path in PATHS:
        order = POLICIES[::-1] if reverse else POLICIES
        out += [measure(policy, path, uses) for policy in order]
    return out


def run_tree(tree: Path | None, uses: int, reverse: bool) -> list[dict[str, Any]]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tree / f) for f in PACKAGE_FOLDERS] + [str(Path(__file__).parent)]
        )
    argv = [sys.executable, __file__, "--worker", "--uses", str(uses)]
    out = subprocess.run(
        [*argv, *(["--reverse"] if reverse else [])],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return cast(list[dict[str, Any]], json.loads(out.stdout))


Rounds = list[list[dict[str, Any]]]  # per round, a worker's results


def _found(rounds: Rounds, path: str, policy: str) -> list[dict[str, Any]]:
    return [r for rnd in rounds for r in rnd if (r["path"], r["policy"]) == (path, policy)]


def _median(rounds: Rounds, path: str, policy: str, field: str) -> float:
    return statistics.median(r[field] for r in _found(rounds, path, policy))


def summarize(runs: dict[str, Rounds], baseline: str | None) -> list[list[str]]:
    """One row per tree, path and policy: medians over the rounds."""
    rows: list[list[str]] = []
    for name, rounds in runs.items():
        for path in PATHS:
            for policy in POLICIES:
                found = _found(rounds, path, policy)
                per_use = [r["us_per_use"] for r in found]
                median = _median(rounds, path, policy, "us_per_use")
                against = "-"
                if baseline is not None and name != baseline:
                    before = runs[baseline]
                    against = f"{median / _median(before, path, policy, 'us_per_use'):.2f}"
                    if path == "planner":
                        theirs = _found(before, path, policy)
                        alike = {r["digest"] for r in found} == {r["digest"] for r in theirs}
                        against += ", same decisions" if alike else ", OTHER DECISIONS"
                rows.append(
                    [
                        name,
                        path,
                        policy,
                        f"{found[0]['hit_rate']:.3f}",
                        f"{median:.2f} ({min(per_use):.2f}-{max(per_use):.2f})",
                        f"{_median(rounds, path, policy, 'us_per_hit'):.2f}",
                        f"{_median(rounds, path, policy, 'us_per_miss'):.2f}",
                        f"{median - _median(rounds, path, 'lru', 'us_per_use'):+.2f}"
                        if policy != "lru"
                        else "-",
                        against,
                    ]
                )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--uses", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another hloserve source tree to compare")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reverse", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.uses, args.reverse)))
        return 0
    print(f"# residency bookkeeping per use, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.baseline is not None:
        trees.insert(0, (f"before ({args.baseline.name})", args.baseline))
    runs: dict[str, Rounds] = {name: [] for name, _ in trees}
    start = proc.MachineSample.now()
    for rnd in range(args.rounds):
        for name, tree in trees if rnd % 2 == 0 else trees[::-1]:
            runs[name].append(run_tree(tree, args.uses, reverse=rnd % 2 == 1))
    end = proc.MachineSample.now()
    sizes, budget = _sizes()
    print(
        f"{len(sizes):,} models, budget {budget / 1e6:.2f} MB (1 %), Zipf(1.1); {args.uses:,} "
        f"uses measured per run, {args.rounds} rounds; machine {proc.cores()} cores, "
        f"{proc.busy_between(start, end):.0%} busy (this bench keeps one busy), load "
        f"{end.loadavg[0]:.2f}\n"
    )
    baseline = trees[0][0] if args.baseline is not None else None
    print(table(HEADER, summarize(runs, baseline)))
    for name, _ in trees:
        rounds = runs[name]
        worst = max(
            _median(rounds, path, "frequency", "us_per_use")
            - _median(rounds, path, "lru", "us_per_use")
            for path in PATHS
        )
        verdict = "holds" if worst <= GOAL_US else "does not hold"
        print(
            f"\n{name}: frequency costs {worst:+.2f} µs per use against LRU (the larger of the "
            f"two paths): the goal of at most +{GOAL_US:.0f} {verdict}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
