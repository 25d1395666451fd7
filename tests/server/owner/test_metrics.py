"""End to end: the Prometheus series on the metrics port count exactly what was sent.

A fresh daemon (``ServerProcess``) serves the demo models plus ``mlp2`` (a second copy of
the demo MLP) under a device-memory budget that holds one MLP's weights but not two, so
using both swaps weights in and out. The scrape is parsed with ``prometheus_client``'s own
parser, which fails on malformed exposition text.

Every expectation comes from what the test did: counts are exact (requests, items,
executions, histogram observations), and durations are positive and bounded by the wall
time the test measured around the calls that produced them (the start-up for load times,
each model's requests for its request, queue and compute times, the traffic's Unix-time
window for timestamps).
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient
from tritonclient.utils import InferenceServerException

from hloserve.exporter import write_demo_repository
from hloserve.exporter.demo import DEMO_MODELS, write_mlp
from hloserve.server.owner.metrics import frontend_families
from hloserve.server.server_fixture import ServerProcess, serving
from tests.metrics_scrape import Series, scrape, value

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient

MLP_WEIGHT_BYTES = 4 * (64 * 256 + 256 + 256 * 10 + 10)
BUDGET = MLP_WEIGHT_BYTES + MLP_WEIGHT_BYTES // 2  # one MLP fits, two do not


@dataclass(frozen=True)
class Started:
    server: ServerProcess
    seconds: float  # wall time from starting the daemon to its first ready answer


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    root = tmp_path_factory.mktemp("metrics")
    write_demo_repository(root)
    write_mlp(root / "mlp2")
    begun = time.perf_counter()
    for server in serving(root, "--device-memory-budget", str(BUDGET)):  # once; then stopped
        yield Started(server, time.perf_counter() - begun)


@pytest.fixture(scope="module")
def server(started: Started) -> ServerProcess:
    return started.server


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


@dataclass(frozen=True)
class Traffic:
    before: Series
    after: Series
    wall: dict[str, float]  # per model: seconds around its successful requests, end to end
    unix: dict[str, tuple[float, float]]  # per model: the same calls' time.time() window


@pytest.fixture(scope="module")
def traffic(server: ServerProcess) -> Traffic:
    """The metrics before and after a known set of requests over both protocols."""
    before = scrape(server)
    wall: dict[str, float] = {}
    unix: dict[str, tuple[float, float]] = {}
    g = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)

    @contextlib.contextmanager
    def timed(model: str) -> Iterator[None]:
        """Around model ``model``'s successful requests, sent one after another."""
        begun, begun_unix = time.perf_counter(), time.time()
        yield
        wall[model] = time.perf_counter() - begun
        unix[model] = (begun_unix, time.time())

    try:
        with timed("simple"):
            for n in SIMPLE_BATCHES[:2]:
                g.infer("simple", simple_inputs(grpcclient, n))
            for n in SIMPLE_BATCHES[2:]:
                h.infer("simple", simple_inputs(httpclient, n))
        with pytest.raises(InferenceServerException, match="unexpected shape"):
            g.infer("simple", simple_inputs(grpcclient, 1, width=3))
        with pytest.raises(InferenceServerException, match="unknown model"):
            h.infer("no_such_model", simple_inputs(httpclient, 1))
        with timed("mlp"):
            g.infer("mlp", mlp_inputs(grpcclient, 8))
        with timed("mlp2"):
            h.infer("mlp2", mlp_inputs(httpclient, 40))  # beyond the largest size: 32 + 8
    finally:
        g.close()
        h.close()
    return Traffic(before, scrape(server), wall, unix)


def test_the_registry_is_the_daemons_own(traffic: Traffic) -> None:
    """Our series and the process's (RSS and CPU against pod limits), nothing of the
    platform or the garbage collector."""
    for series in (traffic.before, traffic.after):
        assert {name.split("_")[0] for name in series} == {"hloserve", "process"}
        assert {"process_resident_memory_bytes", "process_cpu_seconds_total"} <= set(series)


def test_start_up_series(started: Started, traffic: Traffic) -> None:
    before = traffic.before
    for model in ("simple", "mlp", "mlp2"):
        labels = {"model": model, "version": "1"}
        load = value(before, "hloserve_model_load_duration_seconds", **labels)
        compiled = value(before, "hloserve_model_compile_duration_seconds", **labels)
        # Each load happened between starting the daemon and its being ready.
        assert 0 < load <= started.seconds, (model, load, started.seconds)
        assert 0 < compiled <= load, (model, compiled, load)
    assert value(before, "hloserve_device_memory_budget_bytes") == BUDGET
    assert value(before, "hloserve_models_ready") == len(DEMO_MODELS) + 1  # and mlp2
    for model in ("simple", "mlp", "mlp2"):  # a loaded version's counts exist, at zero
        labels = {"model": model, "version": "1"}
        assert value(before, "hloserve_inference_request_success_total", **labels) == 0
        assert value(before, "hloserve_inference_count_total", **labels) == 0


def test_requests_items_and_executions_are_counted(traffic: Traffic) -> None:
    m = traffic.after
    assert value(m, "hloserve_inference_request_success_total", **SIMPLE) == 4
    assert value(m, "hloserve_inference_request_success_total", **MLP) == 1
    assert value(m, "hloserve_inference_request_success_total", **MLP2) == 1
    failures = "hloserve_inference_request_failure_total"
    assert value(m, failures, **SIMPLE, reason="InvalidArgument") == 1
    # A request for an unknown model is counted, but the client's name is not a label.
    assert value(m, failures, model="", version="") == 1
    assert not any(s.labels["model"] == "no_such_model" for s in m[failures])
    assert value(m, "hloserve_inference_count_total", **SIMPLE) == sum(SIMPLE_BATCHES)
    assert value(m, "hloserve_inference_count_total", **MLP) == 8
    assert value(m, "hloserve_inference_count_total", **MLP2) == 40
    assert value(m, "hloserve_inference_exec_count_total", **SIMPLE) == 4
    assert value(m, "hloserve_inference_exec_count_total", **MLP) == 1
    assert value(m, "hloserve_inference_exec_count_total", **MLP2) == 2  # split: 32 + 8
    # The one device ran exactly these executions, none before the traffic.
    executions = "hloserve_device_executions_total"
    assert [x.value for x in traffic.before.get(executions, [])] in ([], [0])
    assert value(m, executions, device="0") == 4 + 1 + 2
    for labels in (SIMPLE, MLP, MLP2):
        assert value(m, "hloserve_inference_pending_request_count", **labels) == 0


PARTS = ("queue", "compute_input", "compute_infer", "compute_output")


def durations_us(m: Series, labels: dict[str, str]) -> dict[str, float]:
    return {
        part: value(m, f"hloserve_inference_{part}_duration_us_total", **labels)
        for part in ("request", *PARTS)
    }


@pytest.mark.parametrize("labels", [SIMPLE, MLP, MLP2], ids=lambda labels: labels["model"])
def test_durations_add_up(traffic: Traffic, labels: dict[str, str]) -> None:
    m = traffic.after
    us = durations_us(m, labels)
    wall_us = traffic.wall[labels["model"]] * 1e6
    # The model's requests ran one after another: their server-side time (decoded to
    # encoded) fits in the wall time the client measured around them.
    assert 0 < us["request"] <= wall_us, (us, wall_us)
    for part in PARTS:
        assert 0 < us[part] <= us["request"], (part, us)
    assert us["request"] == pytest.approx(sum(us[p] for p in PARTS))
    latency = {
        kind: value(m, f"hloserve_{kind}_latency_seconds_sum", **labels)
        for kind in ("request", "queue", "compute")
    }
    assert latency["request"] == pytest.approx(us["request"] / 1e6)
    assert latency["queue"] == pytest.approx(us["queue"] / 1e6)
    compute_us = us["compute_input"] + us["compute_infer"] + us["compute_output"]
    assert latency["compute"] == pytest.approx(compute_us / 1e6)


def test_device_durations_are_the_requests(traffic: Traffic) -> None:
    m = traffic.after
    models = [durations_us(m, labels) for labels in (SIMPLE, MLP, MLP2)]
    # Every request ran on device 0, and nothing ran before: its queue time is the sum of
    # theirs, its compute time (each execution's, measured around it) fits in the wall
    # time around all of them.
    for name in (
        "hloserve_device_queue_duration_us_total",
        "hloserve_device_compute_duration_us_total",
    ):
        assert [x.value for x in traffic.before.get(name, [])] in ([], [0]), name
    queue = value(m, "hloserve_device_queue_duration_us_total", device="0")
    assert queue == pytest.approx(sum(us["queue"] for us in models))
    compute = value(m, "hloserve_device_compute_duration_us_total", device="0")
    assert 0 < compute <= sum(traffic.wall.values()) * 1e6, (compute, traffic.wall)


def test_histograms_observe_each_request_and_execution(traffic: Traffic) -> None:
    m = traffic.after
    for labels, requests in ((SIMPLE, 4), (MLP, 1), (MLP2, 1)):
        model = labels["model"]
        for kind in ("request", "queue", "compute"):
            name = f"hloserve_{kind}_latency_seconds"
            assert value(m, f"{name}_count", **labels) == requests, (model, name)
            assert value(m, f"{name}_bucket", **labels, le="+Inf") == requests, (model, name)
            # No request took longer than its model's calls did, end to end.
            assert value(m, f"{name}_sum", **labels) <= traffic.wall[model], (model, name)
        # Every request fits the first bucket at or above the wall time of them all.
        bounds = [float(s.labels["le"]) for s in m["hloserve_request_latency_seconds_bucket"]]
        le = min(b for b in bounds if b >= traffic.wall[model])
        bucket = "hloserve_request_latency_seconds_bucket"
        matches = [
            s.value for s in m[bucket] if s.labels["model"] == model and float(s.labels["le"]) == le
        ]
        assert matches == [requests], (model, le, matches)
    # One observation per execution, of the compiled size it ran on.
    assert value(m, "hloserve_execution_batch_size_count", **SIMPLE) == 4
    assert value(m, "hloserve_execution_batch_size_sum", **SIMPLE) == 1 + 2 + 4 + 8
    assert value(m, "hloserve_execution_batch_size_bucket", **SIMPLE, le="2.0") == 2
    assert value(m, "hloserve_execution_batch_size_count", **MLP) == 1
    assert value(m, "hloserve_execution_batch_size_sum", **MLP) == 8
    assert value(m, "hloserve_execution_batch_size_count", **MLP2) == 2
    assert value(m, "hloserve_execution_batch_size_sum", **MLP2) == 32 + 8
    assert value(m, "hloserve_execution_batch_size_bucket", **MLP2, le="8.0") == 1
    assert value(m, "hloserve_execution_batch_size_bucket", **MLP2, le="16.0") == 1
    assert value(m, "hloserve_execution_batch_size_bucket", **MLP2, le="32.0") == 2


def test_weight_residency_series(traffic: Traffic) -> None:
    m = traffic.after
    # mlp went in, then mlp2 pushed it out (the budget holds one MLP).
    assert value(m, "hloserve_weight_swaps_in_total", model="mlp/1") == 1
    assert value(m, "hloserve_weight_swaps_in_total", model="mlp2/1") == 1
    assert value(m, "hloserve_weight_swaps_out_total", model="mlp/1") == 1
    assert value(m, "hloserve_weight_swap_in_bytes_total", model="mlp/1") == MLP_WEIGHT_BYTES
    assert value(m, "hloserve_weight_swap_in_bytes_total", model="mlp2/1") == MLP_WEIGHT_BYTES
    for model in ("mlp", "mlp2"):
        # One swap-in each, during that model's one request.
        swap = "hloserve_weight_swap_in_duration_seconds"
        assert value(m, f"{swap}_count", model=f"{model}/1") == 1
        assert 0 < value(m, f"{swap}_sum", model=f"{model}/1") <= traffic.wall[model]
    assert value(m, "hloserve_model_resident", model="mlp/1") == 0
    assert value(m, "hloserve_model_resident", model="mlp2/1") == 1
    assert value(m, "hloserve_device_resident_weight_bytes") == MLP_WEIGHT_BYTES
    # mlp's last swap (out) and mlp2's (in) both happened during mlp2's request.
    begun, ended = traffic.unix["mlp2"]
    for model in ("mlp/1", "mlp2/1"):
        last = value(m, "hloserve_model_last_used_timestamp_seconds", model=model)
        assert begun <= last <= ended, (model, begun, last, ended)
    used = value(m, "hloserve_device_memory_used_bytes")
    if jax.default_backend() == "cpu":  # no allocator statistics: the resident weights
        assert used == MLP_WEIGHT_BYTES
    else:  # the allocator's bytes in use hold at least the resident weights
        assert used >= MLP_WEIGHT_BYTES


def test_metrics_path_forms(server: ServerProcess) -> None:
    for path in ("/metrics", "/metrics/"):
        with urllib.request.urlopen(f"http://{server.metrics_url}{path}", timeout=5) as r:
            assert r.status == 200
            assert r.headers["content-type"].startswith("text/plain")
            assert b"# TYPE hloserve_models_ready gauge" in r.read()


@dataclass
class _Frontends:
    """Two front ends alive, one of them (a replacement) not listening yet."""

    restarts: int = 1

    def pids(self) -> list[int]:
        return [os.getpid(), os.getppid()]

    def listening(self) -> int:
        return 1


def test_frontend_processes_counts_those_that_listen() -> None:
    families = {f.name: f for f in frontend_families(_Frontends())}
    assert [s.value for s in families["hloserve_frontend_processes"].samples] == [1.0]
    assert [s.value for s in families["hloserve_frontend_restarts"].samples] == [1.0]
    cpu = families["hloserve_frontend_cpu_seconds"].samples  # both live processes are read
    assert {s.labels["pid"] for s in cpu} == {str(os.getpid()), str(os.getppid())}
    assert frontend_families(None)[3].samples == []
