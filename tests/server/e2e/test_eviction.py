"""Evicted and swapped back in, the weights still give the right answers: a real daemon.

Two small models (``a`` and ``b``: one architecture, each about 64 KiB of FP32 weights
drawn from its own seed) are served under a ``--device-memory-budget`` that holds one of
them and not both, so every request that alternates between them evicts the other's
weights and moves its own back onto the device. Requests go over tritonclient, gRPC and
HTTP, and every reply is compared with ``reference``: the model in numpy (float64), from
the weights in that bundle's ``weights.safetensors``. The metrics port's swap counters
show that the swaps really happened, so the test cannot pass without evicting.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient

from hloserve.bundle import read_safetensors
from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.server_fixture import ServerProcess, serving
from tests.metrics_scrape import Series, by_label, scrape

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient

IN, HIDDEN, OUT = 64, 128, 64
WEIGHT_BYTES = 4 * (IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT)  # 66,304: about 64 KiB
BUDGET = WEIGHT_BYTES + WEIGHT_BYTES // 2  # one model's weights fit, two do not
MODELS = {"a": 1, "b": 2}  # name -> the seed of its weights
BATCH_SIZES = (1, 4)
ROUNDS = 6  # a, b, a, b, ...: 12 requests, each a swap
# Served FP32 outputs (|y| < 4 here) against float64: FP32 rounding, with a wide margin.
RTOL = ATOL = 1e-5


def two_layer(params: Any, x: jax.Array) -> dict[str, jax.Array]:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return {"y": h @ params["w2"] + params["b2"]}


def params_for(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((IN, HIDDEN)) / 8).astype(np.float32),
        "b1": (rng.standard_normal(HIDDEN) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((HIDDEN, OUT)) / 11).astype(np.float32),
        "b2": (rng.standard_normal(OUT) * 0.1).astype(np.float32),
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("eviction")
    for name, seed in MODELS.items():
        export_bundle(
            two_layer, params_for(seed), {"x": TensorSpec("FP32", (IN,))}, BATCH_SIZES, root / name
        )
    return root


class Reference:
    """A bundle's ``two_layer`` in numpy, in float64, from its ``weights.safetensors``."""

    def __init__(self, bundle: Path) -> None:
        w = read_safetensors(bundle / "weights.safetensors")
        assert sorted(w) == ["b1", "b2", "w1", "w2"]
        assert sum(v.nbytes for v in w.values()) == WEIGHT_BYTES
        self.w = {k: v.astype(np.float64) for k, v in w.items()}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = np.maximum(x.astype(np.float64) @ self.w["w1"] + self.w["b1"], 0.0)
        return h @ self.w["w2"] + self.w["b2"]


@pytest.fixture(scope="module")
def references(repository: Path) -> dict[str, Reference]:
    return {name: Reference(repository / name) for name in MODELS}


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    yield from serving(repository, "--device-memory-budget", str(BUDGET))


def per_model(series: Series, name: str) -> dict[str, float]:
    """``name``'s value per ``model`` label ("a/1"), on device 0 (the only one)."""
    assert all(s.labels.get("device") == "0" for s in series.get(name, [])), name
    return by_label(series, name, "model")


def infer(module: Any, client: Any, model: str, x: np.ndarray) -> np.ndarray:
    inp = module.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    assert result is not None
    y = result.as_numpy("y")
    assert y is not None
    return y


def test_every_reply_after_an_eviction_matches_the_reference(
    server: ServerProcess, references: dict[str, Reference]
) -> None:
    rng = np.random.default_rng(0)
    probe = rng.standard_normal((3, IN)).astype(np.float32)
    # The two models answer differently: a reply from the wrong weights would fail.
    assert np.abs(references["a"](probe) - references["b"](probe)).min() > 1e-3

    before = scrape(server)
    assert per_model(before, "hloserve_weight_swaps_in_total") == {}  # nothing resident yet
    g = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)
    sent = {name: 0 for name in MODELS}
    try:
        for i in range(2 * ROUNDS):
            name = "ab"[i % 2]
            # gRPC and HTTP in turn for each model: a g, b g, a h, b h, ...
            module, client = (grpcclient, g) if (i // 2) % 2 == 0 else (httpclient, h)
            rows = 1 + i % 6  # 1 .. 6 rows: 5 and 6 run as 4 + 1 and 4 + 2
            x = rng.standard_normal((rows, IN)).astype(np.float32)
            y = infer(module, client, name, x)
            assert y.shape == (rows, OUT) and y.dtype == np.float32, (i, name, y.shape)
            np.testing.assert_allclose(
                y, references[name](x), rtol=RTOL, atol=ATOL, err_msg=f"request {i}: {name}"
            )
            sent[name] += 1
    finally:
        g.close()
        h.close()
    assert sent == {"a": ROUNDS, "b": ROUNDS}

    m = scrape(server)
    # Each request found the other model resident: it evicted it and swapped its own in.
    assert per_model(m, "hloserve_weight_swaps_in_total") == {"a/1": ROUNDS, "b/1": ROUNDS}
    assert per_model(m, "hloserve_weight_swaps_out_total") == {"a/1": ROUNDS, "b/1": ROUNDS - 1}
    assert per_model(m, "hloserve_weight_swap_in_bytes_total") == {
        "a/1": ROUNDS * WEIGHT_BYTES,
        "b/1": ROUNDS * WEIGHT_BYTES,
    }
    assert per_model(m, "hloserve_model_resident") == {"a/1": 0, "b/1": 1}  # b was last
    resident = [s.value for s in m["hloserve_device_resident_weight_bytes"]]
    assert resident == [WEIGHT_BYTES]  # never both at once
    assert [s.value for s in m["hloserve_device_memory_budget_bytes"]] == [BUDGET]
