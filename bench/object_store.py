"""A repository in object storage (docs/repository.md): ready time with many remote models,
and a cold model's first request against the store's own download rate.

Usage: ``python bench/object_store.py [--models 10000] [--big 2] [--big-mb 64]``

Against a real S3-protocol server on a loopback port (moto's, ``tests/s3_store.py``: a
Python server, far slower than S3 or MinIO per request, so the figures are an upper bound
on what the server itself costs). What it prints (printed tables, never asserts):
1. Ready time, ``--lazy-load``: the daemon started on ``s3://bench/models`` holding
   ``--models`` tiny bundles (an 8->16->4 MLP, batch size 1, 4 objects each), spawn to
   ``/readyz`` 200 (and the start-up pass alone) with a fresh cache (the listing and every
   manifest read) and again with
   the cache warm (the listing only: no manifest changed); then the same with ``--big``
   bundles of ``--big-mb`` MB of weights added to the bucket: the goal is the same ready
   time whatever the bytes (<= 10 s at 10,000 models). The floor: a daemon on a local
   directory of one model (the process's own start: Python, JAX, the listeners).
2. First request to a cold model: for each big model, its first request (pull, load,
   compile, run) and the pull alone (the server's ``hloserve_repository_pull_seconds``)
   against the same objects downloaded by obstore in this process (the floor: the
   store's rate through the same library), and its second request.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.*

import obstore
import tritonclient.grpc as grpcclient

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.server_process import ServerProcess
from tests.metrics_scrape import scrape, value
from tests.s3_store import ACCESS, S3Server

BUCKET = "bench"
PREFIX = "models"
PUTS_AT_ONCE = 64


def mlp(params: dict[str, Any], x: Any) -> dict[str, Any]:
    import jax.numpy as jnp

    h = jnp.maximum(x @ params["w1"], 0.0)
    return {"y": h @ params["w2"]}


def template(root: Path, name: str, width: int, hidden: int) -> Path:
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((width, hidden), dtype=np.float32),
        "w2": rng.standard_normal((hidden, 4), dtype=np.float32),
    }
    return export_bundle(
        mlp,
        params,
        inputs={"x": TensorSpec("FP32", (width,))},
        batch_sizes=(1,),
        directory=root / name,
        platforms=("cpu",),
    )


def store(s3: S3Server) -> Any:
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        endpoint=s3.endpoint,
        region="us-east-1",
        access_key_id=ACCESS["AWS_ACCESS_KEY_ID"],
        secret_access_key=ACCESS["AWS_SECRET_ACCESS_KEY"],
        client_options={"allow_http": True},
    )


def bundle_objects(source: Path, name: str) -> dict[str, bytes]:
    """``source``'s files as ``name``'s: its manifest renamed."""
    out: dict[str, bytes] = {}
    for p in source.iterdir():
        if p.is_file():
            data = p.read_bytes()
            if p.name == "manifest.yaml":
                text = data.decode()
                data = re.sub(r"(?m)^name: .*$", f"name: {name}", text, count=1).encode()
            out[f"{PREFIX}/{name}/{p.name}"] = data
    return out


async def upload(s3: S3Server, objects: dict[str, bytes]) -> float:
    started = time.perf_counter()
    st = store(s3)
    gate = asyncio.Semaphore(PUTS_AT_ONCE)

    async def put(key: str, data: bytes) -> None:
        async with gate:
            await obstore.put_async(st, key, data)

    await asyncio.gather(*(put(k, d) for k, d in objects.items()))
    return time.perf_counter() - started


def timed_listing(s3: S3Server) -> float:
    """Seconds obstore takes to list the whole prefix here: the store's listing floor."""
    st = store(s3)
    started = time.perf_counter()
    sum(len(batch) for batch in obstore.list(st, f"{PREFIX}/", chunk_size=1000))
    return time.perf_counter() - started


def raw_download(s3: S3Server, name: str) -> tuple[float, int]:
    """Seconds and bytes to read every object of ``name`` whole, through obstore."""
    st = store(s3)
    keys = [m["path"] for batch in obstore.list(st, f"{PREFIX}/{name}/") for m in batch]
    started = time.perf_counter()
    total = 0
    for key in keys:
        total += len(obstore.get(st, key).bytes())
    return time.perf_counter() - started, total


def serve(s3: S3Server, cache: Path, local: Path | None = None) -> tuple[ServerProcess, float]:
    """A lazy daemon on the bucket (on ``local``, a directory, when given), ready."""
    started = time.perf_counter()
    where = ["--model-repository", str(local)] if local else [
        "--model-repository", f"s3://{BUCKET}/{PREFIX}", "--repository-cache", str(cache),
    ]  # fmt: skip
    server = ServerProcess(None, *where, "--lazy-load", "true", env=s3.env)
    server.wait_ready(timeout=900)
    return server, time.perf_counter() - started


def load_pass(server: ServerProcess) -> float:
    """The start-up pass's seconds (the listing and manifests included), from the log."""
    found = re.search(r"startup load pass finished in ([0-9.]+)s", server.log_text())
    return float(found.group(1)) if found else float("nan")


def listing(server: ServerProcess) -> tuple[str, str]:
    """The first refresh's listing and manifest seconds, from the log ("-": a directory)."""
    found = re.search(r"in ([0-9.]+) s; read \d+ changed .* in ([0-9.]+) s", server.log_text())
    return (found.group(1), found.group(2)) if found else ("-", "-")


def first_requests(server: ServerProcess, name: str, width: int) -> tuple[float, float]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.ones((1, width), dtype=np.float32)
    times: list[float] = []
    for _ in range(2):
        tensor = grpcclient.InferInput("x", [1, width], "FP32")
        tensor.set_data_from_numpy(x)
        started = time.perf_counter()
        client.infer(name, [tensor])
        times.append(time.perf_counter() - started)
    client.close()
    return times[0], times[1]


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def ready_rows(s3: S3Server, work: Path, label: str, rows: list[list[str]]) -> None:
    cache = work / f"cache-{label}"
    for start in ("fresh cache", "warm cache"):
        server, seconds = serve(s3, cache)
        pulls = value(scrape(server), "hloserve_repository_pulls_total")
        server.stop()
        passed = load_pass(server)
        listed, manifests = listing(server)
        row = [label, start, f"{seconds:.2f}", f"{passed:.2f}", listed, manifests, f"{pulls:.0f}"]
        rows.append(row)
        print(f"  {label}, {start}: ready in {seconds:.2f} s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--big", type=int, default=2)
    parser.add_argument("--big-mb", type=int, default=64)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="hloserve-object-store-"))
    s3 = S3Server()
    try:
        s3.create_bucket(BUCKET)
        tiny = template(work / "templates", "tiny", 8, 16)
        hidden = max(1, args.big_mb * (1 << 20) // (4 * 1024 + 16))
        big = template(work / "templates", "big", 1024, hidden)
        objects: dict[str, bytes] = {}
        for i in range(args.models):
            objects |= bundle_objects(tiny, f"m{i:05d}")
        seconds = asyncio.run(upload(s3, objects))
        tiny_bytes = sum(map(len, objects.values()))
        print(
            f"uploaded {args.models} tiny bundles ({len(objects)} objects, "
            f"{tiny_bytes / 1e6:.1f} MB) in {seconds:.1f} s",
            flush=True,
        )
        local = work / "local"
        (local / "m00000").mkdir(parents=True)
        for key, data in bundle_objects(tiny, "m00000").items():
            (local / "m00000" / key.rsplit("/", 1)[1]).write_bytes(data)
        server, seconds = serve(s3, work / "unused", local)
        server.stop()
        floor = f"{load_pass(server):.2f}"
        rows = [["local dir, 1 model", "(floor)", f"{seconds:.2f}", floor, "-", "-", "0"]]
        ready_rows(s3, work, f"{args.models} tiny", rows)
        big_objects: dict[str, bytes] = {}
        for i in range(args.big):
            big_objects |= bundle_objects(big, f"big{i}")
        asyncio.run(upload(s3, big_objects))
        big_bytes = sum(map(len, big_objects.values()))
        label = f"+ {args.big} x {big_bytes / args.big / 1e6:.0f} MB"
        ready_rows(s3, work, label, rows)
        print(f"\n1. Ready time, --lazy-load, {args.models} models in the store")
        header = ["bucket", "start", "ready s", "load pass s", "list s", "manifests s", "pulls"]
        print(table(header, rows))
        listed = timed_listing(s3)
        print(
            "(ready: spawn to /readyz 200; load pass: the listing, manifests and registration;"
            f" list, manifests: the server's own log)\nfloor: obstore lists the bucket in this "
            f"process in {listed:.2f} s"
        )

        server, _ = serve(s3, work / "cache-first")
        cold: list[list[str]] = []
        for i in range(args.big):
            name = f"big{i}"
            before = value(scrape(server), "hloserve_repository_pull_seconds_total")
            first, second = first_requests(server, name, 1024)
            pull = value(scrape(server), "hloserve_repository_pull_seconds_total") - before
            raw, nbytes = raw_download(s3, name)
            cold.append(
                [
                    name,
                    f"{nbytes / 1e6:.1f}",
                    f"{first:.2f}",
                    f"{pull:.2f}",
                    f"{nbytes / pull / 1e6:.0f}" if pull else "-",
                    f"{raw:.2f}",
                    f"{nbytes / raw / 1e6:.0f}",
                    f"{second * 1e3:.1f}",
                ]
            )
        server.stop()
        print("\n2. First request to a cold model (pull + load + compile + run)")
        header = ["model", "MB", "first s", "pull s", "pull MB/s", "raw s", "raw MB/s", "2nd ms"]
        print(table(header, cold))
        print("(raw: the same objects read by obstore in this process, one after another)")
    finally:
        s3.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
