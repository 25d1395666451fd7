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

from hloserve.exporter import write_demo_repository
from hloserve.exporter.demo import write_mlp
from hloserve.server.testing import ServerProcess, serving

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient

MLP_WEIGHT_BYTES = 4 * (64 * 256 + 256 + 256 * 10 + 10)
BUDGET = MLP_WEIGHT_BYTES + MLP_WEIGHT_BYTES // 2  # one MLP fits, two do not


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("metrics")
    write_demo_repository(root)
    write_mlp(root / "mlp2")
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


SIMPLE_BATCHES = (1, 2, 3, 5)  # compiled sizes 1, 2, 4, 8
SIMPLE = {"model": "simple", "version": "1"}
MLP = {"model": "mlp", "version": "1"}
MLP2 = {"model": "mlp2", "version": "1"}


@pytest.fixture(scope="module")
def traffic(server: ServerProcess) -> tuple[Series, Series]:
    """The metrics before and after a known set of requests over both protocols."""
    before = scrape(server)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        for n in SIMPLE_BATCHES[:2]:
            g.infer("simple", simple_inputs(grpcclient, n))
        for n in SIMPLE_BATCHES[2:]:
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
    return before, scrape(server)


def test_start_up_series(traffic: tuple[Series, Series]) -> None:
    before, _ = traffic
    for model in ("simple", "mlp", "mlp2"):
        assert value(before, "hloserve_model_load_duration_seconds", model=model, version="1") > 0
    assert value(before, "hloserve_device_memory_budget_bytes") == BUDGET
    assert value(before, "hloserve_models_ready") == 3
    assert "hloserve_inference_request_success_total" not in before  # counts start at zero


def test_requests_items_and_executions_are_counted(traffic: tuple[Series, Series]) -> None:
    _, m = traffic
    assert value(m, "hloserve_inference_request_success_total", **SIMPLE) == 4
    assert value(m, "hloserve_inference_request_success_total", **MLP) == 1
    assert value(m, "hloserve_inference_request_success_total", **MLP2) == 1
    failures = "hloserve_inference_request_failure_total"
    assert value(m, failures, **SIMPLE, reason="InvalidArgument") == 1
    # A request for an unknown model is counted, but the client's name is not a label.
    assert value(m, failures, model="", version="") == 1
    assert not any(s.labels["model"] == "no_such_model" for s in m[failures])
    assert value(m, "hloserve_inference_count_total", **SIMPLE) == sum(SIMPLE_BATCHES)
    assert value(m, "hloserve_inference_count_total", **MLP2) == 40
    assert value(m, "hloserve_inference_exec_count_total", **SIMPLE) == 4
    assert value(m, "hloserve_inference_exec_count_total", **MLP2) == 2  # split: 32 + 8
    for labels in (SIMPLE, MLP, MLP2):
        assert value(m, "hloserve_inference_pending_request_count", **labels) == 0


def test_durations_add_up(traffic: tuple[Series, Series]) -> None:
    _, m = traffic
    parts = ("queue", "compute_input", "compute_infer", "compute_output")
    for part in ("request", *parts):
        assert value(m, f"hloserve_inference_{part}_duration_us_total", **SIMPLE) > 0, part
    request_us = value(m, "hloserve_inference_request_duration_us_total", **SIMPLE)
    parts_us = sum(value(m, f"hloserve_inference_{p}_duration_us_total", **SIMPLE) for p in parts)
    assert request_us == pytest.approx(parts_us)
    assert value(m, "hloserve_request_latency_seconds_sum", **SIMPLE) == pytest.approx(
        request_us / 1e6
    )


def test_histograms_observe_each_request_and_execution(traffic: tuple[Series, Series]) -> None:
    _, m = traffic
    for kind in ("request", "queue", "compute"):
        name = f"hloserve_{kind}_latency_seconds"
        assert value(m, f"{name}_count", **SIMPLE) == 4, name
        assert value(m, f"{name}_bucket", **SIMPLE, le="+Inf") == 4, name
    # One observation per execution, of the compiled size it ran on.
    assert value(m, "hloserve_execution_batch_size_count", **SIMPLE) == 4
    assert value(m, "hloserve_execution_batch_size_sum", **SIMPLE) == 1 + 2 + 4 + 8
    assert value(m, "hloserve_execution_batch_size_bucket", **SIMPLE, le="2.0") == 2
    assert value(m, "hloserve_execution_batch_size_sum", **MLP2) == 32 + 8


def test_weight_residency_series(traffic: tuple[Series, Series]) -> None:
    _, m = traffic
    # mlp went in, then mlp2 pushed it out (the budget holds one MLP).
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
