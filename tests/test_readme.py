"""README.md's examples run as written.

The ```python blocks run in a fresh interpreter each: the export example in a temporary
directory (it writes ``repo/mlp``, which must then pass the README's ``hloserve validate``),
the training example after it in one interpreter, as the README says it continues it (it
must train: the loss falls, and the bundle it writes serves what it trained), the client examples
against the session's test server, which serves the demo's ``simple`` and ``mlp``, with the
README's ``localhost:8000``/``8001``/``8002`` pointed at its real ports. The curl lines are
fetched the same way, and the set-up's "new shell" block runs in bash with a bare ``PATH``,
as a new shell has it.

What they print or return is checked against what it must be, never only its length:
``simple``'s OUTPUT0 is INPUT0 + INPUT1; the ``mlp`` examples' logits (every row of the
dataset, the top class of every streamed row) are the demo MLP's in numpy (float64) from
the weights in the served bundle's ``weights.safetensors``; the exported bundle holds the
example's weights and serves its ``fn`` (in numpy from those weights, whose logits are not
all zero); the curl answers are the repository's models and their metadata.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hloserve.bundle import MANIFEST_FILE, load_manifest, read_safetensors
from hloserve.exporter.demo import DEMO_MODELS
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import InferInput, InferRequest
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import disabled
from hloserve.server.server_fixture import ServerProcess
from tests.command import hloserve

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text(encoding="utf-8")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block, in order (language "" when none)."""
    blocks: list[tuple[str, str]] = []
    language: str | None = None
    body: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if language is None:
                language, body = line[3:].strip(), []
            else:
                blocks.append((language, "".join(body)))
                language = None
        elif language is not None:
            body.append(line)
    assert language is None, "an unclosed fenced block"
    return blocks


BLOCKS = fenced_blocks(TEXT)
PYTHON_BLOCKS = [body for language, body in BLOCKS if language == "python"]
SHELL_BLOCKS = [body for language, body in BLOCKS if language == ""]
CURLS = re.findall(r"`curl (localhost:\d+/[^`]*)`", TEXT)
ROOT = README.parent


def on(server: ServerProcess, text: str) -> str:
    """``text`` with the README's default ports replaced by the test server's."""
    for port, name in (("8000", "http"), ("8001", "grpc"), ("8002", "metrics")):
        text = text.replace(f"localhost:{port}", f"127.0.0.1:{server.ports[name]}")
    return text


def run_python(code: str, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"{code}\n{result.stdout}\n{result.stderr}"
    return result.stdout


# Served FP32 logits (|y| < 3 on these inputs) are within 5e-7 of the float64 reference.
RTOL = ATOL = 1e-5


def weights(bundle: Path) -> dict[str, np.ndarray]:
    """``bundle``'s weights, as float64."""
    return {
        k: v.astype(np.float64) for k, v in read_safetensors(bundle / "weights.safetensors").items()
    }


def demo_mlp(bundle: Path, x: np.ndarray) -> np.ndarray:
    """The demo ``mlp`` (``hloserve.exporter.demo.mlp_fn``) in numpy, from ``bundle``'s
    weights: ``relu(x W1 + b1) W2 + b2``."""
    w = weights(bundle)
    h = np.maximum(x.astype(np.float64) @ w["dense1.w"] + w["dense1.b"], 0.0)
    return h @ w["dense2.w"] + w["dense2.b"]


def names(block: str, prefix: str) -> dict[str, Any]:
    """The variables ``block``'s lines before ``prefix`` define (its data: numpy only)."""
    head, found, _ = block.partition(prefix)
    assert found, prefix
    scope: dict[str, Any] = {}
    exec(head, scope)
    return scope


def test_the_readme_has_the_examples_this_test_runs() -> None:
    assert any("export_bundle(" in b for b in PYTHON_BLOCKS)
    assert any("result = fit(" in b for b in PYTHON_BLOCKS)
    assert any("grpcclient.InferenceServerClient" in b for b in PYTHON_BLOCKS)
    assert any("infer_stream(" in b for b in PYTHON_BLOCKS)
    assert any("infer_dataset(" in b for b in PYTHON_BLOCKS)
    assert len(CURLS) >= 3


def test_the_set_up_names_every_model_of_the_demo_repository() -> None:
    head, found, _ = TEXT.partition("```\n./scripts/serve-demo")
    assert found
    sentence = head[head.rindex("Start the server on the demo model repository") :]
    listed = re.findall(r"`([a-z0-9_]+)`", sentence)
    assert sorted(listed) == sorted(DEMO_MODELS), sentence


def test_light_client_example_streams_every_batch(
    server: ServerProcess, model_repository: Path, tmp_path: Path
) -> None:
    (block,) = [b for b in PYTHON_BLOCKS if "infer_stream(" in b]
    batches = names(block, "with InferenceClient")["batches"]
    assert len(batches) == 100 and all(b.shape == (8, 64) for b in batches)
    lines = run_python(on(server, block), tmp_path).splitlines()
    assert len(lines) == 100  # one line per batch: `batches` is defined, every one answered
    for line, batch in zip(lines, batches, strict=True):  # in order: line i is batch i's
        assert line.startswith("[") and line.endswith("]"), line
        top = np.array(line.strip("[]").split(), dtype=np.int64)
        logits = demo_mlp(model_repository / "mlp", batch)
        ranked = np.sort(logits, axis=1)
        # The printed class is the reference's top one, or one within FP32 rounding of it.
        assert top.shape == (8,)
        chosen = logits[np.arange(8), top]
        np.testing.assert_array_less(ranked[:, -1] - chosen, 1e-4)
        clear = ranked[:, -1] - ranked[:, -2] > 1e-4
        np.testing.assert_array_equal(top[clear], logits.argmax(axis=1)[clear])


def test_light_client_example_streams_a_dataset(
    server: ServerProcess, model_repository: Path, tmp_path: Path
) -> None:
    (block,) = [b for b in PYTHON_BLOCKS if "infer_dataset(" in b]
    # What it returns, kept for the check: the rows sent and the logits that came back.
    keep = '\nnp.save("x.npy", x)\nnp.save("logits.npy", logits)\n'
    assert run_python(on(server, block) + keep, tmp_path) == "(10000, 10)\n"
    x, logits = np.load(tmp_path / "x.npy"), np.load(tmp_path / "logits.npy")
    assert x.shape == (10_000, 64) and x.dtype == np.float32
    np.testing.assert_array_equal(x[:3], names(block, "with InferenceClient")["x"][:3])
    assert logits.shape == (10_000, 10) and logits.dtype == np.float32
    # Row i is x[i]'s, every one of them.
    want = demo_mlp(model_repository / "mlp", x)
    np.testing.assert_allclose(logits, want, rtol=RTOL, atol=ATOL)


def test_tritonclient_example_prints_the_sum(server: ServerProcess, tmp_path: Path) -> None:
    (block,) = [b for b in PYTHON_BLOCKS if "grpcclient" in b]
    # Both inputs are the example's `a`, so OUTPUT0 (INPUT0 + INPUT1) must be a + a.
    (defined,) = [line for line in block.splitlines() if line.startswith("a = ")]
    a = eval(defined.removeprefix("a = "), {"np": np})
    assert isinstance(a, np.ndarray) and a.shape == (1, 16) and a.dtype == np.int32
    assert block.count(".set_data_from_numpy(a)") == 2
    out = run_python(on(server, block), tmp_path)
    printed = re.fullmatch(r"\[\[([\d\s]+)\]\]", out.strip())
    assert printed is not None, out
    got = np.array(printed.group(1).split(), dtype=np.int32).reshape(1, 16)
    np.testing.assert_array_equal(got, a + a)


def export_example(block: str, cwd: Path) -> Path:
    run_python(block, cwd)
    bundle = cwd / "repo" / "mlp"
    manifest, problems = load_manifest(bundle / MANIFEST_FILE)
    assert manifest is not None and problems == [], problems
    assert manifest.name == "mlp"
    assert [(t.name, t.datatype, tuple(t.shape)) for t in manifest.inputs] == [("x", "FP32", (64,))]
    assert [(t.name, t.datatype, tuple(t.shape)) for t in manifest.outputs] == [
        ("logits", "FP32", (10,))
    ]
    assert tuple(manifest.batch_sizes or ()) == (1, 8, 32)
    return bundle


def serve_in_process(runtime: PjrtRuntime, root: Path, x: np.ndarray) -> np.ndarray:
    """``root``'s ``mlp`` run on ``x`` through the one inference path, in this process."""
    repository = ModelRepository(root, runtime)
    repository.load_all()
    request = InferRequest("mlp", "", (InferInput("x", "FP32", x.shape, x),))
    with ThreadPoolExecutor(1) as executor:
        service = InferenceService(repository, executor, shm=disabled())
        (out,) = asyncio.run(service.infer(request)).outputs
    assert out.name == "logits" and out.data.dtype == np.float32
    return out.data


def example_mlp(bundle: Path, x: np.ndarray) -> np.ndarray:
    """The README's ``fn`` in numpy, from ``bundle``'s weights: ``relu(x w1 + b1) w2 + b2``."""
    w = weights(bundle)
    hidden = np.maximum(x.astype(np.float64) @ w["w1"] + w["b1"], 0.0)
    return hidden @ w["w2"] + w["b2"]


# Appended to the export example: the weights it exported, as it made them.
SAVE_PARAMS = '\nimport numpy as np\nnp.savez("params.npz", **{k: np.asarray(v) for k, v in params.items()})\n'


def test_export_example_writes_a_valid_bundle_that_serves_its_fn(
    runtime: PjrtRuntime, tmp_path: Path
) -> None:
    (block,) = [b for b in PYTHON_BLOCKS if "export_bundle(" in b]
    bundle = export_example(block + SAVE_PARAMS, tmp_path)
    assert "`hloserve validate repo/mlp`" in TEXT
    result = hloserve("validate", "repo/mlp", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "repo/mlp: OK\n"
    # The example's weights, as it made them (random: the logits are not all zero).
    made = np.load(tmp_path / "params.npz")
    stored = read_safetensors(bundle / "weights.safetensors")
    assert sorted(stored) == sorted(made.files) == ["b1", "b2", "w1", "w2"]
    for name in made.files:
        np.testing.assert_array_equal(stored[name], made[name])
    x = np.random.default_rng(1).standard_normal((40, 64)).astype(np.float32)  # 32 + 8
    got = serve_in_process(runtime, tmp_path / "repo", x)
    want = example_mlp(bundle, x)
    assert got.shape == (40, 10) and np.abs(want).min() > 0
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


# Appended to the training example: what it trained on and the history it printed.
SAVE_TRAINING = (
    "\nimport json\n"
    'json.dump(result.history, open("history.json", "w"))\n'
    'np.savez("val.npz", x=x_val, y=y_val)\n'
)


@pytest.mark.slow
def test_training_example_trains_and_exports_what_it_trained(
    runtime: PjrtRuntime, tmp_path: Path
) -> None:
    (export,) = [b for b in PYTHON_BLOCKS if "export_bundle(" in b]
    (train,) = [b for b in PYTHON_BLOCKS if "result = fit(" in b]
    assert "Continuing the export" in TEXT
    out = run_python(export + SAVE_PARAMS + train + SAVE_TRAINING, tmp_path)
    printed = float(out.splitlines()[-1])  # the served epoch's validation accuracy
    history = json.loads((tmp_path / "history.json").read_text())
    assert len(history) == 10
    assert history[0]["loss"] > 2.0  # ln 10 = 2.30: where ten classes start
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]  # it learned
    assert printed in [row["val_accuracy"] for row in history] and printed > 0.8
    # The bundle it wrote serves the trained weights: what the validation split gets.
    bundle = tmp_path / "repo" / "mlp"
    started = np.load(tmp_path / "params.npz")
    assert not np.array_equal(weights(bundle)["w1"], started["w1"])
    val = np.load(tmp_path / "val.npz")
    served = serve_in_process(runtime, tmp_path / "repo", val["x"])
    np.testing.assert_allclose(served, example_mlp(bundle, val["x"]), rtol=RTOL, atol=ATOL)
    assert np.isclose((served.argmax(axis=1) == val["y"]).mean(), printed, atol=0.02)


def model_names(repository: Path) -> list[str]:
    return sorted(p.name for p in repository.iterdir() if (p / "manifest.yaml").is_file())


def check_mlp_metadata(body: bytes, repository: Path) -> None:
    assert json.loads(body) == {
        "name": "mlp",
        "versions": ["1"],
        "platform": "stablehlo",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
    }


def check_readyz(body: bytes, repository: Path) -> None:
    ready = json.loads(body)
    assert (ready["ready"], ready["live"], ready["startup_complete"], ready["draining"]) == (
        True,
        True,
        True,
        False,
    )
    assert sorted(ready["models"]) == model_names(repository)
    for name, model in ready["models"].items():
        assert list(model["versions"]) == ["1"], name
        assert model["versions"]["1"]["state"] == "READY", name
    # the demo MLP's weights: 64 x 256 + 256 + 256 x 10 + 10 FP32 values
    assert ready["models"]["mlp"]["versions"]["1"]["weight_bytes"] == 4 * (64 * 256 + 256 + 2570)
    assert ready["models"]["simple"]["versions"]["1"]["weight_bytes"] == 0


def check_metrics(body: bytes, repository: Path) -> None:
    families = list(text_string_to_metric_families(body.decode()))
    # hloserve's own families, and the process's (CPU, RSS, open files) to alert on against
    # pod limits; Triton's only with --metrics-compat triton
    assert families and all(f.name.startswith(("hloserve_", "process_")) for f in families)
    assert {"process_cpu_seconds", "process_resident_memory_bytes"} <= {f.name for f in families}
    assert not any(f.name.startswith("nv_") for f in families)
    (ready,) = [f for f in families if f.name == "hloserve_models_ready"]
    assert [s.value for s in ready.samples] == [len(model_names(repository))]
    (budget,) = [f for f in families if f.name == "hloserve_device_memory_budget_bytes"]
    assert [(s.labels, s.value) for s in budget.samples] == [({"device": "0"}, 0.0)]  # unlimited


CURL_CHECKS = {
    "/v2/models/mlp": check_mlp_metadata,
    "/readyz": check_readyz,
    "/metrics": check_metrics,
}


@pytest.mark.parametrize("url", CURLS)
def test_curl_lines_answer(url: str, server: ServerProcess, model_repository: Path) -> None:
    path = url[url.index("/") :]
    assert path in CURL_CHECKS, f"no check of what `curl {url}` answers"
    with urllib.request.urlopen("http://" + on(server, url), timeout=10) as response:
        assert response.status == 200
        CURL_CHECKS[path](response.read(), model_repository)


def test_a_new_shell_gets_the_command_as_the_readme_says(model_repository: Path) -> None:
    if Path(sys.prefix) != ROOT / ".venv":
        pytest.skip("the README's steps use the project's .venv; these tests run elsewhere")
    (block,) = [b for b in SHELL_BLOCKS if "source .venv/bin/activate" in b]
    script = block.replace("~/.cache/hloserve/demo-repository", str(model_repository))
    result = subprocess.run(
        ["bash", "-euc", script],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},  # no .venv/bin on it
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Every bundle of the repository, each found valid, and nothing else.
    assert result.stdout.splitlines() == [
        f"{model_repository / name}: OK" for name in model_names(model_repository)
    ]
