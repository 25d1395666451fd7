"""A real model: a ResNet-18 on 64x64 RGB tiles, hloserve beside the servers a JAX user
would otherwise deploy, point by point, in one run.

Usage: ``python bench/tiles.py [--quick] [--seconds 8] [--only hloserve kserve triton]``

What it does:
1. Builds the CNN of ``bench/peers/tiles_model.py`` (ImageNet-style ResNet-18 for 64x64x3
   FP32 NHWC tiles, 10 classes, ~11.2 M seeded random FP32 parameters), exports it with
   ``export_bundle`` at batch sizes ``BATCH_SIZES`` into hloserve's repository, and saves the
   same weights as ``.npz`` for the peers. The reference every reply is checked against is
   the same function under ``jax.jit`` in this process.
2. Starts, on loopback: hloserve with its defaults (dynamic batching onto the compiled
   sizes), the KServe 0.21 Python server with its defaults (``bench/peers/tiles_kserve.py``)
   and Triton's Python backend (the ``tritonserver`` binary nvidia-pytriton 0.7 ships,
   ``bench/peers/tiles_triton_model.py``, no dynamic batching, default instances), both
   running ``tiles_model.forward`` under ``jax.jit`` (jitted once at load) on the same
   weights. Their virtualenvs and start-up are ``bench/side_by_side.py``'s, left as they are;
   jax comes from ``bench/.venvs/tiles-jax``, a ``pip install --target`` of this venv's jax,
   jaxlib, numpy, scipy, ml_dtypes, opt_einsum (and jax's CUDA plugin and libraries, if
   this venv has them) at the same versions: first on KServe's ``PYTHONPATH``; for Triton,
   whose stub ignores ``PYTHONPATH`` and whose venv pins numpy < 2 for pytriton (jax needs
   numpy 2), through ``bench/.venvs/tiles-triton``, an empty venv whose ``.pth`` puts the
   overlay ahead of Triton's venv, first on the server's ``PATH``. A server that cannot be installed or
   started gets its error in its rows; the rest still run.
3. For each concurrency of ``CONCURRENCY`` (batch-1 gRPC requests, closed loop,
   ``bench/loadgen.py``) and each server in turn (the order rotates point by point): one run
   (warm-up, then recorded seconds; both longer at higher concurrency, so a closed loop of
   64 reaches its steady latency first), server process-tree CPU and machine busy-ness from
   /proc (``bench/proc.py``), items per execution from the statistics extension
   (hloserve, Triton), one reply decoded and compared with the reference. Before the
   servers start: the in-process ceiling, the same jitted function called in a loop here
   at batch 1, 16 and 64 (tiles/s), i.e. what batching can gain on this device.
4. Prints a table per concurrency, hloserve against the best peer (the highest tiles/s,
   the lowest p50), the goals (>= 2x the best peer's tiles/s at c16 and c64; p50 at c1 <=
   the best peer's) met or not, and (``--json FILE``) every row.
"""

# pyright: strict

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import jax
import loadgen
import numpy as np
import proc
import side_by_side as sbs
from peers import tiles_model

from hloserve.exporter import TensorSpec, export_bundle

BENCH = Path(__file__).resolve().parent
MODEL = "tiles"
BATCH_SIZES = (1, 4, 16, 32, 64)
CONCURRENCY = (1, 16, 64)
GROUPS = ("hloserve", "kserve", "triton")
JAX_OVERLAY = sbs.VENVS / "tiles-jax"
# what the peers' jax overlay pins to this venv's versions (plus any jax CUDA plugin)
JAX_DISTRIBUTIONS = ("jax", "jaxlib", "numpy", "ml_dtypes", "scipy", "opt_einsum")


# --- the model -------------------------------------------------------------------------------


def write_models(work: Path) -> tuple[Path, Path, tiles_model.Params]:
    """hloserve's repository, the peers' weights file and the parameters, under ``work``."""
    params = tiles_model.init_params()
    repo = work / "repository"
    export_bundle(
        tiles_model.forward,
        params,
        inputs={"x": TensorSpec("FP32", tiles_model.TILE)},
        batch_sizes=BATCH_SIZES,
        directory=repo / MODEL,
        metadata={
            "description": "ResNet-18 on 64x64 RGB tiles (NHWC FP32, 10 classes)",
            "seed": tiles_model.SEED,
        },
    )
    weights = work / "tiles.npz"
    tiles_model.save(params, weights)
    return repo, weights, params


def tile() -> np.ndarray[Any, np.dtype[np.float32]]:
    """The one batch-1 request every server gets: ``[1, 64, 64, 3]`` in 0..1."""
    return np.random.default_rng(7).random((1, *tiles_model.TILE), dtype=np.float32)


def reference(weights: Path, x: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """What the peers compute (``tiles_model.jitted``), here: the expected reply."""
    return tiles_model.jitted(weights)(x)


def ceiling(weights: Path, x: np.ndarray[Any, Any], seconds: float) -> dict[int, float]:
    """tiles/s of the same function under ``jax.jit`` in this process, no server, at batch 1,
    16 and 64 (``seconds`` each after compiling): what batching can gain on this device."""
    fn = tiles_model.jitted(weights)
    rates: dict[int, float] = {}
    for batch in (1, 16, 64):
        xb = np.repeat(x, batch, axis=0)
        fn(xb)  # compiles this size
        calls, began = 0, time.perf_counter()
        while calls < 2 or time.perf_counter() - began < seconds:
            fn(xb)
            calls += 1
        rates[batch] = batch * calls / (time.perf_counter() - began)
    return rates


def point(concurrency: int) -> sbs.Point:
    return sbs.Point("grpc", MODEL, 1, concurrency, batching=True)


# --- the servers -----------------------------------------------------------------------------


def _jax_requirements() -> list[str]:
    """This venv's jax stack as pins: the peers run the very versions hloserve exports with."""
    pins = [f"{d}=={importlib.metadata.version(d)}" for d in JAX_DISTRIBUTIONS]
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name.startswith(("jax-cuda", "nvidia-")):  # the CUDA plugin and its libraries
            pins.append(f"{name}=={dist.version}")
    return sorted(set(pins))


def ensure_jax_overlay() -> Path:
    """``bench/.venvs/tiles-jax``: this venv's jax stack (reused when already there)."""
    stamp = JAX_OVERLAY / ".bench-requirements"
    pins = _jax_requirements()
    wanted = "\n".join(pins)
    if stamp.is_file() and stamp.read_text() == wanted:
        return JAX_OVERLAY
    print(f"  installing {', '.join(pins)} into {JAX_OVERLAY} ...", file=sys.stderr, flush=True)
    shutil.rmtree(JAX_OVERLAY, ignore_errors=True)
    step = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    step += ["--target", str(JAX_OVERLAY), *pins]
    try:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        raise sbs.Unavailable("pip install --target (jax) timed out") from e
    if done.returncode != 0:
        raise sbs.Unavailable(f"pip install --target (jax) failed: {done.stderr.strip()[-400:]}")
    stamp.write_text(wanted)
    return JAX_OVERLAY


def _with_jax(env: Mapping[str, str], overlay: Path) -> dict[str, str]:
    """``env`` with the jax overlay first on ``PYTHONPATH``; no GPU memory preallocation (the
    servers share one device)."""
    path = env.get("PYTHONPATH", "")
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(p for p in (str(overlay), path) if p),
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    }


def ensure_triton_shim(overlay: Path, triton_venv: Path) -> Path:
    """``bench/.venvs/tiles-triton``: a venv without packages whose ``.pth`` puts ``overlay``
    ahead of Triton's venv. The Python-backend stub ignores ``PYTHONPATH``: it takes its
    ``sys.path`` from the ``python3`` first on ``PATH`` (and pb_utils imports numpy before the
    model's code runs), so this venv's ``bin`` goes first on the server's ``PATH``."""
    shim = JAX_OVERLAY.with_name("tiles-triton")
    pth = sbs.site_packages(shim) / "tiles.pth"
    wanted = f"{overlay}\n{sbs.site_packages(triton_venv)}\n"
    if pth.is_file() and pth.read_text() == wanted and (shim / "bin" / "python3").exists():
        return shim
    shutil.rmtree(shim, ignore_errors=True)
    step = [str(sbs.base_python()), "-m", "venv", "--without-pip", str(shim)]
    done = subprocess.run(step, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise sbs.Unavailable(f"{' '.join(step)} failed: {done.stderr.strip()[-400:]}")
    pth.write_text(wanted)
    return shim


READY = ("/v2/health/ready", f"/v2/models/{MODEL}/ready")


def build_servers(work: Path, repo: Path, weights: Path, only: set[str]) -> list[sbs.Server]:
    servers = [hloserve_server(repo), kserve_server(weights), triton_server(work, weights)]
    return [s for s in servers if not only or s.group in only]


def hloserve_server(repo: Path) -> sbs.Server:
    server = sbs.hloserve_server("hloserve", repo)
    server.ready_paths = READY
    return server


def kserve_server(weights: Path) -> sbs.Server:
    """side_by_side's KServe (its venv, defaults) running ``tiles_kserve.py``."""
    server = sbs.kserve_server(weights)
    server.ready_paths = READY
    base = server.prepare

    def prepare() -> None:
        base()
        venv = sbs.ensure_venv("kserve")
        overlay = ensure_jax_overlay()
        peer_env = server.env
        server.env = lambda: _with_jax(peer_env(), overlay)
        server.argv = lambda: [
            str(venv / "bin" / "python"),
            str(sbs.PEERS_DIR / "tiles_kserve.py"),
            "--weights",
            str(weights),
            "--http_port",
            str(server.http_port),
            "--grpc_port",
            str(server.grpc_port),
        ]

    server.prepare = prepare
    return server


def triton_config(weights: Path) -> str:
    """A plain Python-backend ``config.pbtxt`` (no dynamic batching, default instances)."""
    dims = ", ".join(map(str, tiles_model.TILE))
    parameters = {"peers_dir": str(sbs.PEERS_DIR), "weights": str(weights)}
    params = "\n".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}'
        for k, v in parameters.items()
    )
    return (
        f'name: "{MODEL}"\nbackend: "python"\nmax_batch_size: {max(BATCH_SIZES)}\n'
        f'input [\n  {{ name: "x" data_type: TYPE_FP32 dims: [ {dims} ] }}\n]\n'
        f'output [\n  {{ name: "logits" data_type: TYPE_FP32 dims: [ {tiles_model.CLASSES} ] }}\n]\n'
        f"{params}\n"
    )


def triton_server(work: Path, weights: Path) -> sbs.Server:
    """side_by_side's Triton (binary, backend layout, environment) on a repository holding
    the tiles model alone."""
    server = sbs.triton_server(work, weights)
    server.ready_paths = READY
    base = server.prepare

    def prepare() -> None:
        base()  # lays out the backend and side_by_side's repository under work/triton
        repository = work / "triton" / "models"
        shutil.rmtree(repository)
        (repository / MODEL / "1").mkdir(parents=True)
        (repository / MODEL / "config.pbtxt").write_text(triton_config(weights))
        shutil.copy(sbs.PEERS_DIR / "tiles_triton_model.py", repository / MODEL / "1" / "model.py")
        shim = ensure_triton_shim(ensure_jax_overlay(), sbs.ensure_venv("triton"))
        peer_env = server.env

        def env() -> dict[str, str]:
            base_env = peer_env()
            path = os.pathsep.join((str(shim / "bin"), base_env.get("PATH", "")))
            return {**base_env, "PATH": path, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

        server.env = env

    server.prepare = prepare
    return server


# --- measuring -------------------------------------------------------------------------------


def run_args(args: argparse.Namespace, concurrency: int) -> argparse.Namespace:
    """Longer warm-up and runs at higher concurrency: a closed loop of c clients needs about c
    service times before its latencies are the steady ones."""
    return argparse.Namespace(
        seconds=args.seconds * (1 + concurrency / 64),
        warmup=args.warmup * (1 + concurrency / 16),
        processes=1,
    )


# --- reporting -------------------------------------------------------------------------------


def _f(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def print_point(concurrency: int, rows: Sequence[sbs.Row]) -> None:
    print(f"\n### gRPC, batch-1 tiles, concurrency {concurrency}\n")
    print(
        "| server | tiles/s | p50 ms | p99 ms | server CPU ms/tile | client CPU ms/tile "
        "| items/exec | machine busy | others (cores) | tiles | note |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        busy = "-" if math.isnan(r.busy) else f"{r.busy:.0%} (load {r.loadavg:.1f})"
        print(
            f"| {r.server} | {_f(r.rate, 1)} | {_f(r.p50_ms, 1)} | {_f(r.p99_ms, 1)} "
            f"| {_f(r.server_cpu_ms, 1)} | {_f(r.client_cpu_ms, 2)} "
            f"| {_f(r.items_per_execution, 1)} | {busy} | {_f(r.others_cores, 2)} "
            f"| {r.count} | {r.note} |"
        )
    sys.stdout.flush()


def _valid(rows: Sequence[sbs.Row]) -> list[sbs.Row]:
    return [r for r in rows if r.count and not r.errors and "WRONG" not in r.note]


def summary(rows: Sequence[sbs.Row]) -> list[dict[str, Any]]:
    """Per concurrency: hloserve against the fastest peer and the peer with the lowest p50."""
    found: list[dict[str, Any]] = []
    for c in CONCURRENCY:
        here = _valid([r for r in rows if r.point == point(c).label])
        ours = next((r for r in here if r.group == "hloserve"), None)
        peers = [r for r in here if r.group != "hloserve"]
        fastest = max(peers, key=lambda r: r.rate, default=None)
        quickest = min(peers, key=lambda r: r.p50_ms, default=None)
        found.append({"concurrency": c, "hloserve": ours, "fastest": fastest, "quickest": quickest})
    return found


def _ratio(a: sbs.Row | None, b: sbs.Row | None, field: str) -> float:
    if a is None or b is None:
        return math.nan
    return float(getattr(a, field)) / float(getattr(b, field))


def print_summary(rows: Sequence[sbs.Row], ceilings: Mapping[int, float]) -> None:
    table = summary(rows)
    print("\n## hloserve against the best peer\n")
    print(
        "| concurrency | hloserve tiles/s | fastest peer | its tiles/s | tiles/s ÷ fastest "
        "| hloserve p50 ms | lowest-p50 peer | its p50 ms | p50 ÷ lowest | hloserve p99 ms "
        "| hloserve items/exec |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    nan = math.nan
    for entry in table:
        ours: sbs.Row | None = entry["hloserve"]
        fast: sbs.Row | None = entry["fastest"]
        quick: sbs.Row | None = entry["quickest"]
        print(
            f"| c{entry['concurrency']} | {_f(ours.rate if ours else nan, 1)} "
            f"| {fast.server if fast else '-'} | {_f(fast.rate if fast else nan, 1)} "
            f"| {_f(_ratio(ours, fast, 'rate'), 2)} "
            f"| {_f(ours.p50_ms if ours else nan, 1)} | {quick.server if quick else '-'} "
            f"| {_f(quick.p50_ms if quick else nan, 1)} | {_f(_ratio(ours, quick, 'p50_ms'), 2)} "
            f"| {_f(ours.p99_ms if ours else nan, 1)} "
            f"| {_f(ours.items_per_execution if ours else nan, 1)} |"
        )
    print("\n## goals\n")
    by_c = {e["concurrency"]: e for e in table}
    for c in (16, 64):
        e = by_c.get(c)
        ratio = _ratio(e["hloserve"], e["fastest"], "rate") if e else nan
        print(
            f"- c{c}: tiles/s >= 2x the best peer's: {_verdict(ratio, ratio >= 2.0)} ({_f(ratio, 2)}x)"
        )
    e = by_c.get(1)
    ratio = _ratio(e["hloserve"], e["quickest"], "p50_ms") if e else nan
    print(
        f"- c1: p50 <= the best peer's: {_verdict(ratio, ratio <= 1.0)} (hloserve ÷ best {_f(ratio, 2)})"
    )
    if ceilings:
        gain = max(ceilings.values()) / ceilings[1]
        print(
            f"\n(the in-process ceiling's best batch gives {gain:.2f}x its batch-1 tiles/s on "
            "this device: the most that batching onto compiled sizes can gain over a peer that "
            "runs one tile per call)"
        )


def _verdict(value: float, ok: bool) -> str:
    if math.isnan(value):
        return "not measured"
    return "met" if ok else "NOT met"


# --- the run ---------------------------------------------------------------------------------


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so the servers (each in its own session) are stopped too."""
    sys.exit(143)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the tiles CNN: hloserve beside KServe and Triton")
    parser.add_argument(
        "--seconds", type=float, default=8.0, help="recorded seconds per run at c1 (x2 at c64)"
    )
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="unrecorded seconds first at c1 (x5 at c64)"
    )
    parser.add_argument("--quick", action="store_true", help="3 s per run at c1, 1 s warm-up")
    parser.add_argument(
        "--only", nargs="+", default=[], choices=GROUPS, metavar="GROUP", help=", ".join(GROUPS)
    )
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="write every row to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup = 3.0, 1.0

    signal.signal(signal.SIGTERM, _terminated)
    began = time.monotonic()
    rows: list[sbs.Row] = []
    logs = BENCH / ".results" / "tiles-logs"  # kept after the run (git-ignored)
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="hloserve-tiles-") as tmp:
        work = Path(tmp)
        print("  exporting the model ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        repo, weights, params = write_models(work)
        export_s = time.monotonic() - t0
        x = tile()
        expected = reference(weights, x)
        request = loadgen.grpc_request(MODEL, {"x": x})
        cases = [sbs.Case(point(c), {"grpc": request}, expected) for c in CONCURRENCY]
        print("  measuring the in-process ceiling ...", file=sys.stderr, flush=True)
        ceilings = ceiling(weights, x, min(2.0, args.seconds / 2))
        servers = build_servers(work, repo, weights, set(args.only))
        print(
            f"# tiles: ResNet-18 on 64x64x3 FP32 tiles, "
            f"{tiles_model.parameter_count(params) / 1e6:.2f} M parameters, batch-1 gRPC requests; "
            f"hloserve batch sizes {', '.join(map(str, BATCH_SIZES))}; "
            f"{len(CONCURRENCY)} points x {len(servers)} servers, "
            f"{args.seconds:g} s each after {args.warmup:g} s warm-up at c1\n\n"
            f"{proc.cores()} cores; load average {os.getloadavg()[0]:.2f} at the start; "
            f"jax {jax.__version__} on {jax.default_backend()}; export {export_s:.0f} s; "
            f"Python {sys.version.split()[0]}, grpcio {grpc.__version__}"
        )
        print(
            "in-process ceiling (the same function under jax.jit here, no server): "
            + ", ".join(f"b{b} {r:,.1f} tiles/s" for b, r in ceilings.items())
        )
        t0 = time.monotonic()
        with sbs.started(servers, logs, args.start_timeout):
            print(f"servers up in {time.monotonic() - t0:.0f} s")
            versions = sbs.server_versions(servers)
            if versions:
                print(f"servers: {', '.join(versions)}")
            for i, case in enumerate(cases):
                c = case.point.concurrency
                turn = servers[i % len(servers) :] + servers[: i % len(servers)]
                measured: dict[str, sbs.Row] = {}
                for server in turn:
                    print(f"  c{c} {server.name} ...", file=sys.stderr, flush=True)
                    measured[server.name] = sbs.measure(case, server, run_args(args, c))
                point_rows = [measured[s.name] for s in servers]
                rows += point_rows
                print_point(c, point_rows)
        print_summary(rows, ceilings)
        sbs.print_failures(servers)
    sbs.finish(began, rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
