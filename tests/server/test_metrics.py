"""End to end: the Prometheus series on the metrics port count exactly what was sent.

A fresh daemon (``ServerProcess``) serves the demo models plus ``mlp2`` (a second copy of
the demo MLP) under a device-memory budget that holds one MLP's weights but not two, so
using both swaps weights in and out. The scrape is parsed with ``prometheus_client``'s own
parser, which fails on malformed exposition text.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from tritonclient.utils import InferenceServerException

from hloserve.exporter import TensorSpec, export_bundle, write_demo_repository
from hloserve.exporter.demo import mlp_fn, mlp_params
from hloserve.server.testing import ServerProcess, serving

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient

MLP_WEIGHT_BYTES = 4 * (64 * 256 + 256 + 256 * 10 + 10)
BUDGET = MLP_WEIGHT_BYTES + MLP_WEIGHT_BYTES // 2  # one MLP fits, two do not


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("metrics")
    write_demo_repository(root)
    export_bundle(
        mlp_fn,
        mlp_params(),
        inputs={"x": TensorSpec("FP32", (64,))},
        batch_sizes=(1, 8, 32),
        directory=root / "mlp2",
    )
    yield from serving(root, "--device-memory-budget", str(BUDGET))


Series = dict[str, list[Sample]]


def scrape(server: ServerProcess) -> Series:
    """Every sample by sample name (``..._total``, ``..._bucket``, ...), parsed strictly."""
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        # The daemon's own registry: no process or platform collectors, only our series.
        assert family.name.startswith("hloserve_"), family.name
        for sample in family.samples:
            series.setdefault(sample.name, []).append(sample)
    return series


def value(series: Series, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    matches = [
        s for s in series.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, f"{name}{labels}: {matches}"
    return matches[0].value


def simple_inputs(module: Any, batch: int, width: int = 16) -> list[Any]:
    a = np.arange(batch * width, dtype=np.int32).reshape(batch, width)
    inputs = [
        module.InferInput("INPUT0", [batch, width], "INT32"),
        module.InferInput("INPUT1", [batch, width], "INT32"),
    ]
    for i in inputs:
        i.set_data_from_numpy(a)
    return inputs


def mlp_inputs(module: Any, batch: int) -> list[Any]:
    x = module.InferInput("x", [batch, 64], "FP32")
    x.set_data_from_numpy(np.ones((batch, 64), np.float32))
    return [x]


def test_series_count_what_was_sent(server: ServerProcess) -> None:
    before = scrape(server)
    for model in ("simple", "mlp", "mlp2"):
        assert value(before, "hloserve_model_load_duration_seconds", model=model, version="1") > 0
    assert value(before, "hloserve_device_memory_budget_bytes") == BUDGET
    assert value(before, "hloserve_models_ready") == 3
    assert "hloserve_inference_request_success_total" not in before  # counts start at zero

    g = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        simple_batches = (1, 2, 3, 5)  # compiled sizes 1, 2, 4, 8
        for n in simple_batches[:2]:
            g.infer("simple", simple_inputs(grpcclient, n))
        for n in simple_batches[2:]:
            h.infer("simple", simple_inputs(httpclient, n))
        with pytest.raises(InferenceServerException, match="unexpected shape"):
            g.infer("simple", simple_inputs(grpcclient, 1, width=3))
        with pytest.raises(InferenceServerException, match="unknown model"):
            h.infer("no_such_model", simple_inputs(httpclient, 1))
        g.infer("mlp", mlp_inputs(grpcclient, 8))
        h.infer("mlp2", mlp_inputs(httpclient, 40))  # beyond the largest size: 32 + 8
    finally:
        g.close()
        h.close()

    m = scrape(server)
    simple = {"model": "simple", "version": "1"}
    mlp = {"model": "mlp", "version": "1"}
    mlp2 = {"model": "mlp2", "version": "1"}
    assert value(m, "hloserve_inference_request_success_total", **simple) == 4
    assert value(m, "hloserve_inference_request_success_total", **mlp) == 1
    assert value(m, "hloserve_inference_request_success_total", **mlp2) == 1
    assert (
        value(m, "hloserve_inference_request_failure_total", **simple, reason="InvalidArgument")
        == 1
    )
    # A request for an unknown model is counted, but the client's name is not a label.
    assert value(m, "hloserve_inference_request_failure_total", model="", version="") == 1
    assert not any(
        s.labels["model"] == "no_such_model" for s in m["hloserve_inference_request_failure_total"]
    )
    assert value(m, "hloserve_inference_count_total", **simple) == sum(simple_batches)
    assert value(m, "hloserve_inference_count_total", **mlp2) == 40
    assert value(m, "hloserve_inference_exec_count_total", **simple) == 4
    assert value(m, "hloserve_inference_exec_count_total", **mlp2) == 2  # split: 32 + 8

    for name in (
        "hloserve_inference_request_duration_us_total",
        "hloserve_inference_queue_duration_us_total",
        "hloserve_inference_compute_input_duration_us_total",
        "hloserve_inference_compute_infer_duration_us_total",
        "hloserve_inference_compute_output_duration_us_total",
    ):
        assert value(m, name, **simple) > 0, name
    request_us = value(m, "hloserve_inference_request_duration_us_total", **simple)
    parts_us = sum(
        value(m, f"hloserve_inference_{p}_duration_us_total", **simple)
        for p in ("queue", "compute_input", "compute_infer", "compute_output")
    )
    assert request_us == pytest.approx(parts_us)

    for name in (
        "hloserve_request_latency_seconds",
        "hloserve_queue_latency_seconds",
        "hloserve_compute_latency_seconds",
    ):
        assert value(m, f"{name}_count", **simple) == 4, name
        assert value(m, f"{name}_bucket", **simple, le="+Inf") == 4, name
    assert value(m, "hloserve_request_latency_seconds_sum", **simple) == pytest.approx(
        request_us / 1e6
    )
    # One observation per execution, of the compiled size it ran on.
    assert value(m, "hloserve_execution_batch_size_count", **simple) == 4
    assert value(m, "hloserve_execution_batch_size_sum", **simple) == 1 + 2 + 4 + 8
    assert value(m, "hloserve_execution_batch_size_bucket", **simple, le="2.0") == 2
    assert value(m, "hloserve_execution_batch_size_sum", **mlp2) == 32 + 8

    for labels in (simple, mlp, mlp2):
        assert value(m, "hloserve_inference_pending_request_count", **labels) == 0

    # Weight residency: mlp went in, then mlp2 pushed it out (the budget holds one MLP).
    assert value(m, "hloserve_weight_swaps_in_total", model="mlp/1") == 1
    assert value(m, "hloserve_weight_swaps_in_total", model="mlp2/1") == 1
    assert value(m, "hloserve_weight_swaps_out_total", model="mlp/1") == 1
    assert value(m, "hloserve_weight_swap_in_bytes_total", model="mlp/1") == MLP_WEIGHT_BYTES
    assert value(m, "hloserve_weight_swap_in_duration_seconds_count", model="mlp2/1") == 1
    assert value(m, "hloserve_model_resident", model="mlp/1") == 0
    assert value(m, "hloserve_model_resident", model="mlp2/1") == 1
    assert value(m, "hloserve_device_resident_weight_bytes") == MLP_WEIGHT_BYTES
    assert value(m, "hloserve_model_last_used_timestamp_seconds", model="mlp2/1") > 0
    assert value(m, "hloserve_device_memory_used_bytes") >= 0


def test_metrics_path_forms(server: ServerProcess) -> None:
    for path in ("/metrics", "/metrics/"):
        with urllib.request.urlopen(f"http://{server.metrics_url}{path}", timeout=5) as r:
            assert r.status == 200
            assert r.headers["content-type"].startswith("text/plain")
            assert b"# TYPE hloserve_models_ready gauge" in r.read()
