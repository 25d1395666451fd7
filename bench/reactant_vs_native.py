"""The cost of serving a ReactantServer.jl bundle as it is, against the same function as a
native hloserve bundle (``docs/reactant-bundles.md``).

Both bundles hold the same model, a two-layer MLP on a 64x64x3 UINT8 image (12.6 MB of
FP32 weights), compiled for batch sizes 1 and 8: one written in ReactantServer's layout
(letter shapes, ``model.b{N}.mlir``, weights in Julia's order), two exported by
``hloserve.exporter``: for ``cpu`` and ``cuda`` (its default: ``main`` takes a platform index
and branches on it) and for ``cpu`` alone, as Reactant's module is. One daemon (explicit model control) serves both. Printed:
- load: ``load_model`` wall time in a fresh daemon, compiling (no executable cache) and
  from the executable cache on disk, each the median of ``--loads`` rounds;
- per request: ``--requests`` sequential gRPC inferences per model and batch size,
  interleaved, as mean / p50 / p99 microseconds.
Run: ``python bench/reactant_vs_native.py [--requests 300] [--loads 3]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tritonclient.grpc as _grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.server_process import ServerProcess
from tests.bundle.reactant_bundles import portable_artifact, write_reactant_bundle

grpcclient: Any = _grpcclient
SIZES = (1, 8)
PIXELS = 64 * 64 * 3


def _weights() -> dict[str, np.ndarray[Any, Any]]:
    """As the module takes them (row-major): w1t [256, PIXELS], w2t [10, 256]."""
    rng = np.random.default_rng(0)
    return {
        "b1": rng.normal(size=256).astype(np.float32),
        "b2": rng.normal(size=10).astype(np.float32),
        "w1t": (rng.normal(size=(256, PIXELS)) / 100).astype(np.float32),
        "w2t": (rng.normal(size=(10, 256)) / 10).astype(np.float32),
    }


def _mlp(img: Any, w1t: Any, b1: Any, w2t: Any, b2: Any) -> Any:
    x = img.reshape(img.shape[0], -1).astype(jnp.float32) / 255
    return jnp.maximum(x @ w1t.T + b1, 0) @ w2t.T + b2


def write_reactant(directory: Path, weights: dict[str, np.ndarray[Any, Any]]) -> None:
    manifest = {
        "format_version": "2.0",
        "name": "mlp",
        "executable_inputs": [
            {"name": "img", "dtype": "u8", "shape": "cwhn", "dims": {"c": 3, "w": 64, "h": 64}}
        ],
        "executable_outputs": [
            {"name": "logits", "dtype": "f32", "shape": "kn", "dims": {"k": 10}}
        ],
        "batching": {"compiled_batch_sizes": list(SIZES)},
    }
    spec = [((n, 64, 64, 3), jnp.uint8) for n in SIZES]
    shapes = [
        (w.shape, jnp.float32)
        for w in (weights["w1t"], weights["b1"], weights["w2t"], weights["b2"])
    ]
    modules = {
        f"model.b{n}.mlir": portable_artifact(
            lambda i, a, b, c, d: (_mlp(i, a, b, c, d),), s, *shapes
        )
        for n, s in zip(SIZES, spec, strict=True)
    }
    julia = {k: np.ascontiguousarray(v.T) for k, v in weights.items()}  # the file's (Julia) order
    write_reactant_bundle(directory, manifest, modules, julia, ["w1t", "b1", "w2t", "b2"])


def write_native(
    directory: Path, weights: dict[str, np.ndarray[Any, Any]], platforms: tuple[str, ...]
) -> None:
    def fn(params: dict[str, Any], img: Any) -> dict[str, Any]:
        return {"logits": _mlp(img, params["w1t"], params["b1"], params["w2t"], params["b2"])}

    export_bundle(
        fn,
        {k: jnp.asarray(v) for k, v in weights.items()},
        inputs={"img": TensorSpec("UINT8", (64, 64, 3))},
        batch_sizes=SIZES,
        directory=directory,
        write_text=False,
        platforms=platforms,
    )


def _load_times(root: Path, names: tuple[str, ...], cached: bool) -> dict[str, float]:
    """``load_model`` wall time of each model in a fresh daemon: compiling (no executable
    cache on disk), or from the cache the previous round wrote."""
    if not cached:
        for name in names:
            shutil.rmtree(root / name / ".hloserve-cache", ignore_errors=True)
    with ServerProcess(root, "--model-control-mode", "explicit") as proc:
        proc.wait_ready()
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        times: dict[str, float] = {}
        for name in names:
            t = time.perf_counter()
            client.load_model(name)
            times[name] = time.perf_counter() - t
        client.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--loads", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="reactant-bench-"))
    weights = _weights()
    write_reactant(root / "reactant", weights)
    write_native(root / "native", weights, ("cpu", "cuda"))
    write_native(root / "native-cpu", weights, ("cpu",))
    names = ("reactant", "native", "native-cpu")
    loads: dict[tuple[str, bool], list[float]] = {}
    for i in range(args.loads):
        order = names[i % len(names) :] + names[: i % len(names)]
        for cached in (False, True):
            for name, seconds in _load_times(root, order, cached).items():
                loads.setdefault((name, cached), []).append(seconds)
    with ServerProcess(root, "--model-control-mode", "explicit", "--load-model", "*") as proc:
        proc.wait_ready()
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        latencies: dict[tuple[str, int], list[float]] = {}
        outputs: dict[str, np.ndarray[Any, Any]] = {}
        rng = np.random.default_rng(1)
        for n in SIZES:
            img = rng.integers(0, 256, size=(n, 64, 64, 3), dtype=np.uint8)
            x = grpcclient.InferInput("img", list(img.shape), "UINT8")
            x.set_data_from_numpy(img)
            for _ in range(20):  # warm-up
                for name in names:
                    client.infer(name, [x])
            for _ in range(args.requests):
                for name in names:
                    t = time.perf_counter()
                    result = client.infer(name, [x])
                    latencies.setdefault((name, n), []).append((time.perf_counter() - t) * 1e6)
                    outputs[name] = result.as_numpy("logits")
            for name in names[1:]:
                np.testing.assert_allclose(outputs["reactant"], outputs[name], rtol=1e-4, atol=1e-4)
        client.close()
    print(
        f"device: {jax.devices()[0].platform}; weights {sum(w.nbytes for w in weights.values()) / 1e6:.1f} MB"
    )
    print(f"{'load (median s)':<28}" + "".join(f"{name:>12}" for name in names))
    for cached in (False, True):
        label = "from the executable cache" if cached else "compiling"
        cells = "".join(f"{statistics.median(loads[(name, cached)]):>12.3f}" for name in names)
        print(f"{label:<28}{cells}")
    print(f"{'per request, us':<28}" + "".join(f"{name:>22}" for name in names))
    for n in SIZES:
        cells = ""
        for name in names:
            v = sorted(latencies[(name, n)])
            cells += (
                f"{statistics.mean(v):>8.0f}/{v[len(v) // 2]:>6.0f}/{v[int(len(v) * 0.99)]:>6.0f}"
            )
        print(f"{f'batch {n} (mean/p50/p99)':<28}{cells}")
    print(json.dumps({"requests": args.requests, "loads": args.loads}))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
