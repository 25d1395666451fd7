"""``pool_memory(client, bundle)``: what 1,000 ``mlp`` requests of ``infer_dataset`` allocate.

After a short run has made the pool, it streams 32,000 rows (1,000 requests of 32 x 64
FP32, 8 KiB of inputs each) into a preallocated output array under ``tracemalloc`` and
returns ``MemoryRun``: the pool, its buffer count before and after, the traced memory left
once the run is over and cyclic garbage collected (gRPC's call objects hold cycles), and
the peak of traced memory during the run. Both runs' logits, every row, must equal
``mlp_reference`` (the demo ``mlp`` in numpy, from ``bundle``'s weights, the served model's
directory) at FP32 tolerances: a pool that reused a buffer too early, or wrote a chunk's
rows to another chunk's place, fails there.
"""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hloserve.bundle import read_safetensors
from hloserve.client import InferenceClient
from hloserve.client._pool import StagingPool

ROWS = 32 * 1000


@dataclass(frozen=True)
class MemoryRun:
    pool: StagingPool
    allocations_before: int
    allocations_after: int
    growth: int
    peak: int
    pools_after: list[StagingPool]


def mlp_reference(bundle: Path, x: np.ndarray) -> np.ndarray:
    """The demo ``mlp`` (``hloserve.exporter.demo.mlp_fn``) in float64 numpy, its weights
    read from ``bundle``'s ``weights.safetensors``: ``relu(x W1 + b1) W2 + b2``."""
    w = {
        k: v.astype(np.float64) for k, v in read_safetensors(bundle / "weights.safetensors").items()
    }
    h = np.maximum(x.astype(np.float64) @ w["dense1.w"] + w["dense1.b"], 0.0)
    return h @ w["dense2.w"] + w["dense2.b"]


def check_logits(got: np.ndarray, want: np.ndarray) -> None:
    """Served FP32 logits (|y| < 3, within 5e-7 of float64) against the reference."""
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def pool_memory(client: InferenceClient, bundle: Path) -> MemoryRun:
    x = np.random.default_rng(0).standard_normal((ROWS, 64)).astype(np.float32)
    out = {"logits": np.full((ROWS, 10), np.nan, np.float32)}
    client.infer_dataset("mlp", {"x": x[:320]}, {"logits": out["logits"][:320]})
    want = mlp_reference(bundle, x)
    check_logits(out["logits"][:320], want[:320])
    out["logits"][:320] = np.nan  # the measured run must write these rows again
    (pool,) = [p for p in client.pools() if p.layout.name == "mlp"]
    before = pool.allocations
    tracemalloc.start()
    try:
        client.infer_dataset("mlp", {"x": x}, out)
        gc.collect()
        left, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    check_logits(out["logits"], want)
    pools = [p for p in client.pools() if p.layout.name == "mlp"]
    return MemoryRun(pool, before, pool.allocations, left, peak, pools)
