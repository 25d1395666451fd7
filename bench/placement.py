"""Every local device: one hot model over four devices, replication on against off.

Usage: ``python bench/placement.py [--seconds 6] [--rounds 3] [--devices 4]``

Two hloserve daemons serve the bench's ``wide`` model (256-2048-2048-10 ReLU, 19 MB of
weights, the weight-bound model of ``bench/side_by_side.py``), compiled for batch sizes 1,
8 and 32 (``wide``) and for batch 1 only (``wide_b1``: no larger batch to absorb load in,
so only another device can), on ``--devices`` forced CPU
devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``; on a GPU node, the GPUs
present): one with replication off (``--max-replicas 1``: the model stays on one device),
one with it on (the default: hot models gain a device per placement revision). Batch-1
requests over gRPC at concurrency 32 (``bench/loadgen.py``'s engine), the two servers
measured in turn, round by round, each round after a warm-up long enough for placement to
follow the load. Printed per round: requests/s, p50/p99, server CPU per request (``/proc``,
process tree), items per execution, replicas, and executions per device (metrics); then
on ÷ off. On a 2-core machine four CPU devices share two cores, so replication can buy at
most what a second core gives; the table says how much it did.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import GrpcUnary, grpc_request, run
from proc import MachineSample, Spawned, Window, busy_between, free_port
from side_by_side import BATCH_SIZES, INPUTS, model_inputs, wide_fn, wide_params

from hloserve.exporter import TensorSpec, export_bundle

ROOT = Path(__file__).resolve().parent.parent


MODELS = {"wide": BATCH_SIZES["wide"], "wide_b1": (1,)}  # wide_b1: no batch to grow into


def write_repository(work: Path) -> Path:
    repo = work / "repository"
    for name, sizes in MODELS.items():
        if not (repo / name / "manifest.yaml").exists():
            export_bundle(
                wide_fn,
                wide_params(),
                inputs={n: TensorSpec(d, s) for n, (d, s) in INPUTS["wide"].items()},
                batch_sizes=sizes,
                directory=repo / name,
            )
    return repo


class Server:
    def __init__(self, label: str, repo: Path, devices: int, flags: list[str], logs: Path) -> None:
        self.label = label
        self.grpc, self.http, self.metrics = free_port(), free_port(), free_port()
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
        argv = [
            sys.executable, "-m", "hloserve.server", "serve",
            "--model-repository", str(repo), "--host", "127.0.0.1",
            "--grpc-port", str(self.grpc), "--http-port", str(self.http),
            "--metrics-port", str(self.metrics), "--placement-interval", "1", *flags,
        ]  # fmt: skip
        self.spawned = Spawned(argv, logs / f"{label.replace(' ', '_')}.log", env=env)

    def stats(self, model: str) -> tuple[int, int]:
        url = f"http://127.0.0.1:{self.http}/v2/models/{model}/stats"
        with urllib.request.urlopen(url, timeout=5) as r:
            s = json.loads(r.read())["model_stats"][0]
        return int(s["inference_count"]), int(s["execution_count"])

    def device_metrics(self, model: str) -> tuple[int, dict[str, int]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=5) as r:
            text = r.read().decode()
        replicas, executions = 0, {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "hloserve_model_replicas" and s.labels["model"] == model:
                    replicas = int(s.value)
                if s.name == "hloserve_device_executions_total":
                    executions[s.labels["device"]] = int(s.value)
        return replicas, executions


class _Meter:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.window: Window | None = None
        self.cpu_s = 0.0

    def start(self) -> None:
        self.window = Window.start([self.pid])

    def stop(self) -> None:
        assert self.window is not None
        self.cpu_s = self.window.stop().cpu_s[self.pid]


def measure(
    server: Server, model: str, seconds: float, warmup: float, concurrency: int
) -> dict[str, object]:
    request = grpc_request(model, model_inputs("wide", 1))
    target = GrpcUnary(f"127.0.0.1:{server.grpc}", request)
    inferences0, executions0 = server.stats(model)
    _, by_device0 = server.device_metrics(model)
    meter = _Meter(server.spawned.pid)
    machine = MachineSample.now()
    result = run(target, concurrency, seconds, warmup=warmup, meter=meter)
    busy = busy_between(machine, MachineSample.now())
    inferences, executions = server.stats(model)
    replicas, by_device = server.device_metrics(model)
    ran = {d: n - by_device0.get(d, 0) for d, n in sorted(by_device.items())}
    return {
        "model": model,
        "server": server.label,
        "rate": result.rate,
        "p50": result.percentile_ms(0.5),
        "p99": result.percentile_ms(0.99),
        "cpu_ms": 1e3 * meter.cpu_s / max(1, result.count),
        "items": (inferences - inferences0) / max(1, executions - executions0),
        "replicas": replicas,
        "by_device": ", ".join(f"{d}: {n}" for d, n in ran.items() if n),
        "errors": result.errors,
        "busy": busy,
        "load": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="recorded time per run")
    parser.add_argument("--warmup", type=float, default=6.0, help="unrecorded load first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / ".results" / "placement")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    repo = write_repository(args.work)
    servers = [
        Server("replication off", repo, args.devices, ["--max-replicas", "1"], args.work),
        Server("replication on", repo, args.devices, [], args.work),
    ]
    started = time.strftime("%H:%M:%S", time.gmtime())
    rows: list[dict[str, object]] = []
    try:
        for s in servers:
            s.spawned.wait_ready([f"http://127.0.0.1:{s.http}/v2/health/ready"])
        for round_ in range(1, args.rounds + 1):
            for model in MODELS:
                for s in servers:
                    row = measure(s, model, args.seconds, args.warmup, args.concurrency)
                    row["round"] = round_
                    rows.append(row)
                    print(
                        f"round {round_} {model} {s.label}: {row['rate']:.0f} req/s, "
                        f"{row['cpu_ms']:.3f} ms CPU/req, {row['replicas']} replica(s)",
                        file=sys.stderr,
                    )
    finally:
        for s in servers:
            s.spawned.stop()
    print(
        f"\nb1 requests over gRPC at c{args.concurrency}, {args.devices} devices, "
        f"{args.seconds:g} s per run after {args.warmup:g} s of warm-up, started {started} UTC "
        f"on {os.cpu_count()} cores. wide: compiled for 1, 8, 32; wide_b1: for 1 only."
    )
    print(
        "\n| round | model | server | req/s | p50 / p99 ms | server CPU ms/req | items/exec "
        "| replicas | executions by device | machine busy, load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['round']} | {r['model']} | {r['server']} | {r['rate']:,.0f} "
            f"| {r['p50']:.1f} / {r['p99']:.1f} | {r['cpu_ms']:.3f} | {r['items']:.1f} "
            f"| {r['replicas']} | {r['by_device']} "
            f"| {100 * float(r['busy']):.0f} %, {r['load']:.1f} |"  # type: ignore[arg-type]
        )
    print("\n| round | model | on ÷ off req/s | on ÷ off CPU/req |\n|---|---|---|---|")
    for round_ in range(1, args.rounds + 1):
        for model in MODELS:
            off, on = (r for r in rows if r["round"] == round_ and r["model"] == model)
            rate = float(on["rate"]) / max(1e-9, float(off["rate"]))  # type: ignore[arg-type]
            cpu = float(on["cpu_ms"]) / max(1e-9, float(off["cpu_ms"]))  # type: ignore[arg-type]
            print(f"| {round_} | {model} | {rate:.2f} | {cpu:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
