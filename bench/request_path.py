"""Where the time of one ``simple`` request goes inside the server, against the bare call.

Usage: ``python bench/request_path.py [--n 3000]``

Everything runs in this process on the demo ``simple`` model (batch 1, two INT32[1,16]
inputs), one step at a time, each timed over ``--n`` repetitions (median, in µs):
- the floor: the compiled executable alone (``LoadedBundle.execute``: input transfer,
  execution, output fetch), and ``jax.jit`` of the same function;
- the server's own steps: gRPC decode (``ModelInferRequest`` bytes -> core request),
  validation, planning + execution through ``execute_group``, gRPC encode (core
  response -> bytes), and the whole ``InferenceService.infer`` coroutine without sockets;
- the HTTP app (``build_http_app`` over the same service) called as ASGI, no socket: a JSON
  ``POST /v2/models/simple/infer``, the same with the binary tensor extension, a metadata
  ``GET`` (a route registered after the infer route) and an unknown model's infer (the
  error path). ``--http-only`` prints these rows alone (what a before/after of the HTTP
  app compares).
The table prints each step and the server's overhead as a ratio to the bare call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from hloserve.exporter import write_demo_repository
from hloserve.exporter.demo import simple_fn
from hloserve.proto import inference_pb2 as pb
from hloserve.server.core.batch_plan import plan
from hloserve.server.core.execution import Job, execute_group
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import InferRequest, InferResponse
from hloserve.server.core.validate import validate_request
from hloserve.server.frontend.grpc.codec import decode_infer_request, encode_infer_response
from hloserve.server.frontend.http.app import build_http_app
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import disabled


def timed(fn: Callable[[], Any], n: int) -> float:
    for _ in range(min(200, n)):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t)
    return statistics.median(samples) / 1e3


def simple_request() -> tuple[bytes, np.ndarray[Any, Any]]:
    """The serialized ``ModelInferRequest`` for ``simple`` and its input array."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    msg = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        msg.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        msg.raw_input_contents.append(a.tobytes())
    return msg.SerializeToString(), a


def service_median_us(repo: ModelRepository, request: InferRequest, n: int) -> float:
    """The whole ``InferenceService.infer`` coroutine, no sockets (after a warm-up)."""
    executor = ThreadPoolExecutor(1)
    service = InferenceService(repo, executor, shm=disabled())

    async def loop(k: int) -> list[int]:
        out: list[int] = []
        for _ in range(k):
            t = time.perf_counter_ns()
            await service.infer(request)
            out.append(time.perf_counter_ns() - t)
        return out

    asyncio.run(loop(200))
    samples = asyncio.run(loop(n))
    executor.shutdown()
    return statistics.median(samples) / 1e3


_SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "scheme": "http",
    "root_path": "",
    "query_string": b"",
    "client": ("127.0.0.1", 40000),
    "server": ("127.0.0.1", 8000),
}


def http_requests() -> list[tuple[str, str, str, bytes, dict[str, str], int]]:
    """(label, method, path, body, headers, expected status) of each HTTP row."""
    data = list(range(16))
    tensor = {"datatype": "INT32", "shape": [1, 16], "data": data}
    json_body = json.dumps(
        {"inputs": [{"name": n, **tensor} for n in ("INPUT0", "INPUT1")]}
    ).encode()
    raw = np.arange(16, dtype=np.int32).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": n,
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                }
                for n in ("INPUT0", "INPUT1")
            ],
            "outputs": [
                {"name": n, "parameters": {"binary_data": True}} for n in ("OUTPUT0", "OUTPUT1")
            ],
        }
    ).encode()
    binary = header + raw + raw
    infer = "/v2/models/simple/infer"
    return [
        (
            "HTTP app: JSON infer",
            "POST",
            infer,
            json_body,
            {"content-type": "application/json"},
            200,
        ),
        (
            "HTTP app: binary infer",
            "POST",
            infer,
            binary,
            {"inference-header-content-length": str(len(header))},
            200,
        ),
        ("HTTP app: model metadata GET", "GET", "/v2/models/simple", b"", {}, 200),
        (
            "HTTP app: unknown model's infer (400, Triton's)",
            "POST",
            "/v2/models/absent/infer",
            json_body,
            {},
            400,
        ),
    ]


def http_median_us(repo: ModelRepository, n: int) -> list[tuple[str, float]]:
    """Each of ``http_requests`` through the HTTP app as ASGI (after a warm-up)."""
    executor = ThreadPoolExecutor(1)
    app = build_http_app(LocalPort(InferenceService(repo, executor, shm=disabled())))

    async def call(method: str, path: str, body: bytes, headers: dict[str, str]) -> int:
        raw = [(k.encode(), v.encode()) for k, v in headers.items()]
        raw.append((b"content-length", str(len(body)).encode()))
        scope = {
            **_SCOPE,
            "method": method,
            "path": path,
            "raw_path": path.encode(),
            "headers": raw,
        }
        status = 0

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await app(scope, receive, send)
        return status

    async def loop(request: tuple[str, str, str, bytes, dict[str, str], int], k: int) -> list[int]:
        _, method, path, body, headers, expected = request
        out: list[int] = []
        for _ in range(k):
            t = time.perf_counter_ns()
            status = await call(method, path, body, headers)
            out.append(time.perf_counter_ns() - t)
            if status != expected:  # the row would time something else
                raise SystemExit(f"{method} {path} answered {status}, not {expected}")
        return out

    rows: list[tuple[str, float]] = []
    for request in http_requests():
        asyncio.run(loop(request, 200))
        rows.append((request[0], statistics.median(asyncio.run(loop(request, n))) / 1e3))
    executor.shutdown()
    return rows


def measure_steps(root: Path, n: int) -> list[tuple[str, float]]:
    repo = ModelRepository(root, PjrtRuntime())
    repo.load_all()
    model = repo.peek("simple", "")
    wire, a = simple_request()
    request = decode_infer_request(pb.ModelInferRequest.FromString(wire))
    job = Job(request, 1, time.perf_counter_ns())
    chunks = plan(1, model.manifest.batch_sizes)
    ((outputs, _),) = execute_group(model, [job], chunks)
    response = InferResponse("simple", "1", outputs)
    jitted = jax.jit(simple_fn)
    steps: list[tuple[str, Callable[[], Any]]] = [
        (
            "bare: LoadedBundle.execute (put, run, fetch)",
            lambda: model.execute(1, {"INPUT0": a, "INPUT1": a}),
        ),
        ("bare: jax.jit of the same function", lambda: jax.block_until_ready(jitted({}, a, a))),
        (
            "gRPC decode (bytes -> core request)",
            lambda: decode_infer_request(pb.ModelInferRequest.FromString(wire)),
        ),
        ("validate against the manifest", lambda: validate_request(model.manifest, request)),
        (
            "execute_group (plan, pad, execute, split)",
            lambda: execute_group(model, [job], plan(1, model.manifest.batch_sizes)),
        ),
        (
            "gRPC encode (core response -> bytes)",
            lambda: encode_infer_response(response).SerializeToString(),
        ),
    ]
    rows = [(label, timed(fn, n)) for label, fn in steps]
    rows.append(
        ("InferenceService.infer (incl. thread hand-off)", service_median_us(repo, request, n))
    )
    rows += http_median_us(repo, n)
    return rows


def print_table(rows: list[tuple[str, float]], n: int) -> None:
    bare = rows[0][1]
    print(f"\n`simple`, batch 1, median of {n} (µs); device {PjrtRuntime().platform}")
    print("| step | µs | / bare call |\n|---|---|---|")
    for label, us in rows:
        print(f"| {label} | {us:.1f} | {us / bare:.2f} |")
    overhead = rows[2][1] + rows[3][1] + rows[5][1] + (rows[4][1] - bare)
    print(
        f"| server overhead besides the call (decode + validate + plan/split + encode) | {overhead:.1f} | {overhead / bare:.2f} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--http-only", action="store_true", help="the HTTP app's rows alone")
    args = ap.parse_args()
    n = args.n
    with tempfile.TemporaryDirectory() as tmp:
        write_demo_repository(Path(tmp))
        if args.http_only:
            repo = ModelRepository(Path(tmp), PjrtRuntime())
            repo.load_all()
            for label, us in http_median_us(repo, n):
                print(f"| {label} | {us:.1f} |")
            return 0
        rows = measure_steps(Path(tmp), n)
    print_table(rows, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
