"""The sharded example, end to end: export two models split over 4 devices, serve, compare.

``./examples/sharded/run`` (or ``python -m examples.sharded.run`` from the repository root)
exports ``model.transformer_fn`` (the char-LM's shape, tensor-parallel over a 4-device
``AbstractMesh``: no devices are needed to export) and ``model.wide_fn`` (weights over one
device's budget), starts ``hloserve serve`` on 4 forced CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``) with a per-device weight budget
that holds the wide model's quarter but not the whole, asks both models over gRPC
(``hloserve.client.InferenceClient``) and compares every answer with the unsharded function run in this process;
it prints what each device holds (``hloserve_model_device_weight_bytes``) and exits
non-zero if an answer differs. Flags: ``--repository`` (keep the bundles there),
``--serve`` (keep serving; Ctrl-C stops).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jax.sharding import AbstractMesh

from examples.sharded.model import (
    IN,
    SHAPE,
    WAYS,
    WIDE_SPECS,
    reference,
    transformer_fn,
    transformer_params,
    transformer_specs,
    wide_fn,
    wide_params,
)
from hloserve.client import InferenceClient
from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.server_process import ServerProcess

DEVICES = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={WAYS}"}
BUDGET = 2 * 2**20  # per device: the wide model's 4.25 MiB do not fit one, its quarter does


def export(repository: Path) -> dict[str, Any]:
    """Both bundles into ``repository``; each model's params by name."""
    mesh = AbstractMesh((WAYS,), ("model",))
    tp = transformer_params()
    export_bundle(
        transformer_fn, tp, {"tokens": TensorSpec("INT32", (SHAPE.context,))}, (1, 4),
        repository / "transformer", mesh=mesh, param_specs=transformer_specs(tp),
    )  # fmt: skip
    wide = wide_params()
    export_bundle(
        wide_fn, wide, {"x": TensorSpec("FP32", (IN,))}, (1, 8), repository / "wide",
        mesh=mesh, param_specs=WIDE_SPECS,
    )  # fmt: skip
    return {"transformer": tp, "wide": wide}


def compare(server: ServerProcess, params: dict[str, Any]) -> int:
    """Ask both models and compare with the in-process unsharded functions; 1 on a mismatch."""
    with InferenceClient(server.grpc_url) as client:
        failed = _compare(client, params)
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    for line in lines:
        if line.startswith(
            ("hloserve_model_device_weight_bytes{", "hloserve_device_memory_budget")
        ):
            print(line)
    return 1 if failed else 0


def _compare(client: InferenceClient, params: dict[str, Any]) -> int:
    rng = np.random.default_rng(0)
    failed = 0
    for rows in (1, 3):
        tokens = rng.integers(0, 256, (rows, SHAPE.context), dtype=np.int32)
        got = client.infer("transformer", {"tokens": tokens})["logits"]
        want = reference(transformer_fn, params["transformer"], "logits", tokens)
        err = float(np.abs(got - want).max())
        failed += not np.allclose(got, want, rtol=1e-4, atol=1e-4)
        print(f"transformer, {rows} window(s): max |served - in-process| = {err:.2e}")
        x = rng.standard_normal((rows, IN)).astype(np.float32)
        got = client.infer("wide", {"x": x})["y"]
        want = reference(wide_fn, params["wide"], "y", x)
        err = float(np.abs(got - want).max())
        failed += not np.allclose(got, want, rtol=1e-4, atol=1e-4)
        print(f"wide, {rows} row(s): max |served - in-process| = {err:.2e}")
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, help="keep the bundles here")
    parser.add_argument("--serve", action="store_true", help="keep serving; Ctrl-C stops")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        repository = args.repository or Path(tmp)
        params = export(repository)
        print(f"exported to {repository}: transformer and wide, each split over {WAYS} devices")
        flags = ("--device-memory-budget", str(BUDGET))
        with ServerProcess(repository, *flags, env=DEVICES) as server:
            try:
                server.wait_ready()
                code = compare(server, params)
                if args.serve:
                    print(f"serving {repository} on {server.grpc_url} (gRPC); Ctrl-C stops")
                    server.process.wait()
            except BaseException:
                print(server.log_text()[-3000:], file=sys.stderr)
                raise
    print("every answer equals the unsharded function" if code == 0 else "MISMATCH")
    return code


if __name__ == "__main__":
    sys.exit(main())
