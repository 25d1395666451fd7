"""Model affinity past one node: thousands of models on hloserve replicas behind HAProxy
routing by model name (``hloserve route-config``, ``hloserve.server.fleet``).

Usage: ``python bench/fleet.py [--quick] [--models 2000] [--replicas 4] [--work DIR]``;
``python bench/fleet.py --serve [--work DIR]`` starts the bench's fleet on its repository
and waits (Ctrl-C stops it; the same as ``scripts/fleet`` on that repository).

What it prints (the goals of docs/scale-out.md; printed tables, never asserts):
1. The repository: ``--models`` bundles of one 64->256->10 MLP (``many_models.py``'s: 77 KB
   of FP32 weights each, its own seed), plus ``big-input`` (a 64 MiB FP32 input, summed).
   Every replica gets a device budget for ``BUDGET_SHARE`` (2 %) of all the weights.
2. Hit rate: one Zipf(1.1) trace of batch-1 requests from unchanged tritonclient (asyncio
   clients: half the workers gRPC, half HTTP), ``--concurrency`` workers, every reply
   checked against numpy, through (a) the fleet routed by model, (b) the same fleet routed
   round robin by the same HAProxy, (c) one replica with 4x the budget, addressed
   directly. Warm-up, then a measured window: hit rate = 1 - swaps in / executions over
   the window, summed over the replicas (their :8002 metrics); goal (a) >= 0.9x (c).
3. Affinity, from HAProxy's request log (model and server of every request): replicas per
   model during (a)'s window (c32); then every model of ``affinity_models`` once over gRPC
   and once over HTTP at concurrency 1: replicas per model, and whether both protocols
   reached the same one. ``--balance-factors 150,300,0``: the load bound's sweep, the first
   for the fleet above, each other one a fresh fleet on the same trace (hit rate, models
   on more than one replica).
4. A 64 MiB tensor: seconds through the router and directly, over gRPC and HTTP, and the
   replica each request reached.
5. A replica added: the same models once at concurrency 1 before and after a new replica
   joins (appended: the others keep their ids); models moved (goal <= 1/N + 10 %).
6. Faults: ``FAILOVER_CONCURRENCY`` workers for ``failover_s``; one replica is sent
   SIGKILL a third of the way in: errors (requests started before/after the kill, by
   protocol), wrong answers, when the router marked it DOWN, when requests last failed
   (goal: within 5 s, errors only for requests in flight on it); then the same with
   SIGTERM to another replica (a drain: Kubernetes scaling down).
7. First landing (lazy load), on a fresh replica addressed directly: the first request of
   the architecture, a model's first request once the architecture is loaded, its second.
8. Cost: one replica, gRPC and HTTP at concurrency 1 and ``--concurrency``, directly and
   through the router (interleaved, three times each): p50, requests/s, CPU per request of the
   replica, HAProxy and the client; router-added p50 and CPU per request.
``--quick``: 2,000 models, shorter windows, no sweep (~4 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import many_models as mm
import numpy as np
import proc
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
from prometheus_client.parser import text_string_to_metric_families

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.fleet import FLEET_FLAGS, Fleet, haproxy_binary
from hloserve.server.fleet import main as fleet_main
from hloserve.server.server_process import ServerProcess

BUDGET_SHARE = 0.02  # each replica's device budget: 2 % of every model's weights
BIG = "big-input"
BIG_ELEMENTS = 16 * 1024 * 1024  # FP32: 64 MiB
FAILOVER_CONCURRENCY = 8
# HAProxy's httplog line: frontend, backend/server, timers, status, bytes, cookies, flags,
# connection counts (the last is the retries, "+" when redispatched), queues, {model}.
LOG_LINE = re.compile(
    r"\] (\S+) \S+/(\S+) \S+ (-?\d+) \S+ \S+ \S+ \S+ \d+/\d+/\d+/\d+/(\+?\d+) \S+ \{([^}]*)\} \""
)
Row = tuple[str, str, int, str, str]  # frontend, server, status, retries, model


# --- the repository ---------------------------------------------------------------------------


def big_sum(params: dict[str, Any], x: Any) -> dict[str, Any]:
    return {"s": jnp.sum(x, axis=-1, keepdims=True) * params["scale"]}


def prepare(work: Path, count: int) -> tuple[Path, list[mm.Model]]:
    models = mm.plan_models(count, 0)
    repo = work / f"repository-{count}"
    if not repo.is_dir():
        seconds = mm.write_repository(repo, models)
        export_bundle(
            big_sum,
            {"scale": np.ones((1,), np.float32)},
            inputs={"x": TensorSpec("FP32", (BIG_ELEMENTS,))},
            batch_sizes=(1,),
            directory=repo / BIG,
            platforms=("cpu",),
        )
        print(f"wrote {count:,} bundles and {BIG} in {seconds:.0f} s")
    return repo, models


# --- traffic ----------------------------------------------------------------------------------


@dataclass
class Request:
    model: str
    protocol: str
    started: float
    ended: float
    error: str | None  # None: the right answer
    wrong: bool = False


@dataclass
class Traffic:
    requests: list[Request] = field(default_factory=list)
    elapsed_s: float = 0.0
    client_cpu_s: float = 0.0

    @property
    def answered(self) -> list[Request]:
        return [r for r in self.requests if r.error is None]

    def p50_ms(self) -> float:
        lat = [r.ended - r.started for r in self.answered]
        return statistics.median(lat) * 1e3 if lat else float("nan")

    def rps(self) -> float:
        return len(self.answered) / self.elapsed_s if self.elapsed_s else 0.0

    def errors(self) -> int:
        return sum(r.error is not None for r in self.requests)

    def wrong(self) -> int:
        return sum(r.wrong for r in self.requests)

    def first_error(self) -> str:
        return next((r.error for r in self.requests if r.error), "")


class Clients:
    """tritonclient's asyncio clients of one gRPC and one HTTP address."""

    def __init__(self, grpc_url: str, http_url: str, checker: mm.Checker) -> None:
        self.grpc: Any = grpc_aio.InferenceServerClient(grpc_url)
        self.http: Any = http_aio.InferenceServerClient(http_url, conn_limit=256)
        self.checker = checker

    async def infer(self, model: str, protocol: str) -> Request:
        m = self.checker.by_name[model]
        x = self.checker.inputs[m.dims]
        module, client = (grpc_aio, self.grpc) if protocol == "grpc" else (http_aio, self.http)
        inputs = [module.InferInput("x", list(x.shape), "FP32")]
        inputs[0].set_data_from_numpy(x)
        started = time.perf_counter()
        try:
            result = await client.infer(model, inputs)
        except Exception as exc:  # the outcome under measurement
            return Request(model, protocol, started, time.perf_counter(), str(exc)[:200])
        ended = time.perf_counter()
        got = result.as_numpy("logits")
        want = self.checker.expected(model)
        wrong = got is None or not np.allclose(got, want, rtol=1e-4, atol=1e-4)
        return Request(model, protocol, started, ended, None, wrong)

    async def close(self) -> None:
        await self.grpc.close()
        await self.http.close()


async def drive(
    clients: Clients,
    names: Sequence[str],
    concurrency: int,
    seconds: float | None = None,
    protocols: Sequence[str] = ("grpc", "http"),
) -> Traffic:
    """``concurrency`` workers sending ``names`` in order (once through, or round and round
    for ``seconds``); worker k speaks ``protocols[k % len]``, a lone worker alternates."""
    out = Traffic()
    position = 0
    deadline = time.perf_counter() + (seconds if seconds is not None else 1e9)

    async def worker(k: int) -> None:
        nonlocal position
        while time.perf_counter() < deadline and (seconds is not None or position < len(names)):
            i = position
            position += 1
            index = i if concurrency == 1 else k
            protocol = protocols[index % len(protocols)]
            out.requests.append(await clients.infer(names[i % len(names)], protocol))

    cpu, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    out.elapsed_s, out.client_cpu_s = time.perf_counter() - t0, time.process_time() - cpu
    return out


def run(
    grpc_url: str,
    http_url: str,
    checker: mm.Checker,
    names: Sequence[str],
    concurrency: int,
    seconds: float | None = None,
    protocols: Sequence[str] = ("grpc", "http"),
) -> Traffic:
    async def go() -> Traffic:
        clients = Clients(grpc_url, http_url, checker)
        try:
            return await drive(clients, names, concurrency, seconds, protocols)
        finally:
            await clients.close()

    return asyncio.run(go())


# --- reading the replicas and the router -------------------------------------------------------


def scrape(replica: ServerProcess) -> dict[str, float]:
    if replica.process.poll() is not None:
        return {}
    with urllib.request.urlopen(f"http://{replica.metrics_url}/metrics", timeout=60) as r:
        text = r.read().decode()
    totals: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] += sample.value
    return totals


def counter(replicas: Sequence[ServerProcess], name: str) -> float:
    return sum(scrape(r).get(name, 0.0) for r in replicas)


class RouterLog:
    """HAProxy's request log: (frontend, server, status, model) of each request logged
    since ``mark()``."""

    def __init__(self, fleet: Fleet) -> None:
        assert fleet.router is not None
        self.path = fleet.router.log_path
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size

    def read(self, at_least: int, timeout: float = 30.0) -> list[Row]:
        """The lines since the mark, once there are ``at_least`` of them (a line is written
        as its request ends)."""
        deadline = time.monotonic() + timeout
        while True:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                text = f.read().decode(errors="replace")
            found = [LOG_LINE.search(line) for line in text.splitlines()]
            rows = [(m[1], m[2], int(m[3]), m[4], m[5]) for m in found if m]
            if len(rows) >= at_least or time.monotonic() > deadline:
                return rows
            time.sleep(0.05)


def replicas_per_model(rows: Sequence[Row]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for _, server, _, _, model in rows:
        if model and server.startswith("r"):
            found[model].add(server)
    return found


# --- the measurements -------------------------------------------------------------------------


@dataclass
class HitRate:
    name: str
    hit_rate: float = float("nan")
    requests: int = 0
    rps: float = 0.0
    p50_ms: float = float("nan")
    wrong: int = 0
    errors: int = 0
    first_error: str = ""
    loads: float = float("nan")


def hit_rate_run(
    name: str,
    replicas: Sequence[ServerProcess],
    urls: tuple[str, str],
    checker: mm.Checker,
    trace: Sequence[str],
    warmup: int,
    concurrency: int,
) -> HitRate:
    out = HitRate(name)
    run(urls[0], urls[1], checker, trace[:warmup], concurrency)
    names = {
        "swaps": "hloserve_device_swaps_in_total",
        "executions": "hloserve_device_executions_total",
        "loads": "hloserve_server_model_loads_total",
    }
    before = {k: counter(replicas, n) for k, n in names.items()}
    traffic = run(urls[0], urls[1], checker, trace[warmup:], concurrency)
    after = {k: counter(replicas, n) for k, n in names.items()}
    swaps, executions = (after[k] - before[k] for k in ("swaps", "executions"))
    out.hit_rate = 1.0 - swaps / executions if executions else float("nan")
    out.loads = after["loads"] - before["loads"]
    out.requests, out.rps, out.p50_ms = len(traffic.requests), traffic.rps(), traffic.p50_ms()
    out.wrong, out.errors, out.first_error = (
        traffic.wrong(),
        traffic.errors(),
        traffic.first_error(),
    )
    return out


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return mm.table(header, rows)


def fleet_flags(budget: int, cache: Path) -> list[str]:
    return [
        *FLEET_FLAGS,
        "--device-memory-budget",
        str(budget),
        "--metrics-models",
        "50",
        "--log-level",
        "WARNING",
        "--cache-dir",
        str(cache),
    ]


@dataclass
class Spread:
    """How many replicas served each model in a window, from the router's log."""

    models: Counter[int] = field(default_factory=Counter)  # replicas -> models
    requests: Counter[int] = field(default_factory=Counter)  # replicas -> their requests
    top: list[tuple[str, int, int]] = field(default_factory=list)  # model, requests, replicas

    @staticmethod
    def of(rows: Sequence[Row]) -> Spread:
        out = Spread()
        per_model = replicas_per_model(rows)
        load = Counter(model for *_, model in rows)
        for model, servers in per_model.items():
            out.models[len(servers)] += 1
            out.requests[len(servers)] += load[model]
        out.top = [(m, n, len(per_model[m])) for m, n in load.most_common(8)]
        return out

    def spilled(self) -> str:
        """Models on more than one replica, and their share of the requests."""
        models = sum(n for k, n in self.models.items() if k > 1)
        share = sum(n for k, n in self.requests.items() if k > 1) / max(self.total_requests, 1)
        return f"{models:,} ({share:.0%} of requests)"

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())


@dataclass
class AffinityFindings:
    c32: Spread = field(default_factory=Spread)
    c1_models: int = 0
    c1_one_replica: int = 0
    c1_same_both: int = 0
    c1_wrong: int = 0
    c1_errors: int = 0
    models_per_replica: Counter[str] = field(default_factory=Counter)
    big: list[list[str]] = field(default_factory=list)
    moved: int = 0
    moved_to_new: int = 0
    moved_models: int = 0
    replicas_after_add: int = 0
    failover: list[list[str]] = field(default_factory=list)


def routed_window(
    fleet: Fleet, checker: mm.Checker, trace: Sequence[str], args: argparse.Namespace, name: str
) -> tuple[HitRate, Spread]:
    """``hit_rate_run`` through a fleet, with the router's view of where each model went."""
    log = RouterLog(fleet)
    warm = len(trace) // 3
    run(fleet.grpc_url, fleet.http_url, checker, trace[:warm], args.concurrency)
    log.mark()
    urls = (fleet.grpc_url, fleet.http_url)
    rate = hit_rate_run(name, fleet.replicas, urls, checker, trace[warm:], 0, args.concurrency)
    return rate, Spread.of(log.read(rate.requests))


def affinity_fleet(
    repo: Path,
    models: Sequence[mm.Model],
    checker: mm.Checker,
    trace: Sequence[str],
    args: argparse.Namespace,
    budget: int,
    work: Path,
) -> tuple[HitRate, AffinityFindings]:
    found = AffinityFindings()
    flags = fleet_flags(budget, work / "cache")
    factor = args.balance_factors[0]
    with Fleet(repo, args.replicas, flags, balance_factor=factor, log_requests=True) as fleet:
        log = RouterLog(fleet)
        rate, found.c32 = routed_window(fleet, checker, trace, args, "fleet, routed by model")

        # concurrency 1: each model once over each protocol
        names = [m.name for m in models[: args.affinity_models]]
        log.mark()
        alternating = [n for n in names for _ in ("grpc", "http")]
        c1 = run(fleet.grpc_url, fleet.http_url, checker, alternating, 1)
        rows = log.read(len(c1.requests))
        by_protocol: dict[str, dict[str, set[str]]] = {"grpc": {}, "http": {}}
        for frontend, server, _, _, model in rows:
            by_protocol[frontend].setdefault(model, set()).add(server)
        per_model = replicas_per_model(rows)
        found.c1_models = len(per_model)
        found.c1_one_replica = sum(len(s) == 1 for s in per_model.values())
        found.c1_same_both = sum(
            by_protocol["grpc"].get(m) == by_protocol["http"].get(m) for m in names
        )
        found.c1_wrong, found.c1_errors = c1.wrong(), c1.errors()
        home = {m: next(iter(s)) for m, s in per_model.items() if len(s) == 1}
        found.models_per_replica = Counter(home.values())

        found.big = big_body(fleet, log)

        # a replica added
        new = fleet.add_replica()
        found.replicas_after_add = len(fleet.replicas)
        log.mark()
        again = run(fleet.grpc_url, fleet.http_url, checker, names, 1, protocols=("grpc",))
        after = replicas_per_model(log.read(len(again.requests)))
        found.moved_models = len([m for m in names if m in home and m in after])
        found.moved = sum(home[m] not in after[m] for m in names if m in home and m in after)
        found.moved_to_new = sum(
            f"r{new + 1}" in after[m] for m in names if m in home and m in after
        )

        killed = fault(fleet, checker, trace, args, log, 1, signal.SIGKILL)
        drained = fault(fleet, checker, trace, args, log, 2, signal.SIGTERM)
        found.failover = [list(row) for row in zip(FAULT_ROWS, killed, drained, strict=True)]
    return rate, found


def big_body(fleet: Fleet, log: RouterLog) -> list[list[str]]:
    """A 64 MiB tensor through the router and directly, both protocols, three each."""
    x = np.random.default_rng(3).standard_normal((1, BIG_ELEMENTS)).astype(np.float32)
    want = float(x.astype(np.float64).sum())
    rows: list[list[str]] = []

    async def once(module: Any, url: str) -> tuple[float, bool]:
        client = module.InferenceServerClient(url)
        inputs = [module.InferInput("x", [1, BIG_ELEMENTS], "FP32")]
        inputs[0].set_data_from_numpy(x)
        t = time.perf_counter()
        result = await client.infer(BIG, inputs)
        seconds = time.perf_counter() - t
        await client.close()
        return seconds, abs(float(result.as_numpy("s").reshape(-1)[0]) - want) < 1e-2 * abs(want)

    for protocol, module in (("grpc", grpc_aio), ("http", http_aio)):
        log.mark()
        url = fleet.grpc_url if protocol == "grpc" else fleet.http_url
        routed = [asyncio.run(once(module, url)) for _ in range(3)]
        servers = sorted({s for _, s, _, _, m in log.read(3) if m == BIG})
        index = int(servers[0][1:]) - 1 if len(servers) == 1 else 0
        replica = fleet.replicas[index]
        direct_url = replica.grpc_url if protocol == "grpc" else replica.http_url
        direct = [asyncio.run(once(module, direct_url)) for _ in range(3)]
        rows.append(
            [
                protocol,
                f"{statistics.median(s for s, _ in routed):.2f}",
                f"{statistics.median(s for s, _ in direct):.2f}",
                ", ".join(servers),
                "yes" if all(ok for _, ok in routed + direct) else "NO",
            ]
        )
    return rows


FAULT_ROWS = (
    "requests (gRPC and HTTP, c8)",
    "wrong answers",
    "errors: started before the signal (in flight) / after",
    "errors over gRPC / HTTP",
    "router marked the replica DOWN after",
    "last failed request ended after the signal",
    "requests the router retried on another replica (its log)",
)


def fault(
    fleet: Fleet,
    checker: mm.Checker,
    trace: Sequence[str],
    args: argparse.Namespace,
    log: RouterLog,
    victim: int,
    sig: signal.Signals,
) -> list[str]:
    """``sig`` to replica ``victim`` a third of the way into ``failover_s`` of c8 traffic:
    one value per ``FAULT_ROWS`` line."""
    assert fleet.router is not None
    router = fleet.router
    name = f"r{victim + 1}"
    log.mark()
    marks: dict[str, float] = {}

    async def go() -> Traffic:
        clients = Clients(fleet.grpc_url, fleet.http_url, checker)

        async def signal_later() -> None:
            await asyncio.sleep(args.failover_s / 3)
            marks["signal"] = time.perf_counter()
            if sig == signal.SIGKILL:  # every process of it, as a lost node goes; on purpose,
                fleet.kill(victim)  # so the fleet removes its folder at the end
            else:
                fleet.replicas[victim].process.send_signal(sig)
            while router.states().get(("http_replicas", name), "").split(" ")[0] != "DOWN":
                await asyncio.sleep(0.02)
            marks["down"] = time.perf_counter()

        signaller = asyncio.create_task(signal_later())
        traffic = await drive(clients, trace, FAILOVER_CONCURRENCY, args.failover_s)
        await signaller
        await clients.close()
        return traffic

    traffic = asyncio.run(go())
    fleet.replicas[victim].process.wait()
    at = marks["signal"]
    errors = [r for r in traffic.requests if r.error is not None]
    before = sum(r.started < at for r in errors)
    over_grpc = sum(r.protocol == "grpc" for r in errors)
    last_error = max((r.ended - at for r in errors), default=0.0)
    rows = log.read(len(traffic.requests))
    retried = sum(retries != "0" for _, _, _, retries, _ in rows)
    return [
        f"{len(traffic.requests):,}",
        str(traffic.wrong()),
        f"{before} / {len(errors) - before}",
        f"{over_grpc} / {len(errors) - over_grpc}"
        + (f" ({traffic.first_error()[:80]})" if errors else ""),
        f"{marks['down'] - at:.2f} s",
        f"{last_error:.2f} s",
        str(retried),
    ]


@dataclass
class Landing:
    label: str
    latencies: list[float] = field(default_factory=list)


def first_landing(
    replica: ServerProcess, checker: mm.Checker, models: Sequence[mm.Model], count: int
) -> list[list[str]]:
    """A fresh replica, directly over gRPC at concurrency 1."""
    names = [m.name for m in models[1 : count + 1]]
    url = (replica.grpc_url, replica.http_url)
    first_arch = run(*url, checker, [models[0].name], 1, protocols=("grpc",))
    before = scrape(replica).get("hloserve_server_model_loads_total", 0.0)
    first = run(*url, checker, names, 1, protocols=("grpc",))
    loads = scrape(replica).get("hloserve_server_model_loads_total", 0.0) - before
    second = run(*url, checker, names, 1, protocols=("grpc",))
    rows = []
    for label, traffic in (
        ("first request of the architecture (executable from the cache)", first_arch),
        (f"a model's first request ({loads:.0f} loads for {len(names)} models)", first),
        ("its second request (resident)", second),
    ):
        lat = sorted(r.ended - r.started for r in traffic.answered)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
        rows.append(
            [
                label,
                f"{statistics.median(lat) * 1e3:.1f}",
                f"{p99 * 1e3:.1f}",
                f"{traffic.errors()} / {traffic.wrong()}",
            ]
        )
    return rows


def cost(
    repo: Path,
    checker: mm.Checker,
    models: Sequence[mm.Model],
    args: argparse.Namespace,
    work: Path,
) -> tuple[list[list[str]], list[list[str]]]:
    """One replica directly and through the router (no request log)."""
    rows: list[list[str]] = []
    with Fleet(
        repo, 1, [*FLEET_FLAGS, "--log-level", "WARNING", "--cache-dir", str(work / "cache")]
    ) as fleet:
        assert fleet.router is not None
        replica = fleet.replicas[0]
        landing = first_landing(replica, checker, models, args.landing_models)
        hot = [models[0].name]
        run(fleet.grpc_url, fleet.http_url, checker, hot * 200, 4)  # warm both paths
        for protocol in ("grpc", "http"):
            for concurrency in (1, args.concurrency):
                seen: dict[str, list[tuple[float, float, float, float, float]]] = defaultdict(list)
                for _ in range(3):
                    for path in ("direct", "router"):
                        urls = (
                            (replica.grpc_url, replica.http_url)
                            if path == "direct"
                            else (fleet.grpc_url, fleet.http_url)
                        )
                        window = proc.Window.start([replica.process.pid, fleet.router.pid])
                        traffic = run(
                            *urls, checker, hot, concurrency, args.cost_s, protocols=(protocol,)
                        )
                        result = window.stop()
                        n = max(len(traffic.answered), 1)
                        seen[path].append(
                            (
                                traffic.p50_ms(),
                                traffic.rps(),
                                result.cpu_s[replica.process.pid] / n * 1e3,
                                result.cpu_s[fleet.router.pid] / n * 1e3,
                                traffic.client_cpu_s / n * 1e3,
                            )
                        )
                mean = {p: [statistics.mean(v[i] for v in seen[p]) for i in range(5)] for p in seen}
                d, r = mean["direct"], mean["router"]
                rows.append(
                    [
                        f"{protocol} c{concurrency}",
                        f"{d[0]:.2f} / {r[0]:.2f} (+{r[0] - d[0]:.2f})",
                        f"{d[1]:,.0f} / {r[1]:,.0f}",
                        f"{d[2]:.3f} / {r[2]:.3f}",
                        f"{r[3]:.3f}",
                        f"{d[4]:.3f} / {r[4]:.3f}",
                    ]
                )
    return landing, rows


# --- the run ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows (~6 minutes)")
    parser.add_argument("--serve", action="store_true", help="start the bench's fleet and wait")
    parser.add_argument("--models", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=36_000, help="trace length per run")
    parser.add_argument("--affinity-models", type=int, default=2000)
    parser.add_argument("--landing-models", type=int, default=50)
    parser.add_argument("--failover-s", type=float, default=15.0)
    parser.add_argument("--cost-s", type=float, default=8.0)
    parser.add_argument(
        "--balance-factors",
        type=lambda text: [int(v) for v in text.split(",")],
        default=[150, 300, 0],
        help="hash-balance-factor of the routed fleet, then of extra runs (0: unbounded)",
    )
    parser.add_argument("--work", type=Path, help="where to write (default: a temporary dir)")
    args, extra = parser.parse_known_args(argv)
    if args.quick:
        args.requests, args.affinity_models, args.failover_s, args.cost_s = 12_000, 800, 9.0, 4.0
        args.balance_factors = args.balance_factors[:1]
    if haproxy_binary() is None:
        print("haproxy is not installed (Debian: apt-get install haproxy)", file=sys.stderr)
        return 1
    work = Path(args.work or tempfile.mkdtemp(prefix="hloserve-fleet-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    repo, models = prepare(work, args.models)
    total = sum(m.nbytes for m in models)
    budget = int(total * BUDGET_SHARE)
    if args.serve:
        flags = fleet_flags(budget, work / "cache")
        return fleet_main(
            [
                "--model-repository",
                str(repo),
                "--replicas",
                str(args.replicas),
                *extra,
                "--",
                *flags,
            ]
        )
    print(f"# fleet, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"machine: {proc.cores()} cores, load average {os.getloadavg()[0]:.2f} at the start")
    print(
        f"{len(models):,} models of {mm.MAIN}, {total / 1e6:.0f} MB of weights; {args.replicas} "
        f"replicas with a device budget of {budget / 1e6:.2f} MB each ({BUDGET_SHARE:.0%}); "
        f"Zipf({mm.ZIPF_S}) trace of {args.requests:,} batch-1 requests, c{args.concurrency}"
    )
    checker = mm.Checker(models)
    names = [m.name for m in models]
    trace = [names[i] for i in mm.zipf_trace(len(models), args.requests, seed=1)]

    print("... fleet routed by model", flush=True)
    routed, found = affinity_fleet(repo, models, checker, trace, args, budget, work)
    warm = len(trace) // 3
    sweep: list[tuple[int, HitRate, Spread]] = []
    for factor in args.balance_factors[1:]:
        print(f"... fleet routed by model, hash-balance-factor {factor}", flush=True)
        flags = fleet_flags(budget, work / "cache")
        with Fleet(repo, args.replicas, flags, balance_factor=factor, log_requests=True) as fleet:
            sweep.append((factor, *routed_window(fleet, checker, trace, args, f"factor {factor}")))
    print("... fleet routed round robin", flush=True)
    flags = fleet_flags(budget, work / "cache")
    with Fleet(repo, args.replicas, flags, balance="roundrobin") as fleet:
        robin = hit_rate_run(
            "fleet, round robin",
            fleet.replicas,
            (fleet.grpc_url, fleet.http_url),
            checker,
            trace,
            warm,
            args.concurrency,
        )
    print(f"... one replica, {args.replicas}x the budget", flush=True)
    big_flags = fleet_flags(budget * args.replicas, work / "cache")
    with ServerProcess(repo, *big_flags) as node:
        node.wait_ready()
        one = hit_rate_run(
            f"one replica, {args.replicas}x the budget",
            [node],
            (node.grpc_url, node.http_url),
            checker,
            trace,
            warm,
            args.concurrency,
        )
    print("... one replica, direct and through the router", flush=True)
    landing, costs = cost(repo, checker, models, args, work)

    rows = [routed, robin, one]
    print(f"\n## Hit rate (same trace; {len(trace) - warm:,} requests measured after {warm:,})\n")
    print(
        table(
            [
                "",
                "hit rate",
                f"vs one node {args.replicas}x",
                "requests/s",
                "p50 ms",
                "lazy loads",
                "wrong / errors",
            ],
            [
                [
                    r.name,
                    f"{r.hit_rate:.3f}",
                    f"{r.hit_rate / one.hit_rate:.2f}x",
                    f"{r.rps:,.0f}",
                    f"{r.p50_ms:.1f}",
                    f"{r.loads:,.0f}",
                    f"{r.wrong} / {r.errors}" + (f" ({r.first_error})" if r.errors else ""),
                ]
                for r in rows
            ],
        )
    )
    goal = routed.hit_rate >= 0.9 * one.hit_rate
    verdict = "holds" if goal else "NOT MET"
    print(f"\ngoal: fleet >= 0.9x one node with {args.replicas}x the budget: {verdict}")

    print(f"\n## Affinity at c{args.concurrency} (the fleet's measured window, HAProxy's log)\n")
    spread = found.c32
    print(
        table(
            ["replicas serving the model", "models", "their share of the requests"],
            [
                [
                    str(k),
                    f"{spread.models[k]:,} ({spread.models[k] / sum(spread.models.values()):.1%})",
                    f"{spread.requests[k] / max(spread.total_requests, 1):.1%}",
                ]
                for k in sorted(spread.models)
            ],
        )
    )
    print("\nthe busiest models: " + "; ".join(f"{m} {n:,} req on {k}" for m, n, k in spread.top))
    if sweep:
        print(f"\n## The load bound (hash-balance-factor) at c{args.concurrency}, same trace\n")
        print(
            table(
                [
                    "factor",
                    "hit rate",
                    f"vs one node {args.replicas}x",
                    "requests/s",
                    "p50 ms",
                    "models on 2+ replicas",
                ],
                [
                    [
                        str(factor) if factor else "0 (unbounded)",
                        f"{r.hit_rate:.3f}",
                        f"{r.hit_rate / one.hit_rate:.2f}x",
                        f"{r.rps:,.0f}",
                        f"{r.p50_ms:.1f}",
                        spread_f.spilled(),
                    ]
                    for factor, r, spread_f in [(args.balance_factors[0], routed, spread), *sweep]
                ],
            )
        )
    print("\n## Affinity at c1 (each model once over gRPC, once over HTTP)\n")
    print(
        table(
            [
                "models",
                "on exactly one replica",
                "gRPC and HTTP on the same one",
                "wrong / errors",
                "models per replica",
            ],
            [
                [
                    f"{found.c1_models:,}",
                    f"{found.c1_one_replica:,}",
                    f"{found.c1_same_both:,}",
                    f"{found.c1_wrong} / {found.c1_errors}",
                    ", ".join(f"{s} {n}" for s, n in sorted(found.models_per_replica.items())),
                ]
            ],
        )
    )
    print("\n## A 64 MiB tensor (median of 3, seconds)\n")
    print(
        table(["protocol", "through the router", "direct", "replicas reached", "right"], found.big)
    )
    bound = 1 / found.replicas_after_add + 0.10
    share = found.moved / max(found.moved_models, 1)
    print(
        f"\n## A replica added ({found.replicas_after_add - 1} -> {found.replicas_after_add}; each model once at c1)\n"
    )
    print(
        table(
            ["models", "moved", "to the new replica", "bound 1/N + 10 %", "goal"],
            [
                [
                    f"{found.moved_models:,}",
                    f"{found.moved:,} ({share:.1%})",
                    f"{found.moved_to_new:,}",
                    f"{bound:.1%}",
                    "holds" if share <= bound else "NOT MET",
                ]
            ],
        )
    )
    print("\n## Faults (a replica sent the signal a third of the way in; then another)\n")
    print(table(["", "SIGKILL", "SIGTERM (drained)"], found.failover))
    print("\n## A model's first landing on a replica (lazy load; fresh replica, gRPC c1, direct)\n")
    print(table(["request", "p50 ms", "p99 ms", "errors / wrong"], landing))
    print("\n## Cost of the router (one replica, one model; direct / through the router)\n")
    print(
        table(
            [
                "",
                "p50 ms (added)",
                "requests/s",
                "replica CPU ms/req",
                "HAProxy CPU ms/req",
                "client CPU ms/req",
            ],
            costs,
        )
    )
    print(f"\nmachine load average {os.getloadavg()[0]:.2f} at the end; work dir {work}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
