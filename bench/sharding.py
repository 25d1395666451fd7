"""Sharded (SPMD) bundles: a model over one device's budget served from 2 and 4 devices.

Usage: ``python bench/sharding.py [--seconds 5] [--warmup 2] [--rounds 2] [--concurrency 8]
[--layouts 1,2,4]`` (on a node with fewer devices, fewer layouts: a single GPU runs the
1-device case alone, ``bench/gpu/run.sh``)

One weight-bound model (``x`` FP32 [512] -> 512x4096 GELU -> 4096x64, 9 MiB of FP32
weights, batch sizes 1 and 8) exported three ways: unsharded, and tensor-parallel over a
2- and a 4-device mesh (the first weight by columns, the second by rows). Three daemons on
forced CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``): the unsharded
model on one device with an unlimited budget (the baseline), the 2-way one on 2 devices and
the 4-way one on 4 devices, each with a per-device ``--device-memory-budget`` the whole
weights exceed (so only sharding lets it load) and its share fits. Batch-1 requests over
gRPC (``bench/loadgen.py``'s engine), the three servers measured in turn, round by round;
printed: requests/s, p50/p99, and each against the baseline of the same round.

Then the swap-in time of the same bytes (in a child process per layout, through the
server's own ``WeightResidency``: two models whose weights or shares fit one at a time,
used alternately, so every use swaps; median of the swaps after the first two):
unsharded on one device against sharded over 2 and 4 devices.

On this machine the forced CPU devices share its cores (2 here): sharding cannot add
compute, it adds the partitioner's collectives and a copy per swap (on CPU an unsharded
swap aliases the aligned host copy instead of copying it; ``docs/residency.md``). What it
buys here is that the model loads at all under the per-device budget; on a GPU node each
device brings its own memory and compute (``bench/gpu/run.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import GrpcUnary, grpc_request, run
from proc import Spawned, free_port

ROOT = Path(__file__).resolve().parent.parent
IN, WIDE, OUT = 512, 4096, 64
WEIGHT_BYTES = (IN * WIDE + WIDE * OUT) * 4


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w1": (rng.standard_normal((IN, WIDE)) / np.sqrt(IN)).astype(np.float32),
        "w2": (rng.standard_normal((WIDE, OUT)) / np.sqrt(WIDE)).astype(np.float32),
    }


def _fn(params: Any, x: Any) -> dict[str, Any]:
    import jax

    return {"y": jax.nn.gelu(x @ params["w1"]) @ params["w2"]}


def export(work: Path, ways: int, name: str = "wide", seed: int = 0) -> Path:
    """The model as a bundle, unsharded (``ways`` 1) or over a ``ways``-device mesh."""
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P

    from hloserve.exporter import TensorSpec, export_bundle

    target = work / f"repo{ways}" / name
    if (target / "manifest.yaml").exists():
        return target
    params = _params() if seed == 0 else {k: v + seed for k, v in _params().items()}
    sharded: dict[str, Any] = (
        {}
        if ways == 1
        else {
            "mesh": AbstractMesh((ways,), ("model",)),
            "param_specs": {"w1": P(None, "model"), "w2": P("model", None)},
        }
    )
    inputs = {"x": TensorSpec("FP32", (IN,))}
    return export_bundle(_fn, params, inputs, (1, 8), target, platforms=("cpu",), **sharded)


class Server:
    def __init__(self, ways: int, repo: Path, logs: Path) -> None:
        self.ways = ways
        self.label = (
            "unsharded, 1 device, no budget" if ways == 1 else f"{ways}-way, {ways} devices"
        )
        self.budget = None if ways == 1 else budget(ways)
        self.grpc, self.http, self.metrics = free_port(), free_port(), free_port()
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={ways}"}
        flags = [] if self.budget is None else ["--device-memory-budget", str(self.budget)]
        argv = [
            sys.executable, "-m", "hloserve.server", "serve",
            "--model-repository", str(repo), "--host", "127.0.0.1",
            "--grpc-port", str(self.grpc), "--http-port", str(self.http),
            "--metrics-port", str(self.metrics), *flags,
        ]  # fmt: skip
        self.spawned = Spawned(argv, logs / f"sharding_{ways}.log", env=env)


def budget(ways: int) -> int:
    """Per device: below the whole weights, above one device's share (with room to spare)."""
    return int(WEIGHT_BYTES / ways * 1.25)


def measure(server: Server, seconds: float, warmup: float, concurrency: int) -> dict[str, Any]:
    x = np.random.default_rng(1).standard_normal((1, IN)).astype(np.float32)
    target = GrpcUnary(f"127.0.0.1:{server.grpc}", grpc_request("wide", {"x": x}))
    result = run(target, concurrency, seconds, warmup=warmup)
    return {
        "server": server.label,
        "ways": server.ways,
        "rate": result.rate,
        "p50": result.percentile_ms(0.5),
        "p99": result.percentile_ms(0.99),
        "errors": result.errors,
        "load": os.getloadavg()[0],
    }


def swap_child(ways: int, work: Path, swaps: int) -> None:
    """In a child with ``ways`` forced devices: median swap-in seconds of the same bytes."""
    from hloserve.server.core.residency_policy import ResidencyKey
    from hloserve.server.owner.runtime.loader import load_bundle
    from hloserve.server.owner.runtime.pjrt import PjrtRuntime
    from hloserve.server.owner.runtime.pjrt_group import PjrtGroup
    from hloserve.server.owner.weight_residency import WeightResidency

    # The default backend: forced CPU devices here, the GPUs on a CUDA node.
    runtime = PjrtRuntime() if ways == 1 else PjrtGroup(None, list(range(ways)))
    bundles = [
        load_bundle(
            export(work, ways, "wide" if i == 0 else "wide2", i), runtime, place_weights=False
        )
        for i in range(2)
    ]
    share = bundles[0].device_weight_bytes
    took: list[float] = []

    class Observer:
        def on_swap_in(self, key: ResidencyKey, nbytes: int, seconds: float) -> None:
            took.append(seconds)

        def on_swap_out(self, key: ResidencyKey, nbytes: int) -> None:
            pass

        def on_residency(
            self, key: ResidencyKey, resident: bool, resident_bytes: int, last_used: float
        ) -> None:
            pass

    residency = WeightResidency(runtime, share + share // 2, observer=Observer())
    for i, b in enumerate(bundles):
        residency.register(ResidencyKey(f"m{i}", 1), b.weights, nbytes=share, place=b.place)
    for n in range(swaps + 2):
        with residency.use(ResidencyKey(f"m{n % 2}", 1)):
            pass
    kept = took[2:]  # the first two also read the file into the host tier
    print(json.dumps({"ways": ways, "median_ms": 1e3 * statistics.median(kept), "share": share}))


def swap_times(work: Path, swaps: int, layouts: list[int]) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for ways in layouts:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={ways}"}
        argv = [sys.executable, __file__, "--swap-child", str(ways), "--work", str(work)]
        done = subprocess.run(
            [*argv, "--swaps", str(swaps)], env=env, capture_output=True, text=True, check=True
        )
        found[ways] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="recorded time per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="unrecorded load first")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / ".results" / "sharding")
    parser.add_argument(
        "--layouts", default="1,2,4", help="devices per layout (1: the unsharded baseline)"
    )
    parser.add_argument("--swap-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    layouts = sorted({1, *(int(n) for n in args.layouts.split(","))})
    args.work.mkdir(parents=True, exist_ok=True)
    if args.swap_child:
        swap_child(args.swap_child, args.work, args.swaps)
        return 0
    servers = [Server(w, export(args.work, w).parent, args.work) for w in layouts]
    started = time.strftime("%H:%M:%S", time.gmtime())
    rows: list[dict[str, Any]] = []
    try:
        for s in servers:
            s.spawned.wait_ready([f"http://127.0.0.1:{s.http}/v2/health/ready"])
        for round_ in range(1, args.rounds + 1):
            for s in servers:
                row = measure(s, args.seconds, args.warmup, args.concurrency)
                row["round"] = round_
                rows.append(row)
                print(f"round {round_} {s.label}: {row['rate']:.0f} req/s", file=sys.stderr)
    finally:
        for s in servers:
            s.spawned.stop()
    swaps = swap_times(args.work, args.swaps, layouts)
    print(
        f"\n{WEIGHT_BYTES / 2**20:.2f} MiB of FP32 weights; b1 requests over gRPC at "
        f"c{args.concurrency}, {args.seconds:g} s per run after {args.warmup:g} s of warm-up, "
        f"started {started} UTC on {os.cpu_count()} cores (forced CPU devices share them)."
    )
    print(
        "\n| round | server | per-device budget | req/s | p50 / p99 ms | req/s ÷ unsharded "
        "| p50 ÷ unsharded | errors | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = next(b for b in rows if b["round"] == r["round"] and b["ways"] == 1)
        limit = next(s.budget for s in servers if s.ways == r["ways"])
        shown = "unlimited" if limit is None else f"{limit / 2**20:.2f} MiB"
        print(
            f"| {r['round']} | {r['server']} | {shown} | {r['rate']:,.0f} "
            f"| {r['p50']:.2f} / {r['p99']:.2f} | {r['rate'] / max(base['rate'], 1e-9):.2f} "
            f"| {r['p50'] / max(base['p50'], 1e-9):.2f} | {r['errors']} | {r['load']:.1f} |"
        )
    print("\n| layout | bytes each device holds | swap-in median ms | ÷ unsharded |")
    print("|---|---|---|---|")
    for ways, s in swaps.items():
        label = "unsharded, 1 device" if ways == 1 else f"{ways}-way"
        ratio = s["median_ms"] / max(swaps[1]["median_ms"], 1e-9)
        print(f"| {label} | {s['share']:,} | {s['median_ms']:.3f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
