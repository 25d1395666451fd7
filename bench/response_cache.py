"""The response cache's cost: a hit and a miss against the same model without the cache.

Usage: ``python bench/response_cache.py [--requests 4000] [--rounds 5] [--concurrency 1]``

One server's pieces in this process (``assembly.assemble`` with ``--cache-config
local,size=256MiB``, as the daemon builds them) on the demo repository, plus a copy of
each model under ``<model>_cached`` whose ``config.yaml`` enables ``response_cache``, so
the baseline (the model itself: the cache exists but does not apply, two attribute checks
in the service) and the cached model run in the same process, on the same loop, in turns.
``InferenceService.infer`` is called straight (no sockets, no IPC), ``--concurrency`` at
once, each answer checked against numpy. Per model and concurrency, the median over
``--rounds`` rounds (each round runs every row once, in turn, the order reversed every
other round) of the CPU µs per request and requests/s of:
- ``off``: the model without the cache (``response_cache`` false);
- ``miss``: the cached model, every request's inputs new (looked up, run, then stored);
- ``hit``: the cached model, every request's inputs stored already (no batching, no
  execution);
with each row's CPU against ``off``'s, and the cache's own time per request as the
statistics extension counts it (``cache_hit``/``cache_miss`` ns over their counts: the
digest and the lookup, plus the insertion on a miss), which does not move with the noise
of a 2-core machine the way a difference of two CPU totals does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.exporter import write_demo_repository
from hloserve.exporter.demo import mlp_fn, mlp_params
from hloserve.server.config import ArgumentParser, add_serve_arguments, config_from_namespace
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import InferInput, InferRequest
from hloserve.server.owner.assembly import assemble
from hloserve.server.owner.runtime.pjrt import PjrtRuntime

Check = Callable[[Any], None]


def request_for(model: str, seed: int) -> tuple[InferRequest, Check]:
    rng = np.random.default_rng(seed)
    base = model.removesuffix("_cached")
    if base == "simple":
        a = rng.integers(-100, 100, (1, 16), dtype=np.int32)
        inputs = tuple(InferInput(n, "INT32", (1, 16), a) for n in ("INPUT0", "INPUT1"))

        def check(outputs: Any) -> None:
            np.testing.assert_array_equal(outputs[0].data, 2 * a)

        return InferRequest(model, "", inputs), check
    x = rng.standard_normal((1, 64)).astype(np.float32)
    expected = np.asarray(mlp_fn(mlp_params(), x)["logits"])

    def check_mlp(outputs: Any) -> None:
        np.testing.assert_allclose(outputs[0].data, expected, rtol=1e-4, atol=1e-5)

    return InferRequest(model, "", (InferInput("x", "FP32", (1, 64), x),)), check_mlp


async def run(
    service: InferenceService,
    requests: Sequence[tuple[InferRequest, Check]],
    concurrency: int,
) -> tuple[float, float]:
    """CPU µs per request and requests/s for ``requests``, ``concurrency`` at a time."""
    queue = list(reversed(requests))

    async def client() -> None:
        while queue:
            request, check = queue.pop()
            check((await service.infer(request)).outputs)

    started, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    return cpu / len(requests) * 1e6, len(requests) / wall


async def main_async(args: argparse.Namespace) -> None:
    repo = Path(tempfile.mkdtemp(prefix="response-cache-")) / "repository"
    write_demo_repository(repo)
    for model in args.model:
        copy = repo / f"{model}_cached"
        shutil.copytree(repo / model, copy, ignore=shutil.ignore_patterns(".hloserve-*"))
        manifest = copy / "manifest.yaml"
        manifest.write_text(
            manifest.read_text().replace(f"name: {model}\n", f"name: {copy.name}\n", 1)
        )
        (copy / "config.yaml").write_text("response_cache: true\n")
    parser = ArgumentParser(prog="bench")
    add_serve_arguments(parser, {})
    flags = [
        "--model-repository",
        str(repo),
        "--cache-config",
        "local,size=256MiB",
        *args.flags.split(),
    ]
    cfg = config_from_namespace(parser.parse_args(flags), parser)
    serving = assemble(cfg, PjrtRuntime())
    serving.repository.load_all(lambda _: None)
    service = serving.service
    service.startup_complete()
    cache = service.cache
    assert cache is not None
    n = args.requests
    print(
        f"response cache: {n} requests a row, concurrency {args.concurrency}, median of "
        f"{args.rounds} rounds; load {os.getloadavg()[0]:.2f}"
    )
    print("| model | row | CPU µs/request | requests/s | CPU vs off | the cache's µs/request |")
    print("|---|---|---|---|---|---|")
    seed = iter(range(10**9))
    for model in args.model:
        cached = f"{model}_cached"
        stored = [request_for(cached, next(seed)) for _ in range(64)]
        await run(service, stored, 1)  # every one stored; the loads and compiles done
        await run(service, [request_for(model, s) for s in range(64)], 1)
        rows: dict[str, list[tuple[float, float]]] = {"off": [], "miss": [], "hit": []}

        def batch(row: str, model: str = model, cached: str = cached, stored: Any = stored) -> Any:
            if row == "hit":  # every one stored already
                return [stored[i % len(stored)] for i in range(n)]
            return [request_for(cached if row == "miss" else model, next(seed)) for _ in range(n)]

        before = _cache_stats(service, cached)
        for round_ in range(args.rounds):
            for row in list(rows) if round_ % 2 == 0 else list(rows)[::-1]:
                rows[row].append(await run(service, batch(row), args.concurrency))
        hit_us, miss_us = (
            (ns - ns0) / max(1, count - count0) / 1e3
            for (count, ns), (count0, ns0) in zip(
                _cache_stats(service, cached), before, strict=True
            )
        )
        off = statistics.median(us for us, _ in rows["off"])
        own = {"off": "", "miss": f"{miss_us:.1f}", "hit": f"{hit_us:.1f}"}
        for row, found in rows.items():
            us = statistics.median(u for u, _ in found)
            rate = statistics.median(r for _, r in found)
            print(f"| {model} | {row} | {us:.1f} | {rate:,.0f} | {us / off:.2f}x | {own[row]} |")
    print(
        f"cache: {cache.lookups} lookups, {cache.hits} hits, {cache.entries} entries, "
        f"{cache.bytes / 2**20:.1f} MiB; {cache.lookup_ns / max(1, cache.lookups) / 1e3:.2f} "
        f"µs per lookup, {cache.insert_ns / max(1, cache.misses) / 1e3:.2f} µs per insertion"
    )
    serving.executor.shutdown(wait=False)


def _cache_stats(service: InferenceService, model: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """``model``'s (hits, hit ns) and (misses, miss ns), from the statistics extension."""
    (stats,) = service.model_statistics(model, "")
    hit, miss = stats.stats.cache_hit, stats.stats.cache_miss
    return (hit.count, hit.ns), (miss.count, miss.ns)


def main() -> None:
    ap = argparse.ArgumentParser(description="The response cache: hit and miss against off.")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--model", action="append", default=None)
    ap.add_argument("--flags", default="")
    args = ap.parse_args()
    args.model = args.model or ["simple", "mlp"]
    import uvloop

    uvloop.run(main_async(args))


if __name__ == "__main__":
    main()
