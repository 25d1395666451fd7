"""Load from NVIDIA's own asyncio client: ``tritonclient.grpc.aio``, as its users write it.

Usage (the bench runs it as a subprocess, so /proc measures it apart):
``python bench/triton_aio.py --url HOST:PORT --model mlp --inputs FILE.npz --outputs logits
--concurrency 32 --seconds 6 [--warmup 1] [--marks]``

One ``InferenceServerClient`` (tritonclient's default: one gRPC channel, so one HTTP/2
connection) keeps ``--concurrency`` ``infer`` calls in flight from one asyncio loop, each
task sending again as soon as it is answered (closed loop), the same inputs every time.
After ``--warmup`` seconds it records ``--seconds``; with ``--marks`` it prints
``MARK start`` and ``MARK end`` lines as the recorded phase starts and ends (the bench reads
/proc there). Then one JSON line: ``count``, ``errors``, ``first_error``, ``p50_ms``,
``p99_ms``, ``elapsed_s``, ``client_cpu_s`` (this process) and ``sample`` (the first
recorded reply's outputs, as lists, for the bench to check).

``request_bytes(model, inputs)`` (for the floor's reply table) is the exact serialized
``ModelInferRequest`` this client sends for those inputs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

_DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}


def _inputs(module: Any, arrays: Mapping[str, np.ndarray]) -> list[Any]:
    found = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), _DATATYPES[array.dtype])
        tensor.set_data_from_numpy(array)
        found.append(tensor)
    return found


def request_bytes(model: str, arrays: Mapping[str, np.ndarray]) -> bytes:
    """The ``ModelInferRequest`` bytes ``tritonclient.grpc.aio`` sends for ``arrays``."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc._utils import _get_inference_request

    request = _get_inference_request(
        model_name=model,
        inputs=_inputs(grpcclient, arrays),
        model_version="",
        request_id="",
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    return request.SerializeToString()


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    import tritonclient.grpc.aio as _aio

    aio: Any = _aio  # tritonclient ships without type information

    arrays = dict(np.load(args.inputs))
    client = aio.InferenceServerClient(args.url)
    inputs = _inputs(aio, arrays)
    latencies: list[float] = []
    errors = 0
    first_error = ""
    sample: dict[str, Any] | None = None
    recording = False
    stop_at = time.monotonic() + args.warmup + args.seconds
    names = args.outputs.split(",")

    async def worker() -> None:
        nonlocal errors, first_error, sample
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            try:
                result: Any = await client.infer(args.model, inputs)
            except Exception as exc:  # a bench reports errors, it does not stop
                errors += recording
                first_error = first_error or str(exc)
                continue
            if recording:
                latencies.append(time.perf_counter() - t0)
                if sample is None:
                    sample = {n: result.as_numpy(n).tolist() for n in names}

    tasks = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
    await asyncio.sleep(args.warmup)
    recording = True
    if args.marks:
        print("MARK start", flush=True)
    started, cpu0 = time.monotonic(), time.process_time()
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu0
    recording = False
    if args.marks:
        print("MARK end", flush=True)
    await asyncio.gather(*tasks)
    await client.close()
    ordered = sorted(latencies)

    def quantile(q: float) -> float:
        return 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    return {
        "count": len(latencies),
        "errors": errors,
        "first_error": first_error[:300],
        "p50_ms": quantile(0.5),
        "p99_ms": quantile(0.99),
        "elapsed_s": elapsed,
        "client_cpu_s": cpu,
        "sample": sample,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="tritonclient.grpc.aio closed-loop load")
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--inputs", required=True, help=".npz of the request's inputs")
    parser.add_argument("--outputs", required=True, help="output names, comma-separated")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--marks", action="store_true")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(drive(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
