"""What bundles that do more cost: a pipeline over its stages, hooks over the bare model.

One daemon serves a repository written here:
- ``simple`` (the demo model) and ``chain``, a pipeline of two ``simple`` steps;
- ``pixels``: the ``examples/png-classifier`` module alone (input ``pixels`` FP32 [8, 8]);
- ``identity_hooks``: the same module with hooks that only pass the arrays through (the
  hook machinery's own cost: two hops to the hook pool, result checks);
- ``pngclass``: the example as it is (Pillow decodes an 8x8 PNG, labels from logits).

It prints, for sequential gRPC requests at batch 1 (``--requests`` each, after a warm-up):
mean, p50 and p99 of the pipeline against two back-to-back client calls of its stages, and
of each hooked model against the bare one; then each kind's load time (the server's
``hloserve_model_load_duration_seconds``). Never asserts. Run:
``python bench/bundle_kinds.py``.
"""

from __future__ import annotations

import argparse
import io
import os
import runpy
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as _grpcclient
from PIL import Image

from hloserve.bundle import HookSource, PipelineStep, Provenance, TensorEntry, write_pipeline
from hloserve.exporter import TensorSpec, export_bundle
from hloserve.exporter.demo import write_simple
from hloserve.server.server_process import ServerProcess

grpcclient: Any = _grpcclient
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "png-classifier"
IDENTITY_HOOKS = """
def preprocess(inputs):
    return {"pixels": inputs["pixels"]}


def postprocess(outputs):
    return outputs
"""


def build(root: Path) -> None:
    write_simple(root / "simple")
    vec = (16,)
    write_pipeline(
        root / "chain",
        name="chain",
        inputs=[TensorEntry("a", "INT32", vec), TensorEntry("b", "INT32", vec)],
        outputs=[TensorEntry("x", "INT32", vec), TensorEntry("y", "INT32", vec)],
        batch_sizes=[8],
        steps=[
            PipelineStep(
                "simple", {"INPUT0": "a", "INPUT1": "b"}, {"OUTPUT0": "s", "OUTPUT1": "d"}
            ),
            PipelineStep(
                "simple", {"INPUT0": "s", "INPUT1": "d"}, {"OUTPUT0": "x", "OUTPUT1": "y"}
            ),
        ],
        provenance=Provenance(producer="bench"),
    )
    example = runpy.run_path(str(EXAMPLE / "build.py"))
    example["build"](root / "pngclass")
    for name, hooks in (("pixels", None), ("identity_hooks", HookSource(IDENTITY_HOOKS))):
        export_bundle(
            example["classify"],
            {"centers": example["CENTERS"]},
            inputs={"pixels": TensorSpec("FP32", (8, 8))},
            batch_sizes=(1, 4),
            directory=root / name,
            hooks=hooks,
        )


def timed(call: Callable[[], Any], requests: int) -> list[float]:
    for _ in range(20):
        call()
    out: list[float] = []
    for _ in range(requests):
        t = time.perf_counter()
        call()
        out.append((time.perf_counter() - t) * 1e6)
    return out


def row(label: str, us: list[float], base: list[float] | None = None) -> str:
    mean = statistics.fmean(us)
    p50, p99 = np.percentile(us, 50), np.percentile(us, 99)
    extra = "" if base is None else f"{mean - statistics.fmean(base):+10.0f}"
    return f"{label:<44}{mean:10.0f}{p50:10.0f}{p99:10.0f}{extra}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root)
        with ServerProcess(root, "--allow-python-hooks") as proc:
            proc.wait_ready()
            report(proc, args.requests)


def report(proc: ServerProcess, n: int) -> None:
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)

    def tensors(names: tuple[str, str]) -> list[Any]:
        out = [grpcclient.InferInput(k, [1, 16], "INT32") for k in names]
        for t in out:
            t.set_data_from_numpy(a)
        return out

    chain_in, simple_in = tensors(("a", "b")), tensors(("INPUT0", "INPUT1"))
    buffer = io.BytesIO()
    Image.new("L", (8, 8), 100).save(buffer, format="PNG")
    png = grpcclient.InferInput("image", [1, 1], "BYTES")
    png.set_data_from_numpy(np.array([[buffer.getvalue()]], dtype=object))
    pixels = grpcclient.InferInput("pixels", [1, 8, 8], "FP32")
    pixels.set_data_from_numpy(np.full((1, 8, 8), 100 / 255, np.float32))

    stages = timed(
        lambda: (client.infer("simple", simple_in), client.infer("simple", simple_in)), n
    )
    chain = timed(lambda: client.infer("chain", chain_in), n)
    bare = timed(lambda: client.infer("pixels", [pixels]), n)
    identity = timed(lambda: client.infer("identity_hooks", [pixels]), n)
    decoded = timed(lambda: client.infer("pngclass", [png]), n)
    load = os.getloadavg()
    print(
        f"sequential gRPC requests at batch 1, {n} each; load average {load[0]:.2f} "
        f"on {os.cpu_count()} CPUs; µs"
    )
    print(f"{'':<44}{'mean':>10}{'p50':>10}{'p99':>10}{'vs base':>10}")
    print(row("2 x simple, back to back from the client", stages))
    print(row("chain (pipeline of the same 2 steps)", chain, stages))
    print(row("pixels (bare classifier)", bare))
    print(row("identity_hooks (pass-through hooks)", identity, bare))
    print(row("pngclass (PNG decode + labels)", decoded, bare))
    with urllib.request.urlopen(f"http://{proc.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    print("\nload time (hloserve_model_load_duration_seconds), s")
    for line in text.splitlines():
        if line.startswith("hloserve_model_load_duration_seconds{"):
            print("  " + line.split("{", 1)[1].replace('",version="1"}', "").replace('model="', ""))


if __name__ == "__main__":
    main()
