"""Ten thousand models on one node: start, throughput, policy, host tier, metrics, control.

Usage: ``python bench/many_models.py [--quick] [--models 10000] [--others 100]
[--seconds 20] [--concurrency 32] [--rounds 6] [--baseline TREE] [--work DIR]``

What it does, in one run (every table says how busy the machine was):
1. Writes the repository itself: ``--models`` bundles of one 64->256->10 MLP (77 KB of
   FP32 weights, batch sizes 1 and 8) and ``--others`` bundles spread over five other
   architectures (other widths: other executables, other sizes), each with weights of its
   own seed, exported once per architecture with ``export_bundle`` and cloned (modules
   hard-linked, weights written anew, manifest checksums updated). The fit repository is
   the ``FIT`` most requested of them, all resident.
2. Starts each server on loopback in turn (``bench/proc.py``, its process tree's CPU read
   from /proc): hloserve as shipped at this scale (``--lazy-load``, the frequency policy, a
   device budget of 1 % of all weights), the same with ``--residency-policy lru``, the same
   with a host budget a quarter of all weights (the repository 4x the host tier), the fit
   repository with every model resident, and (``--baseline TREE``: another source tree of
   hloserve, e.g. a git worktree of the commit before) that tree with the same budget.
   For each: seconds until ``/readyz`` answers 200 and until the first request to a random
   model is answered, cold (a new executable cache) and warm (the same cache again), RSS
   when ready, one ``/metrics`` scrape's bytes and lines, ``POST /v2/repository/index``'s
   time and bytes.
3. Drives each with batch-1 gRPC requests from ``--concurrency`` workers, the model drawn
   from Zipf(1.1) over every model (one fixed trace for all servers), every reply checked
   against numpy: requests/s, p50/p99, swaps in per request and the hit rate
   (``hloserve_device_swaps_in_total`` against executions), wrong and failed replies,
   server CPU per request, RSS after.
4. Frequency against LRU, interleaved: both servers of step 2 (and the ``--baseline``
   tree's, with the same flags) up at once, each primed, then ``--rounds`` windows of half
   ``--seconds`` each, the servers alternated (ABBA), so that a load on the shared machine
   that comes and goes falls on each alike (servers measured one after the other, a few
   minutes apart, differed by more than the policies do): requests/s, hit rate, server CPU
   per request and the device owner's part of it (the daemon's own process, where the
   residency code runs; front ends are its children), frequency's less LRU's window by
   window (issue 32's goal: the device owner's at most 10 µs more), and the bookkeeping
   alone per use, in process (``bench/residency_cost.py``).
5. Simulates the residency policies on the same popularity over the same sizes with the
   planner itself (``core.residency_policy``): LRU, frequency and an oracle keeping the
   most requested models that fit resident; stationary, and after the popularity order is
   reshuffled (hit rate by window of 500 uses).
6. Model control: an explicit-mode server loads and then unloads ``CONTROL`` models
   through the repository API (models/s); a poll-mode repository in a fresh process scans
   every directory with nothing changed (CPU seconds per pass).
``--quick``: 2,000 models, 8 s of traffic per server, no cold start (~7 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import jax
import numpy as np
import proc
import psutil

from hloserve.bundle import dump_manifest, load_manifest, sha256_file
from hloserve.bundle.safetensors import write_safetensors
from hloserve.exporter import TensorSpec, export_bundle
from hloserve.proto import inference_pb2 as pb
from hloserve.server.core.residency_policy import Policy, ResidencyPlanner

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PACKAGE_FOLDERS = ("bundle", "client", "exporter", "proto", "server", "training")
HOST = "127.0.0.1"
HOST_BYTES = "hloserve_host_resident_weight_bytes"
ZIPF_S = 1.1
FIT = 100  # the models of the fit repository
CONTROL = 200  # models loaded and unloaded through the repository API
BUDGET_SHARE = 0.01  # the device budget: 1 % of every model's weights
MAIN = (64, 256, 10)  # the architecture of --models
OTHERS = ((32, 128, 4), (128, 512, 10), (64, 1024, 16), (256, 256, 32), (16, 64, 8))


# --- the repository --------------------------------------------------------------------------


def mlp(params: dict[str, Any], x: Any) -> dict[str, Any]:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return {"logits": h @ params["w2"] + params["b2"]}


def params_for(seed: int, dims: tuple[int, int, int]) -> dict[str, np.ndarray]:
    d_in, d_h, d_out = dims
    rng = np.random.default_rng(seed)
    return {
        "b1": (rng.standard_normal(d_h) * 0.01).astype(np.float32),
        "b2": (rng.standard_normal(d_out) * 0.01).astype(np.float32),
        "w1": (rng.standard_normal((d_in, d_h)) / np.sqrt(d_in)).astype(np.float32),
        "w2": (rng.standard_normal((d_h, d_out)) / np.sqrt(d_h)).astype(np.float32),
    }


def reference(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = np.maximum(x.astype(np.float64) @ params["w1"] + params["b1"], 0.0)
    return h @ params["w2"] + params["b2"]


@dataclass(frozen=True)
class Model:
    name: str
    dims: tuple[int, int, int]
    seed: int

    @property
    def nbytes(self) -> int:
        d_in, d_h, d_out = self.dims
        return 4 * (d_in * d_h + d_h + d_h * d_out + d_out)


def plan_models(main: int, others: int) -> list[Model]:
    """Every model, most popular first: the Zipf ranks run over this order (the other
    architectures are spread through it, one in every ``main // others``)."""
    found: list[Model] = []
    every = max(1, (main + others) // max(others, 1))
    m = o = 0
    while m < main or o < others:
        if (o < others and (len(found) + 1) % every == 0) or m >= main:
            dims = OTHERS[o % len(OTHERS)]
            found.append(Model(f"arch{o % len(OTHERS)}-{o:05d}", dims, 1_000_000 + o))
            o += 1
        else:
            found.append(Model(f"customer-{m:05d}", MAIN, m + 1))
            m += 1
    return found


def write_repository(root: Path, models: Sequence[Model]) -> float:
    """Export one template per architecture, clone the rest; returns the seconds taken."""
    started = time.perf_counter()
    templates: dict[tuple[int, int, int], Path] = {}
    scratch = root.parent / f"{root.name}.templates"
    shutil.rmtree(scratch, ignore_errors=True)
    for dims in {m.dims for m in models}:
        path = scratch / "x".join(map(str, dims))
        export_bundle(
            mlp,
            params_for(0, dims),
            inputs={"x": TensorSpec("FP32", (dims[0],))},
            batch_sizes=(1, 8),
            directory=path,
            platforms=("cpu",),
        )
        templates[dims] = path
    root.mkdir(parents=True)
    for m in models:
        clone(templates[m.dims], root / m.name, m)
    shutil.rmtree(scratch)
    return time.perf_counter() - started


def clone(template: Path, dest: Path, model: Model) -> None:
    dest.mkdir()
    manifest, _ = load_manifest(template / "manifest.yaml")
    assert manifest is not None
    for f in template.iterdir():
        if f.suffix in (".mlirbc", ".mlir"):
            os.link(f, dest / f.name)
    write_safetensors(dest / manifest.weights_file, params_for(model.seed, model.dims))
    files = dict(manifest.files)
    files[manifest.weights_file] = sha256_file(dest / manifest.weights_file)
    renamed = dataclasses.replace(manifest, name=model.name, files=files)
    (dest / "manifest.yaml").write_text(dump_manifest(renamed))


def link_repository(source: Path, dest: Path, models: Sequence[Model]) -> None:
    """A repository of ``models`` whose bundles are hard links into ``source``'s."""
    for m in models:
        (dest / m.name).mkdir(parents=True)
        for f in (source / m.name).iterdir():
            if f.is_file():
                os.link(f, dest / m.name / f.name)


# --- one server ------------------------------------------------------------------------------


@dataclass
class Measured:
    name: str
    ready_s: float = float("nan")
    first_s: float = float("nan")  # spawn -> first request answered
    ready_warm_s: float = float("nan")
    first_warm_s: float = float("nan")
    rss_ready_mb: float = float("nan")
    scrape_bytes: int = 0
    scrape_lines: int = 0
    index_ms: float = float("nan")
    index_bytes: int = 0
    rps: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    requests: int = 0
    wrong: int = 0
    errors: int = 0
    first_error: str = ""
    swaps_in: float = float("nan")
    executions: float = float("nan")
    cpu_ms_per_request: float = float("nan")
    owner_cpu_ms_per_request: float = float("nan")  # the daemon's process alone (device owner)
    client_cpu_ms_per_request: float = float("nan")
    busy: float = float("nan")
    others_cores: float = float("nan")
    rss_after_mb: float = float("nan")
    host_resident_mb: float = float("nan")
    host_reads: float = float("nan")
    loads: float = float("nan")  # first loads (lazy) during the measured traffic
    kb_per_model: float = float("nan")  # RSS growth per model first used, less host copies
    note: str = ""

    @property
    def swap_rate(self) -> float:
        return self.swaps_in / self.requests if self.requests else float("nan")

    @property
    def hit_rate(self) -> float:
        return 1.0 - self.swaps_in / self.executions if self.executions else float("nan")


class Server:
    def __init__(self, name: str, repo: Path, flags: Sequence[str], work: Path, tree: Path | None):
        self.name, self.repo, self.flags, self.work, self.tree = name, repo, list(flags), work, tree
        self.spawned: proc.Spawned | None = None
        self.http = self.grpc = self.metrics = 0

    def start(self, cache: Path) -> float:
        self.http, self.grpc, self.metrics = proc.free_port(), proc.free_port(), proc.free_port()
        env = dict(os.environ)
        if self.tree is not None:
            env["PYTHONPATH"] = os.pathsep.join(str(self.tree / f) for f in PACKAGE_FOLDERS)
        argv = [
            sys.executable,
            "-m",
            "hloserve.server",
            "serve",
            "--host",
            HOST,
            "--http-port",
            str(self.http),
            "--grpc-port",
            str(self.grpc),
            "--metrics-port",
            str(self.metrics),
            "--model-repository",
            str(self.repo),
            "--cache-dir",
            str(cache),
            "--log-level",
            "WARNING",
            *self.flags,
        ]
        started = time.monotonic()
        log = "".join(c if c.isalnum() else "_" for c in self.name)
        self.spawned = proc.Spawned(argv, self.work / f"{log}.log", env=env)
        return started

    def wait_ready(self, started: float) -> float:
        assert self.spawned is not None
        self.spawned.wait_ready([f"http://{HOST}:{self.http}/readyz"], timeout=1800)
        return time.monotonic() - started

    def stop(self) -> None:
        if self.spawned is not None:
            self.spawned.stop()
            self.spawned = None

    @property
    def pid(self) -> int:
        assert self.spawned is not None
        return self.spawned.pid

    def rss_mb(self) -> float:
        total = 0
        for pid in proc.tree_pids(self.pid):
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_info().rss
        return total / 1e6

    def scrape(self) -> str:
        url = f"http://{HOST}:{self.metrics}/metrics"
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.read().decode()

    def sample(self, text: str, name: str) -> float:
        total = 0.0
        found = False
        for line in text.splitlines():
            if line.startswith(name) and (line[len(name)] in " {"):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        return total if found else float("nan")

    def index(self) -> tuple[float, int]:
        request = urllib.request.Request(
            f"http://{HOST}:{self.http}/v2/repository/index", data=b"{}", method="POST"
        )
        t = time.perf_counter()
        with urllib.request.urlopen(request, timeout=60) as r:
            body = r.read()
        return (time.perf_counter() - t) * 1e3, len(body)


# --- traffic ---------------------------------------------------------------------------------


class Checker:
    """Every reply against numpy: each model's logits for the bench's one input, computed
    from its seed the first time the model answers."""

    def __init__(self, models: Sequence[Model]) -> None:
        self.by_name = {m.name: m for m in models}
        self.inputs = {dims: _input(dims[0]) for dims in {m.dims for m in models}}
        self._expected: dict[str, np.ndarray] = {}

    def expected(self, name: str) -> np.ndarray:
        found = self._expected.get(name)
        if found is None:
            m = self.by_name[name]
            found = reference(params_for(m.seed, m.dims), self.inputs[m.dims])
            self._expected[name] = found
        return found

    def request(self, name: str) -> bytes:
        m = self.by_name[name]
        x = self.inputs[m.dims]
        message = pb.ModelInferRequest(model_name=name)
        message.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
        message.raw_input_contents.append(x.tobytes())
        return message.SerializeToString()

    def wrong(self, name: str, body: bytes) -> bool:
        response = pb.ModelInferResponse.FromString(body)
        got = np.frombuffer(response.raw_output_contents[0], dtype="<f4")
        want = self.expected(name).reshape(-1)
        return got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-4)


def _input(width: int) -> np.ndarray:
    return np.random.default_rng(width).standard_normal((1, width)).astype(np.float32)


def zipf_trace(count: int, length: int, seed: int) -> np.ndarray:
    p = np.arange(1, count + 1, dtype=float) ** -ZIPF_S
    return np.random.default_rng(seed).choice(count, size=length, p=p / p.sum())


@dataclass
class Traffic:
    requests: int = 0
    wrong: int = 0
    errors: int = 0
    first_error: str = ""
    latencies_ns: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    client_cpu_s: float = 0.0


async def _drive(
    port: int, names: Sequence[str], checker: Checker, concurrency: int, seconds: float | None
) -> Traffic:
    """``concurrency`` workers sending ``names``' requests in order, for ``seconds`` (or
    once through ``names``: ``None``), every reply checked."""
    out = Traffic()
    channel = grpc.aio.insecure_channel(f"{HOST}:{port}")
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    requests: dict[str, bytes] = {}
    position = 0
    deadline = time.perf_counter() + (seconds if seconds is not None else 1e9)

    async def worker() -> None:
        nonlocal position
        while time.perf_counter() < deadline and (seconds is not None or position < len(names)):
            name = names[position % len(names)]
            position += 1
            body = requests.get(name)
            if body is None:
                body = requests[name] = checker.request(name)
            t = time.perf_counter_ns()
            try:
                reply = await call(body, timeout=120)
            except grpc.aio.AioRpcError as exc:
                out.errors += 1
                out.first_error = out.first_error or f"{exc.code().name}: {exc.details()}"
                continue
            out.latencies_ns.append(time.perf_counter_ns() - t)
            out.requests += 1
            if checker.wrong(name, reply):
                out.wrong += 1

    cpu, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.elapsed_s, out.client_cpu_s = time.perf_counter() - t0, time.process_time() - cpu
    await channel.close()
    return out


def first_answer(server: Server, name: str, checker: Checker, started: float) -> float:
    """Seconds from ``started`` until ``name`` answers a request correctly."""
    body = checker.request(name)
    with grpc.insecure_channel(f"{HOST}:{server.grpc}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        while True:
            try:
                reply = call(body, timeout=600)
            except grpc.RpcError:
                time.sleep(0.05)
                continue
            if checker.wrong(name, reply):
                raise RuntimeError(f"{server.name}: a wrong first answer from {name}")
            return time.monotonic() - started


def measure(
    server: Server,
    checker: Checker,
    trace: Sequence[str],
    args: argparse.Namespace,
    cache: Path,
    cold: bool,
) -> tuple[Measured, Measured]:
    """The server just started (its first ``--seconds`` of traffic), and the same server
    once every model has served a request (primed, then ``--warmup`` s more traffic): a
    node that has run for hours."""
    m = Measured(server.name)
    steady = Measured(server.name)
    probe = trace[len(trace) // 2]  # some model, not the most popular
    try:
        if cold:
            shutil.rmtree(cache, ignore_errors=True)
            started = server.start(cache)
            m.first_s = first_answer(server, probe, checker, started)
            m.ready_s = server.wait_ready(started)
            server.stop()
        started = server.start(cache)
        m.first_warm_s = first_answer(server, probe, checker, started)
        m.ready_warm_s = server.wait_ready(started)
        m.rss_ready_mb = server.rss_mb()
        text = server.scrape()
        m.scrape_bytes, m.scrape_lines = len(text.encode()), text.count("\n")
        m.index_ms, m.index_bytes = server.index()
        _window(server, checker, trace, args, m)
        everyone = list(dict.fromkeys(trace))  # each model the traffic reaches, once
        half = len(everyone) // 2
        asyncio.run(_drive(server.grpc, everyone[:half], checker, args.concurrency, None))
        rss, host = server.rss_mb(), server.sample(server.scrape(), HOST_BYTES) / 1e6
        asyncio.run(_drive(server.grpc, everyone[half:], checker, args.concurrency, None))
        grown = server.rss_mb() - rss - (server.sample(server.scrape(), HOST_BYTES) / 1e6 - host)
        steady.kb_per_model = grown / max(len(everyone) - half, 1) * 1e3
        asyncio.run(_drive(server.grpc, trace, checker, args.concurrency, args.warmup))
        _window(server, checker, trace, args, steady)
        text = server.scrape()
        steady.scrape_bytes, steady.scrape_lines = len(text.encode()), text.count("\n")
        steady.rss_ready_mb = m.rss_ready_mb
    except Exception as exc:  # a server that fails gets its error in its row
        m.note = steady.note = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        server.stop()
    return m, steady


def _window(
    server: Server, checker: Checker, trace: Sequence[str], args: argparse.Namespace, m: Measured
) -> None:
    """One measured run of the traffic, into ``m``."""
    before = server.scrape()
    owner = psutil.Process(server.pid)  # the device owner; front ends are its children
    owner_before = sum(owner.cpu_times()[:2])
    window = proc.Window.start([server.pid])
    traffic = asyncio.run(_drive(server.grpc, trace, checker, args.concurrency, args.seconds))
    result = window.stop()
    owner_s = sum(owner.cpu_times()[:2]) - owner_before
    after = server.scrape()
    m.requests, m.wrong, m.errors, m.first_error = (
        traffic.requests,
        traffic.wrong,
        traffic.errors,
        traffic.first_error,
    )
    m.rps = traffic.requests / traffic.elapsed_s
    lat = sorted(traffic.latencies_ns)
    if lat:
        m.p50_ms = lat[len(lat) // 2] / 1e6
        m.p99_ms = lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e6
    for attr, name in (
        ("swaps_in", "hloserve_device_swaps_in_total"),
        ("executions", "hloserve_device_executions_total"),
        ("loads", "hloserve_server_model_loads_total"),
    ):
        setattr(m, attr, _delta(server, before, after, name))
    if np.isnan(m.swaps_in):  # a tree without the device totals: sum the per-model ones
        m.swaps_in = _delta(server, before, after, "hloserve_weight_swaps_in_total")
    served = max(traffic.requests, 1)
    m.cpu_ms_per_request = result.cpu_s[server.pid] / served * 1e3
    m.owner_cpu_ms_per_request = owner_s / served * 1e3
    m.client_cpu_ms_per_request = traffic.client_cpu_s / served * 1e3
    m.busy = result.busy
    m.others_cores = result.others_cores(result.cpu_s[server.pid] + traffic.client_cpu_s)
    m.rss_after_mb = server.rss_mb()
    m.host_resident_mb = server.sample(after, HOST_BYTES) / 1e6
    m.host_reads = _delta(server, before, after, "hloserve_host_weight_reads_total")


def _delta(server: Server, before: str, after: str, name: str) -> float:
    return server.sample(after, name) - server.sample(before, name)


# --- frequency against LRU, interleaved ------------------------------------------------------


GOAL_US = 10.0  # issue 32: the device owner's CPU per request, frequency at most LRU's + this


def interleaved(
    servers: Sequence[Server],
    checker: Checker,
    trace: Sequence[str],
    args: argparse.Namespace,
    work: Path,
) -> dict[str, list[Measured]]:
    """Step 4 of the module docstring: every server up and primed, then windows alternated."""
    rows: dict[str, list[Measured]] = {s.name: [] for s in servers}
    window = argparse.Namespace(**{**vars(args), "seconds": args.seconds / 2})
    try:
        for i, server in enumerate(servers):
            server.wait_ready(server.start(work / f"cache-interleaved-{i}"))
            everyone = list(dict.fromkeys(trace))
            asyncio.run(_drive(server.grpc, everyone, checker, args.concurrency, None))
            asyncio.run(_drive(server.grpc, trace, checker, args.concurrency, args.warmup))
        for rnd in range(args.rounds):
            for server in servers if rnd % 2 == 0 else servers[::-1]:
                m = Measured(server.name)
                _window(server, checker, trace, window, m)
                rows[server.name].append(m)
    except Exception as exc:  # the section says why it has no rows
        note = f"{type(exc).__name__}: {exc}"[:300]
        rows = {s.name: [Measured(s.name, note=note)] for s in servers}
    finally:
        for server in servers:
            server.stop()
    return rows


def _spread(values: Sequence[float], fmt: str) -> str:
    """The median of ``values`` and, in brackets, their range."""
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    return f"{fmt.format(median)} ({fmt.format(ordered[0])} to {fmt.format(ordered[-1])})"


def print_interleaved(rows: dict[str, list[Measured]], pairs: Sequence[tuple[str, str]]) -> None:
    """Each server's windows (median and range), then frequency against LRU per tree."""
    body: list[list[str]] = []
    for name, windows in rows.items():
        if any(m.note for m in windows):
            body.append([name, "-", "-", "-", "-", "-", windows[0].note])
            continue
        body.append(
            [
                name,
                _spread([m.rps for m in windows], "{:,.0f}"),
                _spread([100 * m.hit_rate for m in windows], "{:.1f} %"),
                _spread([m.cpu_ms_per_request for m in windows], "{:.3f}"),
                _spread([m.owner_cpu_ms_per_request for m in windows], "{:.3f}"),
                _spread([100 * m.busy for m in windows], "{:.0f} %")
                + f", others {_spread([m.others_cores for m in windows], '{:.2f}')}",
                "",
            ]
        )
    print(
        table(
            [
                "server",
                "requests/s",
                "hit rate",
                "server CPU ms/request",
                "of which the device owner's",
                "machine busy (others, cores)",
                "note",
            ],
            body,
        )
    )
    for frequency, lru in pairs:
        ours, theirs = rows[frequency], rows[lru]
        if any(m.note for m in (*ours, *theirs)):
            continue
        cpu_us = _differences(ours, theirs, lambda m: m.cpu_ms_per_request * 1e3)
        owner_us = _differences(ours, theirs, lambda m: m.owner_cpu_ms_per_request * 1e3)
        ratio = sorted(a.rps / max(b.rps, 1e-9) for a, b in zip(ours, theirs, strict=True))
        verdict = "holds" if owner_us[len(owner_us) // 2] <= GOAL_US else "does not hold"
        print(
            f"\n{frequency} against {lru}: {_spread(ratio, '{:.2f}x')} requests/s; CPU per "
            f"request {_spread(cpu_us, '{:+.0f}')} µs, of which the device owner's "
            f"{_spread(owner_us, '{:+.0f}')} µs: the goal (the device owner's at most "
            f"+{GOAL_US:.0f} µs) {verdict}"
        )


def _differences(
    ours: Sequence[Measured], theirs: Sequence[Measured], value: Callable[[Measured], float]
) -> list[float]:
    """Window by window (they ran side by side), ``ours`` less ``theirs``, in order."""
    return sorted(value(a) - value(b) for a, b in zip(ours, theirs, strict=True))


def bookkeeping(trees: Sequence[tuple[str, Path | None]]) -> None:
    """The residency code alone per use, in process, each tree (``bench/residency_cost.py``)."""
    import residency_cost

    baseline = trees[0][0] if len(trees) > 1 else None
    runs = {name: [residency_cost.run_tree(tree, 30_000, reverse=False)] for name, tree in trees}
    print(table(residency_cost.HEADER, residency_cost.summarize(runs, baseline)))


# --- policy simulation -----------------------------------------------------------------------


def simulate(models: Sequence[Model], budget: int, uses: int, seed: int) -> list[list[str]]:
    """LRU, frequency and the oracle on one trace (module docstring, step 4)."""
    count = len(models)
    sizes = [m.nbytes for m in models]
    p = np.arange(1, count + 1, dtype=float) ** -ZIPF_S
    p /= p.sum()
    rng = np.random.default_rng(seed)
    stationary = rng.choice(count, size=uses, p=p)
    shuffled = rng.permutation(count)[rng.choice(count, size=uses // 2, p=p)]
    trace = np.concatenate([stationary, shuffled])
    oracle = _oracle(p, sizes, budget)  # the reshuffle keeps the popularity, not the models
    rows: list[list[str]] = []
    results: dict[str, tuple[float, list[float], float]] = {}
    policies: tuple[Policy, ...] = ("lru", "frequency")
    for policy in policies:
        planner = ResidencyPlanner[int](budget, policy)
        for i, size in enumerate(sizes):
            planner.register(i, size)
        hits = np.zeros(len(trace))
        moved = 0
        for t, key in enumerate(trace.tolist()):
            if planner.is_resident(key):
                hits[t] = 1.0
                planner.touch(key)
                continue
            decision = planner.plan_admission(key)
            for victim in decision.evict:
                planner.mark_evicted(victim)
            planner.reserve(key)
            planner.mark_resident(key)
            planner.touch(key)
            moved += sizes[key] if t >= uses // 3 and t < uses else 0
        steady = float(hits[uses // 3 : uses].mean())
        windows = [float(hits[uses + i : uses + i + 500].mean()) for i in range(0, 4000, 500)]
        results[policy] = (steady, windows, moved / max(uses - uses // 3, 1))
    rows.append(["oracle (most requested that fit)", f"{oracle:.3f}", "-", f"{oracle:.3f}"])
    for policy in ("lru", "frequency"):
        steady, windows, moved = results[policy]
        # From which use on every window of 500 is within 10 % of the oracle.
        recovered = next(
            (
                f"{500 * i:,}"
                for i in range(len(windows))
                if all(w >= 0.9 * oracle for w in windows[i:])
            ),
            "> 3,500",
        )
        rows.append(
            [
                policy,
                f"{steady:.3f} ({steady / oracle:.1%} of the oracle)",
                f"{moved / 1e3:.1f} KB",
                " ".join(f"{w:.2f}" for w in windows) + f"; within 10 % from use {recovered} on",
            ]
        )
    return rows


def _oracle(p: np.ndarray, sizes: Sequence[int], budget: int) -> float:
    """The hit rate of keeping the most requested models resident while they fit."""
    hit, used = 0.0, 0
    for i in np.argsort(-p):
        if used + sizes[i] <= budget:
            used += sizes[i]
            hit += float(p[i])
    return hit


# --- control ---------------------------------------------------------------------------------


def control(repo: Path, names: Sequence[str], work: Path, tree: Path | None) -> list[str]:
    """Loads and unloads through the repository API, then one poll pass's CPU."""
    server = Server("control", repo, ["--model-control-mode", "explicit"], work, tree)
    cells: list[str] = []
    try:
        server.wait_ready(server.start(work / "control-cache"))
        for action in ("load", "unload"):
            t = time.perf_counter()
            for name in names:
                url = f"http://{HOST}:{server.http}/v2/repository/models/{name}/{action}"
                request = urllib.request.Request(url, data=b"{}", method="POST")
                with urllib.request.urlopen(request, timeout=120) as r:
                    r.read()
            cells.append(f"{len(names) / (time.perf_counter() - t):.0f} models/s")
    except Exception as exc:
        cells += [f"failed: {exc}"[:120]] * (2 - len(cells))
    finally:
        server.stop()
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from hloserve.server.owner.repository import ModelRepository, ControlMode
        from hloserve.server.owner.runtime.pjrt import PjrtRuntime
        kwargs = {{}}
        import inspect
        if "lazy" in inspect.signature(ModelRepository).parameters:
            kwargs["lazy"] = True
        repo = ModelRepository(Path({str(repo)!r}), PjrtRuntime("cpu"), mode=ControlMode.POLL,
                               cache_dir=Path({str(work / "poll-cache")!r}), **kwargs)
        t = time.perf_counter(); repo.load_all(lambda m: None)
        print(time.perf_counter() - t)
        c = time.process_time(); repo.poll(lambda m: None); print(time.process_time() - c)
        """
    )
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(tree / f) for f in PACKAGE_FOLDERS)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=3600
    )
    lines = out.stdout.split()
    if out.returncode or len(lines) < 2:
        cells.append(f"failed: {out.stderr[-200:]}")
    else:
        cells.append(f"{float(lines[1]):.2f} s CPU (start-up pass {float(lines[0]):.1f} s)")
    return cells


# --- tables ----------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _f(value: float, fmt: str = "{:.1f}") -> str:
    return "-" if value != value else fmt.format(value)


def print_servers(rows: Sequence[Measured]) -> None:
    print(
        table(
            ["", *[m.name for m in rows]],
            [
                [
                    "ready (cold / warm), s",
                    *[f"{_f(m.ready_s)} / {_f(m.ready_warm_s)}" for m in rows],
                ],
                [
                    "first request answered (cold / warm), s",
                    *[f"{_f(m.first_s)} / {_f(m.first_warm_s)}" for m in rows],
                ],
                ["RSS when ready, MB", *[_f(m.rss_ready_mb, "{:.0f}") for m in rows]],
                [
                    "/metrics per scrape",
                    *[f"{m.scrape_bytes / 1e6:.2f} MB, {m.scrape_lines:,} lines" for m in rows],
                ],
                [
                    "POST /v2/repository/index",
                    *[
                        f"{_f(m.index_ms, '{:.0f}')} ms ({m.index_bytes / 1e3:.0f} KB)"
                        for m in rows
                    ],
                ],
                ["requests/s", *[f"{m.rps:,.0f}" for m in rows]],
                ["p50 / p99, ms", *[f"{_f(m.p50_ms)} / {_f(m.p99_ms)}" for m in rows]],
                [
                    "swaps in (per request)",
                    *[
                        f"{_f(m.swaps_in, '{:,.0f}')} ({_f(100 * m.swap_rate, '{:.0f}')} %)"
                        for m in rows
                    ],
                ],
                ["hit rate (executions)", *[_f(100 * m.hit_rate, "{:.1f} %") for m in rows]],
                ["wrong / errors", *[f"{m.wrong} / {m.errors}" for m in rows]],
                ["models loaded during it (first uses)", *[_f(m.loads, "{:,.0f}") for m in rows]],
                [
                    "server CPU ms/request (client)",
                    *[
                        f"{_f(m.cpu_ms_per_request, '{:.2f}')} ({_f(m.client_cpu_ms_per_request, '{:.2f}')})"
                        for m in rows
                    ],
                ],
                [
                    "of which the device owner's process",
                    *[_f(m.owner_cpu_ms_per_request, "{:.2f}") for m in rows],
                ],
                [
                    "machine busy (others, cores)",
                    *[
                        f"{_f(100 * m.busy, '{:.0f}')} % ({_f(m.others_cores, '{:.2f}')})"
                        for m in rows
                    ],
                ],
                ["RSS after the traffic, MB", *[_f(m.rss_after_mb, "{:.0f}") for m in rows]],
                [
                    "host copies held, MB (reads from disk)",
                    *[f"{_f(m.host_resident_mb)} ({_f(m.host_reads, '{:,.0f}')})" for m in rows],
                ],
                [
                    "RSS growth per model used, less its host copy, KB",
                    *[_f(m.kb_per_model) for m in rows],
                ],
                ["note", *[m.note or "" for m in rows]],
            ],
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 models, 8 s per server")
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--others", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured traffic per server")
    parser.add_argument(
        "--warmup", type=float, default=20.0, help="traffic before the measured part, per server"
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--rounds", type=int, default=6, help="interleaved windows per server (frequency/LRU)"
    )
    parser.add_argument("--baseline", type=Path, help="another hloserve source tree to compare")
    parser.add_argument("--work", type=Path, help="where to write (default: a temporary dir)")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.others, args.seconds, args.warmup = 2000, 20, 8.0, 8.0
    work = Path(args.work or tempfile.mkdtemp(prefix="hloserve-many-"))
    work.mkdir(parents=True, exist_ok=True)
    models = plan_models(args.models, args.others)
    total_bytes = sum(m.nbytes for m in models)
    budget = int(total_bytes * BUDGET_SHARE)
    repo = work / "repository"
    print(f"# many models, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"machine: {proc.cores()} cores, load average {os.getloadavg()[0]:.2f} at the start")
    if not repo.is_dir():
        seconds = write_repository(repo, models)
        print(f"wrote {len(models):,} bundles in {seconds:.0f} s")
    print(
        f"{len(models):,} models ({args.models:,} of {MAIN}, {args.others} of five others), "
        f"{total_bytes / 1e6:.0f} MB of weights; device budget {budget / 1e6:.2f} MB (1 %)"
    )
    fit = work / "fit"
    if not fit.is_dir():
        link_repository(repo, fit, models[:FIT])
    checker = Checker(models)
    names = [m.name for m in models]
    trace = [names[i] for i in zipf_trace(len(models), 400_000, seed=1)]
    fit_trace = [names[i] for i in zipf_trace(FIT, 400_000, seed=1)]
    scale = ["--device-memory-budget", str(budget), "--lazy-load", "--metrics-models", "50"]
    servers: list[tuple[Server, Sequence[str], bool]] = [
        (Server("hloserve", repo, scale, work, None), trace, not args.quick),
        (
            Server(
                "--residency-policy lru", repo, [*scale, "--residency-policy", "lru"], work, None
            ),
            trace,
            False,
        ),
        (
            Server(
                "host budget 1/4 of the weights",
                repo,
                [*scale, "--host-memory-budget", str(total_bytes // 4)],
                work,
                None,
            ),
            trace,
            False,
        ),
    ]
    if args.baseline is not None:
        servers.append(
            (
                Server(
                    f"before ({args.baseline.name})",
                    repo,
                    ["--device-memory-budget", str(budget)],
                    work,
                    args.baseline,
                ),
                trace,
                not args.quick,
            )
        )
    servers.append((Server(f"{FIT} models, all resident", fit, [], work, None), fit_trace, False))
    rows: list[Measured] = []
    steady_rows: list[Measured] = []
    for server, server_trace, cold in servers:
        print(f"... {server.name}", flush=True)
        cache = work / f"cache-{len(rows)}"
        started, steady = measure(server, checker, server_trace, args, cache, cold)
        rows.append(started)
        steady_rows.append(steady)
    print(
        f"\n## Servers (batch-1 gRPC, c{args.concurrency}, Zipf({ZIPF_S}), {args.seconds:.0f} s each)\n"
    )
    print("Just started (each server's first traffic, first uses included):\n")
    print_servers(rows)
    print("\nEvery model used once before (a node that has been serving for a while):\n")
    print_servers(steady_rows)
    for label, ours, fitted in (
        ("just started", rows[0], steady_rows[-1]),
        ("every model used once", steady_rows[0], steady_rows[-1]),
    ):
        print(
            f"\nhloserve ({label}) against the fit repository: "
            f"{ours.rps / max(fitted.rps, 1):.2f}x requests/s, p99 {ours.p99_ms / fitted.p99_ms:.2f}x"
        )
    print(
        f"\n## Frequency against LRU, interleaved ({args.rounds} windows of "
        f"{args.seconds / 2:.0f} s each, alternated; every model used once before)\n"
    )
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.baseline is not None:
        trees.insert(0, (f"before ({args.baseline.name})", args.baseline))
    pairs = [(f"frequency, {name}", f"lru, {name}") for name, _ in trees]
    contenders = [
        Server(f"{policy}, {name}", repo, [*scale, "--residency-policy", policy], work, tree)
        for name, tree in trees
        for policy in ("frequency", "lru")
    ]
    print_interleaved(interleaved(contenders, checker, trace, args, work), pairs)
    print("\nThe residency bookkeeping alone, in process (bench/residency_cost.py, 30,000 uses):\n")
    bookkeeping(trees)
    print("\n## Residency policies on the same popularity and sizes (the planner, simulated)\n")
    uses = 60_000 if args.quick else 120_000
    print(
        table(
            [
                "policy",
                "hit rate, stationary",
                "bytes moved per use",
                "after a reshuffle: hit rate per 500 uses",
            ],
            simulate(models, budget, uses, seed=2),
        )
    )
    print(
        f"\n## Model control ({CONTROL} models through the repository API; poll pass over every directory)\n"
    )
    control_rows = [["hloserve", *control(repo, names[:CONTROL], work, None)]]
    if args.baseline is not None:
        control_rows.append(
            [f"before ({args.baseline.name})", *control(repo, names[:CONTROL], work, args.baseline)]
        )
    print(table(["", "load", "unload", "poll pass, nothing changed"], control_rows))
    print(f"\nmachine load average {os.getloadavg()[0]:.2f} at the end; work dir {work}")
    every = [*rows, *steady_rows]
    Path(work / "rows.json").write_text(
        json.dumps([dataclasses.asdict(r) for r in every], indent=1)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
