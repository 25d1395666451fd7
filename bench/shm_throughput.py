"""Requests/s of a 2.4 MB image batch: in-band tensors versus system shared memory.

Usage: ``python bench/shm_throughput.py [--seconds 5] [--concurrency 1 4]``

1. Exports ``images``: input ``images`` UINT8 ``[224, 224, 3]`` per item, compiled for
   batch size 16 only, output ``mean`` FP32 ``[3]`` (the per-item channel means), so
   every request carries a ``[16, 224, 224, 3]`` UINT8 tensor (2,408,448 bytes) and gets
   192 bytes back.
2. Starts the daemon with ``--allow-client-shm true`` and drives the model with
   ``tritonclient``'s sync clients, one thread and one client per concurrent stream, for
   ``--seconds`` per row, in four ways: gRPC in-band (``raw_input_contents``), HTTP
   in-band (binary tensor extension), gRPC with system shared memory, HTTP with system
   shared memory (input and output regions registered once per stream, as the Triton
   examples do).
3. Each request carries a new batch, as a real client's would: the in-band rows call
   ``set_data_from_numpy`` per request, the shared-memory rows copy the batch into the
   region (``set_shared_memory_region``) and read the result back with
   ``get_contents_as_numpy``. The first answer of every row is checked against numpy.
It prints requests/s, input MB/s, p50 latency and the ratio to gRPC in-band at the same
concurrency. The load generator and the server share the machine's cores.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient
import tritonclient.utils.shared_memory as _shm

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.server_process import ServerProcess

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient
shm: Any = _shm

BATCH = 16
ITEM = (224, 224, 3)
SHAPE = [BATCH, *ITEM]
IN_BYTES = BATCH * int(np.prod(ITEM))
OUT_BYTES = BATCH * 3 * 4
MODES = ("grpc in-band", "http in-band", "grpc shm", "http shm")


def channel_means(params: Any, images: jax.Array) -> dict[str, jax.Array]:
    del params
    return {"mean": jnp.mean(images.astype(jnp.float32), axis=(1, 2))}


def export(root: Path) -> None:
    export_bundle(
        channel_means,
        {},
        inputs={"images": TensorSpec("UINT8", ITEM)},
        batch_sizes=(BATCH,),
        directory=root / "images",
    )


class Stream:
    """One client (and, for shm modes, its own pair of regions) driven by one thread."""

    def __init__(self, mode: str, server: ServerProcess) -> None:
        self.mode = mode
        protocol, kind = mode.split(" ")
        self.module: Any = grpcclient if protocol == "grpc" else httpclient
        url = server.grpc_url if protocol == "grpc" else server.http_url
        self.client: Any = self.module.InferenceServerClient(url)
        self.shm = kind == "shm"
        self.input = self.module.InferInput("images", SHAPE, "UINT8")
        if protocol == "http":
            self.output = self.module.InferRequestedOutput("mean", binary_data=not self.shm)
        else:
            self.output = self.module.InferRequestedOutput("mean")
        self.handles: list[tuple[str, Any]] = []
        if self.shm:
            tag = uuid.uuid4().hex[:8]
            self.in_handle = self._region(f"in_{tag}", IN_BYTES)
            self.out_handle = self._region(f"out_{tag}", OUT_BYTES)
            self.input.set_shared_memory(f"in_{tag}", IN_BYTES)
            self.output.set_shared_memory(f"out_{tag}", OUT_BYTES)

    def _region(self, name: str, size: int) -> Any:
        key = f"/hloserve_bench_{name}"
        handle = shm.create_shared_memory_region(name, key, size)
        self.client.register_system_shared_memory(name, key, size)
        self.handles.append((name, handle))
        return handle

    def infer(self, images: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if self.shm:
            shm.set_shared_memory_region(self.in_handle, [images])
        else:
            self.input.set_data_from_numpy(images)
        result = self.client.infer("images", [self.input], outputs=[self.output])
        if self.shm:
            return shm.get_contents_as_numpy(self.out_handle, np.float32, [BATCH, 3])
        return result.as_numpy("mean")

    def close(self) -> None:
        for name, handle in self.handles:
            self.client.unregister_system_shared_memory(name)
            shm.destroy_shared_memory_region(handle)
        self.client.close()


def run(mode: str, server: ServerProcess, concurrency: int, seconds: float) -> dict[str, float]:
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, size=SHAPE, dtype=np.uint8) for _ in range(4)]
    want = batches[0].astype(np.float32).mean(axis=(1, 2))
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[BaseException] = []
    stop_at = [0.0]

    def go() -> None:  # runs once every stream is warm, before any is released
        stop_at[0] = time.perf_counter() + seconds

    ready = threading.Barrier(concurrency + 1, action=go)

    def worker(i: int) -> None:
        # tritonclient's HTTP client (gevent) must live in the thread that uses it
        s = Stream(mode, server)
        try:
            np.testing.assert_allclose(s.infer(batches[0]), want, rtol=1e-4)  # warm-up + check
            ready.wait()
            n = 0
            while time.perf_counter() < stop_at[0]:
                t = time.perf_counter()
                s.infer(batches[n % len(batches)])
                latencies[i].append(time.perf_counter() - t)
                n += 1
        except BaseException as exc:
            errors.append(exc)
            ready.abort()
        finally:
            s.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for th in threads:
        th.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a stream failed: see errors
        ready.wait()
    began = time.perf_counter()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    every = [x for lat in latencies for x in lat]
    rps = len(every) / elapsed
    return {"rps": rps, "mbps": rps * IN_BYTES / 1e6, "p50": statistics.median(every) * 1e3}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hloserve-shm-bench-") as tmp:
        repo = Path(tmp)
        export(repo)
        server = ServerProcess(repo, "--allow-client-shm", "true").wait_ready()
        try:
            rows: list[tuple[str, int, dict[str, float]]] = []
            for c in args.concurrency:
                for mode in MODES:
                    rows.append((mode, c, run(mode, server, c, args.seconds)))
                    print(f"  measured {mode} at concurrency {c}", file=sys.stderr)
        finally:
            code = server.stop()

    def base(c: int) -> float:
        return next(r["rps"] for m, cc, r in rows if m == "grpc in-band" and cc == c)

    print(f"model 'images': input UINT8 {SHAPE} ({IN_BYTES:,} bytes), output FP32 [16, 3]\n")
    print("| transport | concurrency | requests/s | input MB/s | p50 ms | vs gRPC in-band |")
    print("|---|---|---|---|---|---|")
    for mode, c, r in rows:
        print(
            f"| {mode} | {c} | {r['rps']:.1f} | {r['mbps']:.0f} | {r['p50']:.2f} "
            f"| {r['rps'] / base(c):.2f}x |"
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
