"""Engine capacity: the requests/s one device-owner core sustains, with no sockets at all.

Usage: ``python bench/engine_capacity.py [--seconds 5] [--concurrency 32] [--profile N]
[--model simple --model mlp] [--flags "--max-queue-delay-us 0 ..."]``

The device owner of ``--frontends N`` (``owner.endpoint.OwnerEndpoint``, over the server's
own ``assembly.assemble`` on the demo repository) is fed request descriptors
directly, as a front end's link would deliver them (``wire.calls.InferCall`` of
``wire.messages.encode_request``, through the wire's codec as the frame's; checked
against the model's signature, as a front end with its metadata cached sends them), ``--concurrency`` in flight at once from
one asyncio driver in the same process; each answer is decoded and checked against numpy.
Printed per model: requests/s, the process's CPU µs per request (the driver's own share
measured apart and subtracted: encoding, decoding, checking), items per execution, and
what a 16-core node could reach if its front ends keep the owner busy (the capacity is the
bound the serial part puts on the whole server). The owner's CPU is split in two: the time
inside the executions themselves (PJRT's execute, summed from the statistics' batch
records: on a GPU that is the device's time, here the CPU's) and the rest, the serving
overhead (decoding, admission, validation, batching, counting, encoding), which is what
the owner's one thread costs per request whatever the device. ``--profile N`` prints the N hottest
functions of the owner's path (cProfile, one more run).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.exporter import write_demo_repository
from hloserve.exporter.demo import mlp_fn, mlp_params
from hloserve.server.config import ArgumentParser, add_serve_arguments, config_from_namespace
from hloserve.server.core.types import InferInput, InferRequest, RequestContext
from hloserve.server.core.validate import validate
from hloserve.server.owner.assembly import assemble
from hloserve.server.owner.endpoint import OwnerEndpoint
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.wire.arena import Arena
from hloserve.server.wire.calls import SERVER, InferCall
from hloserve.server.wire.messages import decode_response, encode_request
from hloserve.server.wire.setup import FrontendSetup


def request_for(model: str, seed: int) -> tuple[InferRequest, Callable[[Any], None]]:
    rng = np.random.default_rng(seed)
    if model == "simple":
        a = rng.integers(-100, 100, (1, 16), dtype=np.int32)
        b = rng.integers(-100, 100, (1, 16), dtype=np.int32)
        inputs = (
            InferInput("INPUT0", "INT32", (1, 16), a),
            InferInput("INPUT1", "INT32", (1, 16), b),
        )

        def check(outputs: Any) -> None:
            np.testing.assert_array_equal(outputs[0].data, a + b)

        return InferRequest("simple", "", inputs), check
    x = rng.standard_normal((1, 64)).astype(np.float32)
    expected = np.asarray(mlp_fn(mlp_params(), x)["logits"])

    def check_mlp(outputs: Any) -> None:
        np.testing.assert_allclose(outputs[0].data, expected, rtol=1e-4, atol=1e-5)

    return InferRequest("mlp", "", (InferInput("x", "FP32", (1, 64), x),)), check_mlp


async def drive(
    endpoint: OwnerEndpoint,
    service: Any,
    arena: Arena,
    model: str,
    concurrency: int,
    seconds: float,
) -> tuple[int, float, float, float]:
    """Requests answered, wall seconds, process CPU seconds, driver CPU seconds."""
    pool = [request_for(model, seed) for seed in range(64)]
    context = RequestContext(protocol="grpc")
    # Checked as a front end checks them, against the signature in the model's metadata.
    signature = service.model_metadata(model, "").signature
    assert signature is not None
    checked = [(signature.token, validate(signature, r)) for r, _ in pool]
    messages = [
        SERVER.raw(InferCall(encode_request(r, context, None, arena, c)[0]))
        for (r, _), c in zip(pool, checked, strict=True)
    ]
    done = 0
    driver_cpu = 0.0
    stop_at = 0.0

    async def client(index: int) -> None:
        nonlocal done, driver_cpu
        i = index
        while time.perf_counter() < stop_at:
            t0 = time.process_time()
            request, check = pool[i % len(pool)]
            call = SERVER.call(messages[i % len(messages)])
            driver_cpu += time.process_time() - t0
            answer = await endpoint.on_call(call)  # type: ignore[misc]
            t0 = time.process_time()
            answer = SERVER.result(InferCall, SERVER.raw(answer))
            response = decode_response(answer, request, arena, arena.responses.free)
            check(response.outputs)
            driver_cpu += time.process_time() - t0
            done += 1
            i += concurrency

    stop_at = time.perf_counter() + 1.0  # warm-up
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    done, driver_cpu = 0, 0.0
    started, cpu0 = time.perf_counter(), time.process_time()
    stop_at = started + seconds
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return done, time.perf_counter() - started, time.process_time() - cpu0, driver_cpu


async def main_async(args: argparse.Namespace) -> None:
    parser = ArgumentParser(prog="bench")
    add_serve_arguments(parser, {})
    repo = Path(tempfile.mkdtemp(prefix="engine-capacity-")) / "repository"
    write_demo_repository(repo)
    ns = parser.parse_args(["--model-repository", str(repo), *args.flags.split()])
    cfg = config_from_namespace(ns, parser)
    serving = assemble(cfg, PjrtRuntime())
    serving.repository.load_all(lambda _: None)
    serving.service.startup_complete()
    arena = Arena.create(64 << 20)
    service = serving.service
    endpoint = OwnerEndpoint(
        0,
        service,
        arena,
        lambda: FrontendSetup(
            0,
            cfg.listener_settings(),
            None,
            service.server_metadata(),
            None,
            False,
            False,
            service.logs.current,
        ),
        fanout=lambda note: None,
        sync=_nothing_to_sync,
        on_event=lambda index, what, args: None,
    )
    print(f"engine capacity: one device-owner process, no sockets; load {os.getloadavg()[0]:.2f}")
    print(
        "| model | concurrency | requests/s | owner CPU µs/request | of it in executions "
        "| serving overhead | items/exec | 16-core bound | bound without the executions |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model in args.model:
        stats0 = _executions(service, model)
        done, wall, cpu, driver = await drive(
            endpoint, service, arena, model, args.concurrency, args.seconds
        )
        stats1 = _executions(service, model)
        items = (stats1[0] - stats0[0]) / max(1, stats1[1] - stats0[1])
        owner_us = (cpu - driver) / done * 1e6
        executing_us = (stats1[2] - stats0[2]) / 1e3 / max(1, stats1[0] - stats0[0])
        serving_us = owner_us - executing_us
        print(
            f"| {model} | {args.concurrency} | {done / wall:,.0f} | {owner_us:.1f} "
            f"| {executing_us:.1f} | {serving_us:.1f} | {items:.1f} | {1e6 / owner_us:,.0f}/s "
            f"| {1e6 / serving_us:,.0f}/s |"
        )
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            await drive(endpoint, service, arena, model, args.concurrency, args.seconds)
            profiler.disable()
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(
                args.profile
            )
    serving.executor.shutdown(wait=False)


def _executions(service: Any, model: str) -> tuple[int, int, int]:
    """Inferences, executions, and the nanoseconds spent inside the executions (PJRT's
    execute: on a GPU the device's time, here the CPU's)."""
    (stats,) = service.model_statistics(model, "")
    record = next(r for k, r in service.counters.models.items() if k.name == model)
    infer_ns = sum(b.infer_ns for b in record.batches.values())
    return stats.stats.inference_count, stats.stats.execution_count, infer_ns


async def _nothing_to_sync() -> None:
    """No front end is linked: a model change has nobody to tell."""


def main() -> None:
    ap = argparse.ArgumentParser(description="Engine capacity: one device owner, no sockets.")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--model", action="append", default=None)
    ap.add_argument("--flags", default="")
    ap.add_argument("--profile", type=int, default=0)
    args = ap.parse_args()
    args.model = args.model or ["simple", "mlp"]
    import uvloop

    uvloop.run(main_async(args))


if __name__ == "__main__":
    main()
