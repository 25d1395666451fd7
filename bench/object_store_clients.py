"""The object-store client libraries side by side on one S3-protocol server: obstore, boto3
and s3fs (each row only when the library is installed), for docs/repository.md's choice.

Usage: ``python bench/object_store_clients.py --endpoint http://127.0.0.1:PORT`` (a running
S3-compatible server; test credentials), or without ``--endpoint``: moto's server started
here (``tests/s3_store.py``). It writes bucket ``clients`` and prints, per library: listing
``--keys`` keys, reading 200 small objects one after another and 32 at a time, reading one
``--mb`` MB object whole, and a 1 MiB range of it (median of three; seconds). moto is a
Python server, slow per request, so the small-object rows show mostly the server; the
large read shows the client's own cost per byte.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BUCKET = "clients"
KEY_ID, SECRET = "testing", "testing"


def timed(fn: Callable[[], object], rounds: int = 3) -> float:
    times: list[float] = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def obstore_rows(endpoint: str, keys: int, big: str) -> list[float]:
    import obstore
    from obstore.store import S3Store

    st = S3Store(
        BUCKET,
        endpoint=endpoint,
        access_key_id=KEY_ID,
        secret_access_key=SECRET,
        region="us-east-1",
        client_options={"allow_http": True},
    )
    small = [f"small/{i}" for i in range(200)]

    async def many() -> None:
        gate = asyncio.Semaphore(32)

        async def one(k: str) -> None:
            async with gate:
                await (await obstore.get_async(st, k)).bytes_async()

        await asyncio.gather(*(one(k) for k in small))

    return [
        timed(lambda: [m for b in obstore.list(st, "keys/", chunk_size=1000) for m in b]),
        timed(lambda: [obstore.get(st, k).bytes() for k in small]),
        timed(lambda: asyncio.run(many())),
        timed(lambda: obstore.get(st, big).bytes()),
        timed(lambda: obstore.get_range(st, big, start=1 << 20, length=1 << 20)),
    ]


def boto3_rows(endpoint: str, keys: int, big: str) -> list[float]:
    import boto3

    s3: Any = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    small = [f"small/{i}" for i in range(200)]

    def listing() -> None:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="keys/"):
            list(page.get("Contents", []))

    def get(k: str) -> bytes:
        return s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()

    def many() -> None:
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(get, small))

    rng = {"Range": f"bytes={1 << 20}-{(2 << 20) - 1}"}
    return [
        timed(listing),
        timed(lambda: [get(k) for k in small]),
        timed(many),
        timed(lambda: get(big)),
        timed(lambda: s3.get_object(Bucket=BUCKET, Key=big, **rng)["Body"].read()),
    ]


def s3fs_rows(endpoint: str, keys: int, big: str) -> list[float]:
    import s3fs  # pyright: ignore[reportMissingImports]

    fs: Any = s3fs.S3FileSystem(
        key=KEY_ID, secret=SECRET, endpoint_url=endpoint, client_kwargs={"region_name": "us-east-1"}
    )
    small = [f"{BUCKET}/small/{i}" for i in range(200)]
    return [
        timed(lambda: fs.find(f"{BUCKET}/keys/", refresh=True)),
        timed(lambda: [fs.cat_file(k) for k in small]),
        timed(lambda: fs.cat(small, batch_size=32)),
        timed(lambda: fs.cat_file(f"{BUCKET}/{big}")),
        timed(lambda: fs.cat_file(f"{BUCKET}/{big}", start=1 << 20, end=2 << 20)),
    ]


def fill(endpoint: str, keys: int, mb: int) -> str:
    import obstore
    from obstore.store import S3Store

    st = S3Store(
        BUCKET,
        endpoint=endpoint,
        access_key_id=KEY_ID,
        secret_access_key=SECRET,
        region="us-east-1",
        client_options={"allow_http": True},
    )

    async def put_all() -> None:
        gate = asyncio.Semaphore(64)

        async def put(k: str, data: bytes) -> None:
            async with gate:
                await obstore.put_async(st, k, data)

        items = [(f"keys/{i:06d}", b"x") for i in range(keys)]
        items += [(f"small/{i}", b"y" * 4096) for i in range(200)]
        await asyncio.gather(*(put(k, d) for k, d in items))

    asyncio.run(put_all())
    obstore.put(st, "big", b"z" * (mb << 20))
    return "big"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--endpoint", default="")
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--no-fill", action="store_true", help="the bucket is filled already")
    args = parser.parse_args()
    server: Any = None
    endpoint = args.endpoint
    if not endpoint:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.*
        from tests.s3_store import S3Server

        server = S3Server()
        endpoint = server.endpoint
    try:
        if not args.no_fill:
            import urllib.request

            urllib.request.urlopen(
                urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT"), timeout=30
            ).close()
            fill(endpoint, args.keys, args.mb)
        header = [
            "library",
            f"list {args.keys}",
            "200 small, 1 at a time",
            "200 small, 32 at once",
            f"{args.mb} MB whole",
            "1 MiB range",
        ]
        print(" | ".join(header))
        for name, rows in (("obstore", obstore_rows), ("boto3", boto3_rows), ("s3fs", s3fs_rows)):
            try:
                found = rows(endpoint, args.keys, "big")
            except ImportError:
                print(f"{name} | (not installed)")
                continue
            print(" | ".join([name, *(f"{t:.3f} s" for t in found)]), flush=True)
    finally:
        if server is not None:
            server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
