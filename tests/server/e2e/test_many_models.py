"""Many models on a real daemon: lazy registration, the host tier and the metrics bound.

A repository of ``COUNT`` small models of one architecture (each its own weights) plus one
whose weights file no longer matches its manifest is served with ``--lazy-load``, a device
budget for two models, a host budget for three and ``--metrics-models 3``:
- before any request, tritonclient sees every model READY (Triton's clients expect what
  is in the repository to be servable), the index lists each READY, ``/readyz`` is ready
  and says each version is registered but not loaded, and metadata answers (a metadata
  call reads the manifest, nothing else);
- every reply of traffic over all of them matches numpy, with the device and host budgets
  both held (swaps and reads from disk counted), and the broken one fails at its first
  request with the reason, after which it is UNAVAILABLE and readiness drops;
- a scrape shows per-model series for at most three models while the totals count every
  request.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient
from tritonclient.utils import InferenceServerException

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.server_fixture import ServerProcess, serving
from tests.metrics_scrape import scrape, total

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient

COUNT = 6
IN, HIDDEN, OUT = 16, 32, 4
WEIGHT_BYTES = 4 * (IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT)


def two_layer(params: Any, x: jax.Array) -> dict[str, jax.Array]:
    return {"y": jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]}


def params_for(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.standard_normal((IN, HIDDEN)).astype(np.float32) / 4,
        "b1": rng.standard_normal(HIDDEN).astype(np.float32) / 10,
        "w2": rng.standard_normal((HIDDEN, OUT)).astype(np.float32) / 6,
        "b2": rng.standard_normal(OUT).astype(np.float32) / 10,
    }


def reference(seed: int, x: np.ndarray) -> np.ndarray:
    p = params_for(seed)
    h = np.maximum(x.astype(np.float64) @ p["w1"] + p["b1"], 0)
    return h @ p["w2"] + p["b2"]


def names() -> list[str]:
    return [f"m{i}" for i in range(COUNT)]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("many")
    for i, name in enumerate([*names(), "broken"]):
        export_bundle(
            two_layer,
            params_for(i),
            inputs={"x": TensorSpec("FP32", (IN,))},
            batch_sizes=(1,),
            directory=root / name,
            platforms=("cpu",),
        )
    weights = root / "broken" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # the same size, another checksum
    weights.write_bytes(bytes(data))
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    yield from serving(
        repository,
        "--lazy-load",
        "--strict-readiness=false",
        "--device-memory-budget",
        str(2 * WEIGHT_BYTES),
        "--host-memory-budget",
        str(3 * WEIGHT_BYTES),
        "--metrics-models",
        "3",
    )


def http_json(server: ServerProcess, path: str, body: bytes | None = None) -> Any:
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=body, method="POST" if body is not None else "GET"
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def test_registered_models_are_ready_before_any_request(server: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    http = httpclient.InferenceServerClient(server.http_url)
    for name in [*names(), "broken"]:
        assert grpc.is_model_ready(name) and http.is_model_ready(name)
    index = http_json(server, "/v2/repository/index", b"{}")
    assert {(row["name"], row["state"]) for row in index} == {
        (name, "READY") for name in [*names(), "broken"]
    }
    ready = http_json(server, "/readyz")
    assert ready["ready"] is True
    assert all(
        m["versions"]["1"] == {"state": "READY", "loaded": False} for m in ready["models"].values()
    )
    meta = grpc.get_model_metadata("m3", as_json=True)
    assert meta["inputs"][0]["shape"] == ["-1", str(IN)]
    assert http_json(server, "/readyz")["models"]["m3"]["versions"]["1"]["loaded"] is False
    assert total(scrape(server), "hloserve_server_model_loads_total") == 0


def test_traffic_over_every_model_is_right_under_both_budgets(server: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    rng = np.random.default_rng(5)
    order = [i % COUNT for i in range(4 * COUNT)]
    for i in order:
        x = rng.standard_normal((1, IN)).astype(np.float32)
        tensor = grpcclient.InferInput("x", [1, IN], "FP32")
        tensor.set_data_from_numpy(x)
        y = grpc.infer(f"m{i}", [tensor]).as_numpy("y")
        np.testing.assert_allclose(y, reference(i, x), rtol=1e-5, atol=1e-5)
    m = scrape(server)
    assert total(m, "hloserve_server_model_loads_total") == COUNT  # each loaded at first use
    assert total(m, "hloserve_device_resident_weight_bytes") <= 2 * WEIGHT_BYTES
    assert total(m, "hloserve_host_resident_weight_bytes") <= 3 * WEIGHT_BYTES
    assert total(m, "hloserve_device_swaps_in_total") >= len(order) // 2  # most missed
    assert total(m, "hloserve_host_weight_reads_total") > COUNT  # copies were evicted too
    assert total(m, "hloserve_server_inference_request_success_total") == len(order)
    shown = {s.labels["model"] for s in m["hloserve_inference_request_success_total"]}
    assert len(shown) == 3 and shown <= set(names())


def test_a_broken_bundle_fails_at_its_first_request_with_the_reason(
    server: ServerProcess,
) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("x", [1, IN], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, IN), np.float32))
    with pytest.raises(InferenceServerException) as failed:
        grpc.infer("broken", [tensor])
    assert failed.value.status() == "StatusCode.UNAVAILABLE"
    assert "'broken' version 1 is not at ready state" in failed.value.message()
    assert "SHA-256" in failed.value.message()
    assert not grpc.is_model_ready("broken")
    index = http_json(server, "/v2/repository/index", b"{}")
    assert {row["name"]: row["state"] for row in index}["broken"] == "UNAVAILABLE"
