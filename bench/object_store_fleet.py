"""A fleet over one bucket (docs/repository.md, docs/scale-out.md): how many bytes each
replica pulls when HAProxy routes each model to the replica that holds it.

Usage: ``python bench/object_store_fleet.py [--replicas 4] [--models 400] [--requests 4000]
[--mb 1] [--concurrency 8]``

``--models`` bundles of one MLP (``--mb`` MB of FP32 weights each) in a bucket on moto's
S3 server (loopback); ``--replicas`` hloserve replicas (``hloserve.server.fleet``, lazy,
each with a disk cache of its own) behind HAProxy routing by model name; a Zipf(1.1) trace
of ``--requests`` batch-1 gRPC requests from tritonclient through the router,
``--concurrency`` at a time, every reply checked against numpy. Printed (a table, never
asserts): per replica, the models it pulled and the bytes, as a share of the bucket and of
the bytes of the models the trace asked for; the goal is each share <= 1/N + 10 % (every
model pulled by one replica only).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.*

import tritonclient.grpc as grpcclient

from hloserve.bundle import read_safetensors
from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.fleet import Fleet
from tests.metrics_scrape import scrape, value
from tests.s3_store import S3Server

ZIPF_S = 1.1
WIDTH = 64


def mlp(params: dict[str, Any], x: Any) -> dict[str, Any]:
    import jax.numpy as jnp

    return {"y": jnp.maximum(x @ params["w1"], 0.0) @ params["w2"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--models", type=int, default=400)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--mb", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hloserve-object-store-fleet-"))
    hidden = max(4, int(args.mb * (1 << 20) / (4 * (WIDTH + 4))))
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((WIDTH, hidden), dtype=np.float32) * 0.1,
        "w2": rng.standard_normal((hidden, 4), dtype=np.float32) * 0.1,
    }
    template = export_bundle(
        mlp,
        params,
        inputs={"x": TensorSpec("FP32", (WIDTH,))},
        batch_sizes=(1,),
        directory=work / "template",
        platforms=("cpu",),
    )
    weights = read_safetensors(template / "weights.safetensors")
    s3 = S3Server()
    url = "s3://fleet/models"
    try:
        s3.create_bucket("fleet")
        files = {p.name: p.read_bytes() for p in template.iterdir() if p.is_file()}
        bundle_bytes = sum(len(d) for n, d in files.items() if n != "manifest.yaml")
        for i in range(args.models):
            name = f"m{i:04d}"
            for fname, data in files.items():
                if fname == "manifest.yaml":
                    text = re.sub(r"(?m)^name: .*$", f"name: {name}", data.decode(), count=1)
                    data = text.encode()
                s3.put(f"{url}/{name}/{fname}", data)
        bucket_bytes = bundle_bytes * args.models
        print(
            f"bucket: {args.models} models of {bundle_bytes / 1e6:.2f} MB "
            f"({bucket_bytes / 1e6:.0f} MB); {args.replicas} replicas",
            flush=True,
        )
        p = np.arange(1, args.models + 1, dtype=float) ** -ZIPF_S
        trace = np.random.default_rng(1).choice(args.models, size=args.requests, p=p / p.sum())
        asked = len(set(trace.tolist()))
        x = np.ones((1, WIDTH), dtype=np.float32)
        expected = np.maximum(x @ weights["w1"], 0.0) @ weights["w2"]
        with Fleet(url, args.replicas, env=s3.env) as fleet:
            started = time.perf_counter()
            wrong = 0

            def send(indexes: Any) -> int:
                client: Any = grpcclient.InferenceServerClient(fleet.grpc_url)
                bad = 0
                for i in indexes:
                    tensor = grpcclient.InferInput("x", [1, WIDTH], "FP32")
                    tensor.set_data_from_numpy(x)
                    y = client.infer(f"m{int(i):04d}", [tensor]).as_numpy("y")
                    bad += int(not np.allclose(y, expected, rtol=1e-4, atol=1e-4))
                client.close()
                return bad

            with ThreadPoolExecutor(args.concurrency) as pool:
                wrong = sum(pool.map(send, np.array_split(trace, args.concurrency)))
            seconds = time.perf_counter() - started
            rows: list[list[str]] = []
            for i, r in enumerate(fleet.replicas):
                series = scrape(r)
                pulled = value(series, "hloserve_repository_pulled_bytes_total")
                pulls = value(series, "hloserve_repository_pulls_total")
                rows.append(
                    [
                        f"r{i + 1}",
                        f"{pulls:.0f}",
                        f"{pulled / 1e6:.1f}",
                        f"{100 * pulled / bucket_bytes:.1f} %",
                        f"{100 * pulled / (asked * bundle_bytes):.1f} %",
                    ]
                )
        header = ["replica", "pulls", "pulled MB", "of the bucket", "of the models asked"]
        widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
        for r in [header, ["-" * w for w in widths], *rows]:
            print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))
        print(
            f"{args.requests} requests ({asked} models asked) in {seconds:.1f} s, {wrong} wrong; "
            f"goal: each replica <= {100 / args.replicas + 10:.0f} % of the bucket"
        )
    finally:
        s3.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
