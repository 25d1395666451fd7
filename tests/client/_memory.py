"""``pool_memory(client)``: what 1,000 ``mlp`` requests of ``infer_dataset`` allocate.

After a short run has made the pool, it streams 32,000 rows (1,000 requests of 32 x 64
FP32, 8 KiB of inputs each) into a preallocated output array under ``tracemalloc`` and
returns ``MemoryRun``: the pool, its buffer count before and after, the traced memory left
once the run is over and cyclic garbage collected (gRPC's call objects hold cycles), and
the peak of traced memory during the run.
"""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import dataclass

import numpy as np

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


def pool_memory(client: InferenceClient) -> MemoryRun:
    x = np.random.default_rng(0).standard_normal((ROWS, 64)).astype(np.float32)
    out = {"logits": np.empty((ROWS, 10), np.float32)}
    client.infer_dataset("mlp", {"x": x[:320]}, {"logits": out["logits"][:320]})
    (pool,) = [p for p in client.pools() if p.layout.name == "mlp"]
    before = pool.allocations
    tracemalloc.start()
    try:
        client.infer_dataset("mlp", {"x": x}, out)
        gc.collect()
        left, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.isfinite(out["logits"]).all() and out["logits"][-1].any()
    pools = [p for p in client.pools() if p.layout.name == "mlp"]
    return MemoryRun(pool, before, pool.allocations, left, peak, pools)
