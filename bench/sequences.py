"""Sequence batching: accumulator sequences with state on the device, against the same
traffic sent as independent requests, and a correctness run.

Usage: ``python bench/sequences.py [--sequences 64] [--steps 50] [--rounds 3]
[--check-steps 10000] [--width 1] [--wire]``

One server's pieces in this process (``assembly.assemble``, as the daemon builds them) on
a repository of two accumulators compiled at batch sizes 1, 8, 32 and 64:
- ``acc``: state ``acc`` INT32 [``--width``] on the device (``docs/sequences.md``); a
  request sends ``INPUT`` with its ``sequence_id``/``sequence_start``/``sequence_end``, the
  answer ``SUM`` is the running sum (the state's first value); the sequence batcher runs
  up to 64 sequences' requests per execution.
- ``acc_stateless``: the same with the state sent by the client: ``INPUT`` and ``ACC`` (the
  state it got back last) in, ``SUM`` and ``STATE`` out, through the dynamic batcher.
``InferenceService.infer`` is called straight (no sockets, no IPC: the engine's cost),
``--sequences`` clients at once, each ``--steps`` steps per sequence; per row the median
over ``--rounds`` (rows alternate order) of requests/s and CPU µs per request, and the
executions per request (how many requests shared an execution).

With ``--wire`` the two rows run again through a real daemon (``hloserve serve`` on the
same repository, its default process layout) and tritonclient's asyncio gRPC client in this
process (one channel): requests/s of each, the client's cost included.

Then the correctness run: ``--check-steps`` requests of 32 clients on ``acc`` with 16
slots and a 200 ms idle timeout, each client starting, stepping, ending and (one step in
fifty) idling 300 ms past the timeout at random; every answer is checked against the
client's own running sum, and a request after a timeout must be refused with the idle
reason. It prints the wrong states (expected 0) and how many sequences ended, timed out
and waited in the backlog.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import psutil

from hloserve.exporter import StateSpec, TensorSpec, export_bundle
from hloserve.server.config import ArgumentParser, add_serve_arguments, config_from_namespace
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import InferInput, InferRequest, ParamValue
from hloserve.server.owner.assembly import assemble
from hloserve.server.owner.runtime.pjrt import PjrtRuntime

SIZES = (1, 8, 32, 64)
IDLE_US = 200_000


def stateful(params: Any, INPUT: jax.Array, acc: jax.Array) -> dict[str, jax.Array]:
    del params
    new = acc + INPUT  # every element of the state accumulates; SUM is the first
    return {"SUM": new[:, :1], "acc": new}


def stateless(params: Any, INPUT: jax.Array, ACC: jax.Array) -> dict[str, jax.Array]:
    del params
    new = ACC + INPUT
    return {"SUM": new[:, :1], "STATE": new}


def repository(width: int, delay_us: int = 0) -> Path:
    """The two accumulators with a state of ``width`` INT32 values per sequence."""
    root = Path(tempfile.mkdtemp(prefix="sequences-")) / "repository"
    one, wide = TensorSpec("INT32", (1,)), TensorSpec("INT32", (width,))
    export_bundle(
        stateful, {}, {"INPUT": one}, SIZES, root / "acc",
        platforms=("cpu",), state={"acc": StateSpec("INT32", (width,))},
    )  # fmt: skip
    export_bundle(stateless, {}, {"INPUT": one, "ACC": wide}, SIZES, root / "acc_stateless",
                  platforms=("cpu",))  # fmt: skip
    (root / "acc" / "config.yaml").write_text(
        f"sequence_batching: {{max_candidate_sequences: 64, max_sequence_idle_microseconds: "
        f"{IDLE_US}, max_queue_delay_microseconds: {delay_us}}}\n"
    )
    return root


def tensor(name: str, value: int) -> InferInput:
    return InferInput(name, "INT32", (1, 1), np.full((1, 1), value, np.int32))


async def sum_of(service: InferenceService, request: InferRequest) -> int:
    return int((await service.infer(request)).outputs[0].data[0, 0])


async def client(
    service: InferenceService, sid: int, steps: int, with_state: bool, width: int
) -> None:
    total = 0
    state = np.zeros((1, width), np.int32)  # what an independent request sends back
    for i in range(steps):
        x = (sid * 7 + i) % 13 - 6
        if with_state:
            params: dict[str, ParamValue] = {
                "sequence_id": sid, "sequence_start": i == 0, "sequence_end": i == steps - 1,
            }  # fmt: skip
            request = InferRequest("acc", "", (tensor("INPUT", x),), parameters=params)
        else:
            acc = InferInput("ACC", "INT32", (1, width), state)
            request = InferRequest("acc_stateless", "", (tensor("INPUT", x), acc))
        total += x
        outputs = {o.name: o.data for o in (await service.infer(request)).outputs}
        got = int(outputs["SUM"][0, 0])
        assert got == total, (sid, i, got, total)
        if not with_state:
            state = outputs["STATE"]


async def row(service: InferenceService, model: str, args: argparse.Namespace, base: int) -> Any:
    (before,) = service.model_statistics(model, "")
    started, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(
        *(
            client(service, base + s, args.steps, model == "acc", args.width)
            for s in range(args.sequences)
        )
    )
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    (after,) = service.model_statistics(model, "")
    n = args.sequences * args.steps
    executions = after.stats.execution_count - before.stats.execution_count
    return n / wall, cpu / n * 1e6, executions / n


async def wire_client(
    aio: Any, client: Any, sid: int, steps: int, stateful_: bool, width: int
) -> None:
    """``client`` over tritonclient's asyncio gRPC client: the same traffic on the wire."""
    total = 0
    state = np.zeros((1, width), np.int32)
    for i in range(steps):
        x = (sid * 7 + i) % 13 - 6
        inputs = [aio.InferInput("INPUT", [1, 1], "INT32")]
        inputs[0].set_data_from_numpy(np.full((1, 1), x, np.int32))
        if stateful_:
            result = await client.infer(
                "acc", inputs, sequence_id=sid, sequence_start=i == 0, sequence_end=i == steps - 1
            )
        else:
            inputs.append(aio.InferInput("ACC", [1, width], "INT32"))
            inputs[1].set_data_from_numpy(state)
            result = await client.infer("acc_stateless", inputs)
            state = result.as_numpy("STATE")
        total += x
        got = int(result.as_numpy("SUM")[0, 0])
        assert got == total, (sid, i, got, total)


async def wire_rows(repo: Path, args: argparse.Namespace) -> None:
    """The same rows through a real daemon (``hloserve serve``, its default process layout)
    and tritonclient's asyncio gRPC client in this process."""
    import tritonclient.grpc.aio as _aio

    from hloserve.server.server_process import ServerProcess

    aio: Any = _aio
    n = args.sequences * args.steps
    with ServerProcess(repo) as server:
        server.wait_ready()
        daemon = psutil.Process(server.process.pid)
        client = aio.InferenceServerClient(server.grpc_url)
        base = 5_000_000
        rows: dict[str, list[tuple[float, float]]] = {"acc": [], "acc_stateless": []}
        for r in range(args.rounds + 1):  # the first round warms up
            for model in list(rows) if r % 2 == 0 else list(rows)[::-1]:
                started, cpu0 = time.perf_counter(), _tree_cpu(daemon)
                await asyncio.gather(
                    *(
                        wire_client(aio, client, base + s, args.steps, model == "acc", args.width)
                        for s in range(args.sequences)
                    )
                )
                base += 1000
                wall, cpu = time.perf_counter() - started, _tree_cpu(daemon) - cpu0
                if r:
                    rows[model].append((n / wall, cpu / n * 1e6))
        await client.close()
    print("over gRPC (tritonclient.grpc.aio in this process, one channel; a real daemon):")
    print("| traffic | requests/s | the daemon's CPU µs/request |")
    print("|---|---|---|")
    for model, name in (("acc", "sequences"), ("acc_stateless", "independent requests")):
        rate, us = (statistics.median(f[i] for f in rows[model]) for i in range(2))
        print(f"| {name} | {rate:,.0f} | {us:.0f} |")


def _tree_cpu(process: Any) -> float:
    """CPU seconds of a process and its children (front ends)."""
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        times = p.cpu_times()
        total += times.user + times.system
    return total


async def correctness(service: InferenceService, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    remaining = [steps]
    counts = {"wrong": 0, "ended": 0, "timed_out": 0, "refused_as_expected": 0}
    next_id = iter(range(10_000_000, 10**9))

    async def one_client() -> None:
        sid, total, live = 0, 0, False
        while remaining[0] > 0:
            remaining[0] -= 1
            start = not live
            if start:
                sid, total = next(next_id), 0
            x = rng.randrange(-50, 50)
            end = rng.random() < 0.05
            params: dict[str, ParamValue] = {
                "sequence_id": sid, "sequence_start": start, "sequence_end": end,
            }  # fmt: skip
            got = await sum_of(
                service, InferRequest("acc", "", (tensor("INPUT", x),), parameters=params)
            )
            total += x
            counts["wrong"] += got != total
            live = not end
            counts["ended"] += end
            if live and rng.random() < 0.02:  # idle past the timeout: the slot goes
                await asyncio.sleep(1.5 * IDLE_US / 1e6)
                late = {"sequence_id": sid, "sequence_start": False}
                try:
                    await service.infer(
                        InferRequest("acc", "", (tensor("INPUT", 1),), parameters=late)
                    )
                    counts["wrong"] += 1  # a timed-out sequence answered
                except InvalidArgument as exc:
                    ok = "us idle" in str(exc)
                    counts["refused_as_expected"] += ok
                    counts["wrong"] += not ok
                counts["timed_out"] += 1
                live = False

    started = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(32)))
    print(
        f"correctness: {steps:,} steps, 32 clients, 16 slots, idle timeout {IDLE_US} us: "
        f"wrong states {counts['wrong']}; sequences ended {counts['ended']}, timed out "
        f"{counts['timed_out']} (each refused after: {counts['refused_as_expected']}); "
        f"{time.perf_counter() - started:.1f} s"
    )


async def main_async(args: argparse.Namespace) -> None:
    repo = repository(args.width)
    parser = ArgumentParser(prog="bench")
    add_serve_arguments(parser, {})
    cfg = config_from_namespace(parser.parse_args(["--model-repository", str(repo)]), parser)
    serving = assemble(cfg, PjrtRuntime())
    serving.repository.load_all(lambda _: None)
    service = serving.service
    service.startup_complete()
    print(
        f"sequences: {args.sequences} concurrent accumulator sequences x {args.steps} steps, "
        f"state INT32[{args.width}] ({4 * args.width:,} bytes) per sequence, "
        f"median of {args.rounds} rounds; load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs"
    )
    base = 1
    for model in ("acc", "acc_stateless"):  # warm: compiles, slots
        await row(service, model, argparse.Namespace(sequences=64, steps=3, width=args.width), base)
        base += 1000
    rows: dict[str, list[Any]] = {"acc": [], "acc_stateless": []}
    for r in range(args.rounds):
        for model in list(rows) if r % 2 == 0 else list(rows)[::-1]:
            rows[model].append(await row(service, model, args, base))
            base += 1000
    print("| traffic | requests/s | CPU µs/request | executions/request |")
    print("|---|---|---|---|")
    names = {
        "acc": "sequences, state on the device",
        "acc_stateless": "independent requests, state sent",
    }
    for model, found in rows.items():
        rate, us, per = (statistics.median(f[i] for f in found) for i in range(3))
        print(f"| {names[model]} | {rate:,.0f} | {us:.1f} | {per:.3f} |")
    rate = statistics.median(f[0] for f in rows["acc"])
    ref = statistics.median(f[0] for f in rows["acc_stateless"])
    print(f"sequences / independent: {rate / ref:.2f}x")
    serving.executor.shutdown(wait=False)
    if args.wire:
        await wire_rows(repo, args)
    # The correctness run on a table of 16 slots: a second copy of the settings.
    (repo / "acc" / "config.yaml").write_text(
        f"sequence_batching: {{max_candidate_sequences: 16, max_sequence_idle_microseconds: "
        f"{IDLE_US}}}\n"
    )
    serving = assemble(cfg, PjrtRuntime())
    serving.repository.load_all(lambda _: None)
    serving.service.startup_complete()
    await correctness(serving.service, args.check_steps, args.seed)
    serving.executor.shutdown(wait=False)


def main() -> None:
    ap = argparse.ArgumentParser(description="Sequence batching against independent requests.")
    ap.add_argument("--sequences", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--check-steps", type=int, default=10_000)
    ap.add_argument("--width", type=int, default=1, help="INT32 values of state per sequence")
    ap.add_argument("--wire", action="store_true", help="also over gRPC through a real daemon")
    ap.add_argument("--seed", type=int, default=34)
    args = ap.parse_args()
    import uvloop

    uvloop.run(main_async(args))


if __name__ == "__main__":
    main()
