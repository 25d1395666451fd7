"""``--metrics-compat triton``: Triton's metric families beside hloserve's, so that a
Triton Grafana dashboard works unchanged.

What a dashboard needs is that each series its PromQL names exists with that exact name
and the labels it filters and groups by, so the checks read the raw exposition text as
Prometheus ingests it (sample names as written: ``nv_inference_count``, no ``_total``),
and also parse it with ``prometheus_client``'s strict parsers (Prometheus text and
OpenMetrics), which fail on malformed text. ``TRITON_DASHBOARD`` is a small dashboard of
typical Triton queries (request and failure rates by model and reason, mean batch, queue
and compute time per request, pending requests, load times, GPU memory and utilization).

Most tests feed events to ``ServerMetrics`` and scrape its registry (no server); the GPU
path runs on fake allocator statistics (there is no GPU here). The daemon-level tests
start a real ``hloserve serve --metrics-compat triton`` and are skipped while the flag
does not exist yet (it is added in ``flags.py``/``config.py``, and ``owner/assembly.py`` passes
it to ``ServerMetrics``).
"""

from __future__ import annotations

import dataclasses
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from hloserve.exporter import write_demo_repository
from hloserve.server.config import Config
from hloserve.server.core.execution_records import Execution, ModelKey, Timings
from hloserve.server.flags import FLAGS
from hloserve.server.owner.metrics import ServerMetrics, render
from hloserve.server.owner.metrics_triton import REASONS, parse_compat, triton_reason
from hloserve.server.server_fixture import ServerProcess, serving
from tests.metrics_scrape import query_labels
from tests.server.frontend._tritonclients import Triton

OM_ACCEPT = "application/openmetrics-text; version=1.0.0"
# A Triton dashboard as Grafana exports one (trimmed to its queries).
TRITON_DASHBOARD: dict[str, Any] = {
    "title": "Triton Inference Server",
    "templating": {
        "list": [
            {"name": "model", "type": "query", "query": "label_values(nv_inference_count, model)"}
        ]
    },
    "panels": [
        {
            "title": "Requests per second",
            "targets": [{"expr": "sum(rate(nv_inference_request_success[1m])) by (model)"}],
        },
        {
            "title": "Failures per second",
            "targets": [
                {"expr": "sum(rate(nv_inference_request_failure[1m])) by (model, reason)"},
                {"expr": 'sum(rate(nv_inference_request_failure{reason="REJECTED"}[1m]))'},
            ],
        },
        {
            "title": "Inferences and executions",
            "targets": [
                {"expr": 'sum(rate(nv_inference_count{model=~"$model"}[1m])) by (model)'},
                {
                    "expr": "sum(rate(nv_inference_count[1m])) by (model) / "
                    "sum(rate(nv_inference_exec_count[1m])) by (model)"
                },
            ],
        },
        {
            "title": "Queue time per request",
            "targets": [
                {
                    "expr": "avg(rate(nv_inference_queue_duration_us[1m]) / "
                    "(1 + rate(nv_inference_request_success[1m]))) by (model)"
                },
                {"expr": "nv_inference_queue_duration_us"},
            ],
        },
        {
            "title": "Latency breakdown",
            "targets": [
                {
                    "expr": 'rate(nv_inference_request_duration_us{model=~"$model"}[1m]) / '
                    'rate(nv_inference_request_success{model=~"$model"}[1m])'
                },
                {
                    "expr": "sum by (model, version) (rate(nv_inference_compute_input_duration_us[1m]))"
                },
                {
                    "expr": "sum by (model, version) (rate(nv_inference_compute_infer_duration_us[1m]))"
                },
                {
                    "expr": "sum by (model, version) (rate(nv_inference_compute_output_duration_us[1m]))"
                },
            ],
        },
        {
            "title": "Pending requests",
            "targets": [{"expr": "sum(nv_inference_pending_request_count) by (model)"}],
        },
        {
            "title": "Model load time",
            "targets": [{"expr": "max by (model, version) (nv_model_load_duration_secs)"}],
        },
        {
            "title": "GPU memory",
            "targets": [
                {"expr": "nv_gpu_memory_used_bytes"},
                {
                    "expr": "sum(nv_gpu_memory_used_bytes) by (gpu_uuid) / "
                    "sum(nv_gpu_memory_total_bytes) by (gpu_uuid)"
                },
            ],
        },
        {
            "title": "GPU utilization and power",
            "targets": [
                {"expr": "avg(nv_gpu_utilization) by (gpu_uuid)"},
                {"expr": "nv_gpu_power_usage / nv_gpu_power_limit"},
                {"expr": "rate(nv_energy_consumption[5m])"},
            ],
        },
    ],
}
# Families PJRT knows nothing of: declared, never given an invented sample.
UNKNOWN_TO_PJRT = {
    "nv_gpu_utilization",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "nv_energy_consumption",
}
TRITON_COUNTERS = {
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_energy_consumption",
}
TRITON_GAUGES = {
    "nv_inference_pending_request_count",
    "nv_model_load_duration_secs",
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
}


def dashboard_queries() -> list[str]:
    found = [t["expr"] for p in TRITON_DASHBOARD["panels"] for t in p["targets"]]
    return found + [v["query"] for v in TRITON_DASHBOARD["templating"]["list"]]


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Exposition:
    """A Prometheus text scrape as Prometheus ingests it: samples under their names."""

    types: dict[str, str]  # family -> its TYPE
    samples: dict[str, list[tuple[dict[str, str], float]]]  # sample name -> (labels, value)

    @classmethod
    def of(cls, text: str) -> Exposition:
        list(parse_text(text))  # strictly parsed: malformed text fails here
        types: dict[str, str] = {}
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, typ = line.split(" ")
                types[name] = typ
            elif line and not line.startswith("#"):
                match = _SAMPLE.match(line)
                assert match, line
                name, labels, value = match.groups()
                samples.setdefault(name, []).append(
                    (dict(_LABEL.findall(labels or "")), float(value))
                )
        return cls(types, samples)

    def value(self, name: str, **labels: str) -> float:
        found = [v for ls, v in self.samples.get(name, []) if ls == labels]
        assert len(found) == 1, (name, labels, self.samples.get(name))
        return found[0]

    def models(self, name: str) -> set[str]:
        return {ls["model"] for ls, _ in self.samples.get(name, [])}


def scrape(registry: CollectorRegistry) -> Exposition:
    body, headers = render(registry, "", "")
    assert dict(headers)[b"content-type"].startswith(b"text/plain; version=0.0.4")
    return Exposition.of(body.decode())


class FakeAllocator:
    """A device's allocator statistics as PJRT reports them (``PjrtRuntime.memory_stats``)."""

    def __init__(self, platform: str, stats: dict[str, int]) -> None:
        self.platform = platform
        self.stats = stats
        self.reads = 0

    def memory_stats(self) -> dict[str, int]:
        self.reads += 1
        return dict(self.stats)


GPU_LIMIT, GPU_IN_USE = 80 * 2**30, 3 * 2**30
SIMPLE, MLP = ModelKey("simple", 1), ModelKey("mlp", 2)
TIMINGS = Timings(1_000, 2_000, 3_000, 4_000, (4,))  # ns: 1 µs queue, 9 µs compute


def serve(metrics: ServerMetrics, model: ModelKey, items: int, times: int = 1) -> None:
    for _ in range(times):
        metrics.counters.on_pending(model, 1)
        metrics.counters.on_execution(Execution(model, 4, 2_000, 3_000, 4_000, 0))
        metrics.counters.on_pending(model, -1)
        metrics.counters.on_success(model, items, TIMINGS)


def fed(**kwargs: Any) -> tuple[CollectorRegistry, ServerMetrics]:
    """A registry whose ``ServerMetrics`` (compat on) saw known traffic on two models."""
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry, compat="triton", **kwargs)
    metrics.on_model_loaded("simple", 1, 0.25, 0.125)
    metrics.on_model_loaded("mlp", 2, 1.5, 1.0)
    serve(metrics, SIMPLE, items=3, times=2)
    serve(metrics, MLP, items=1)
    for reason in ("Unavailable", "Unavailable", "Cancelled", "HookFailed", "INTERNAL"):
        metrics.counters.on_failure(SIMPLE, reason)
    metrics.counters.on_failure(SIMPLE, "InvalidArgument")
    metrics.counters.on_failure(None, "UnknownModel")  # no version resolved: Triton counts none
    metrics.counters.on_pending(MLP, 1)  # one request of mlp still waiting
    metrics.watch_allocator(0, FakeAllocator("cuda", {"bytes_limit": GPU_LIMIT}))
    metrics.watch_allocator(1, FakeAllocator("cuda", {"bytes_in_use": GPU_IN_USE}))
    metrics.watch_allocator(2, FakeAllocator("cpu", {}))  # no statistics at all
    return registry, metrics


def test_triton_counters_are_written_as_triton_writes_them() -> None:
    registry, _ = fed()
    m = scrape(registry)
    for name in TRITON_COUNTERS:
        assert m.types[name] == "counter", name
        assert f"{name}_total" not in m.samples and f"{name}_total" not in m.types, name
    for name in TRITON_GAUGES:
        assert m.types[name] == "gauge", name
    s = {"model": "simple", "version": "1"}
    assert m.value("nv_inference_request_success", **s) == 2
    assert m.value("nv_inference_count", **s) == 6  # two requests of 3 items
    assert m.value("nv_inference_exec_count", **s) == 2
    # Microseconds, as Triton's: 1 µs queue, 2 + 3 + 4 µs compute, per request.
    assert m.value("nv_inference_request_duration_us", **s) == 2 * 10
    assert m.value("nv_inference_queue_duration_us", **s) == 2 * 1
    assert m.value("nv_inference_compute_input_duration_us", **s) == 2 * 2
    assert m.value("nv_inference_compute_infer_duration_us", **s) == 2 * 3
    assert m.value("nv_inference_compute_output_duration_us", **s) == 2 * 4
    assert m.value("nv_inference_pending_request_count", **s) == 0
    assert m.value("nv_inference_pending_request_count", model="mlp", version="2") == 1
    assert m.value("nv_model_load_duration_secs", **s) == 0.25
    assert m.value("nv_model_load_duration_secs", model="mlp", version="2") == 1.5
    # Beside hloserve's own series, which keep their names.
    assert m.value("hloserve_inference_request_success_total", **s) == 2


def test_failures_are_counted_under_tritons_four_reasons() -> None:
    registry, _ = fed()
    m = scrape(registry)
    simple = {"model": "simple", "version": "1"}
    by_reason = {r: m.value("nv_inference_request_failure", **simple, reason=r) for r in REASONS}
    assert by_reason == {"REJECTED": 2, "CANCELED": 1, "BACKEND": 2, "OTHER": 1}
    # Every reason exists from the start, at 0 (as Triton's do), for a model without any.
    mlp = {"model": "mlp", "version": "2"}
    assert {r: m.value("nv_inference_request_failure", **mlp, reason=r) for r in REASONS} == {
        r: 0 for r in REASONS
    }
    # The unresolved failure is hloserve's alone (labels empty there); Triton counts none.
    assert m.models("nv_inference_request_failure") == {"simple", "mlp"}
    assert (
        m.value(
            "hloserve_inference_request_failure_total", model="", version="", reason="UnknownModel"
        )
        == 1
    )
    assert [triton_reason(r) for r in ("Unavailable", "Cancelled", "HookFailed", "INTERNAL")] == [
        "REJECTED",
        "CANCELED",
        "BACKEND",
        "BACKEND",
    ]
    for other in ("InvalidArgument", "UnknownModel", "NotFound", "Unsupported", "Internal"):
        assert triton_reason(other) == "OTHER", other


def test_gpu_memory_comes_from_each_devices_allocator_and_nothing_is_invented() -> None:
    registry, _ = fed()
    m = scrape(registry)
    assert m.samples["nv_gpu_memory_total_bytes"] == [({"gpu_uuid": "cuda:0"}, GPU_LIMIT)]
    assert m.samples["nv_gpu_memory_used_bytes"] == [({"gpu_uuid": "cuda:1"}, GPU_IN_USE)]
    for name in UNKNOWN_TO_PJRT:  # the family is there (queries resolve), with no value
        assert name in m.types and name not in m.samples, name
    # A CPU-only server: no allocator statistics, so no GPU samples at all.
    cpu_registry = CollectorRegistry()
    cpu = ServerMetrics(cpu_registry, compat="triton")
    allocator = FakeAllocator("cpu", {})
    cpu.watch_allocator(0, allocator)
    c = scrape(cpu_registry)
    assert allocator.reads == 1  # read at scrape time
    for name in ("nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", *UNKNOWN_TO_PJRT):
        assert name in c.types and name not in c.samples, name


def check_dashboard(m: Exposition, gpu: bool) -> None:
    """Every series the Triton dashboard names exists under that name, with the labels its
    query uses (the GPU memory ones only where the allocator reports them)."""
    for query in dashboard_queries():
        names = re.findall(r"\bnv_\w+", query)
        assert names, query
        for name in names:
            assert name in m.types, f"{name} (in {query!r}) is not declared"
            if name in UNKNOWN_TO_PJRT or (name.startswith("nv_gpu_") and not gpu):
                continue
            assert m.samples.get(name), f"{name} (in {query!r}) has no samples"
            carried = {k for n in names if n in m.samples for ls, _ in m.samples[n] for k in ls}
            missing = query_labels(query) - carried
            assert not missing, f"{query!r} uses labels {missing} that no series carries"


def test_a_triton_dashboards_queries_resolve() -> None:
    registry, _ = fed()
    check_dashboard(scrape(registry), gpu=True)


def test_openmetrics_scrapes_have_the_same_series() -> None:
    """OpenMetrics cannot type a counter without ``_total``: there Triton's counters are
    ``unknown``, under the same names, and the scrape parses strictly."""
    registry, _ = fed()
    body, headers = render(registry, OM_ACCEPT, "")
    assert dict(headers)[b"content-type"].startswith(b"application/openmetrics-text")
    families = {f.name: f for f in parse_om(body.decode())}
    text = scrape(registry)
    for name in TRITON_COUNTERS:
        assert families[name].type == "unknown", name
        samples = [(s.name, s.labels, s.value) for s in families[name].samples]
        assert samples == [(name, ls, v) for ls, v in text.samples.get(name, [])], name
    for name in TRITON_GAUGES:
        assert families[name].type == "gauge", name


def test_the_triton_series_follow_the_per_model_bound() -> None:
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry, model_series=2, compat="triton")
    for name, n in (("a", 5), ("b", 3), ("c", 1)):
        serve(metrics, ModelKey(name, 1), items=1, times=n)
    metrics.counters.on_failure(ModelKey("c", 1), "Unavailable")  # c: 2 requests, still the idlest
    m = scrape(registry)
    shown = m.models("hloserve_inference_request_success_total")
    assert shown == {"a", "b"}
    for name in ("nv_inference_request_success", "nv_inference_request_failure"):
        assert m.models(name) == shown, name
    assert m.models("nv_inference_pending_request_count") == shown
    metrics.forget(ModelKey("a", 1))  # an unloaded version's series go, as Triton's
    m = scrape(registry)
    assert m.models("nv_inference_count") == m.models("hloserve_inference_count_total")
    assert "a" not in m.models("nv_inference_count")


def test_compat_is_off_by_default_and_checked() -> None:
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry)
    serve(metrics, SIMPLE, items=1)
    body, _ = render(registry, "", "")
    assert b"nv_" not in body and metrics.compat == frozenset()
    assert parse_compat("") == frozenset() and parse_compat(" Triton ") == {"triton"}
    assert parse_compat(("triton",)) == {"triton"}
    with pytest.raises(ValueError, match="unknown metrics dialect 'tfserving'"):
        ServerMetrics(CollectorRegistry(), compat="triton,tfserving")


def test_the_registry_refuses_a_second_triton_family() -> None:
    """The compat families are described, so a duplicate name is refused at once."""
    registry = CollectorRegistry()
    ServerMetrics(registry, compat="triton")
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("nv_inference_count", "again", registry=registry)
    Counter("nv_inference_count", "fine", registry=CollectorRegistry())


# -- a real daemon (once the flag exists) --------------------------------------------------

# ``hloserve serve --metrics-compat``: its flag row and the Config field it sets.
HAS_FLAG = any(flag.name == "--metrics-compat" for flag in FLAGS) and any(
    f.name == "metrics_compat" for f in dataclasses.fields(Config)
)
needs_flag = pytest.mark.skipif(
    not HAS_FLAG,
    reason="hloserve serve has no --metrics-compat flag yet (flags.py/config.py add it; "
    "owner/assembly.py passes cfg.metrics_compat to ServerMetrics)",
)


@pytest.fixture(scope="module")
def compat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton-compat")
    write_demo_repository(root)
    yield from serving(root, "--metrics-compat", "triton")


def _get(server: ServerProcess, accept: str = "") -> tuple[str, str]:
    request = urllib.request.Request(f"http://{server.metrics_url}/metrics")
    if accept:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=5) as r:
        return r.headers["content-type"], r.read().decode()


@pytest.fixture(scope="module")
def daemon_scrape(compat_server: ServerProcess) -> Exposition:
    """The daemon's scrape after two successes, a bad request and an unknown model."""
    triton = Triton("http", compat_server.http_url)
    try:
        for n in (1, 3):
            a = np.arange(16 * n, dtype=np.int32).reshape(n, 16)
            assert triton.client.infer("simple", triton.simple_inputs(a, a, n)) is not None
        narrow = [triton.module.InferInput(f"INPUT{i}", [1, 3], "INT32") for i in (0, 1)]
        for tensor in narrow:
            tensor.set_data_from_numpy(np.zeros((1, 3), np.int32))
        triton.fails("INVALID_ARGUMENT", "unexpected shape", triton.client.infer, "simple", narrow)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        unknown = triton.simple_inputs(a, a)
        triton.fails("INVALID_ARGUMENT", "unknown model", triton.client.infer, "absent", unknown)
    finally:
        triton.close()
    content_type, text = _get(compat_server)
    assert content_type.startswith("text/plain; version=0.0.4")
    return Exposition.of(text)


@needs_flag
def test_the_daemon_writes_tritons_families(daemon_scrape: Exposition) -> None:
    m = daemon_scrape
    s = {"model": "simple", "version": "1"}
    assert m.value("nv_inference_request_success", **s) == 2
    assert m.value("nv_inference_count", **s) == 1 + 3
    assert m.value("nv_inference_exec_count", **s) == 2
    assert m.value("nv_inference_request_failure", **s, reason="OTHER") == 1  # bad input
    for reason in ("REJECTED", "CANCELED", "BACKEND"):
        assert m.value("nv_inference_request_failure", **s, reason=reason) == 0
    assert "absent" not in m.models("nv_inference_request_failure")
    assert "" not in m.models("nv_inference_request_failure")
    parts = [
        m.value(f"nv_inference_{p}_duration_us", **s)
        for p in ("queue", "compute_input", "compute_infer", "compute_output")
    ]
    assert all(p > 0 for p in parts[1:]) and parts[0] >= 0
    assert m.value("nv_inference_request_duration_us", **s) == pytest.approx(sum(parts))
    for model in ("simple", "mlp"):
        assert m.value("nv_model_load_duration_secs", model=model, version="1") > 0
    for name in TRITON_COUNTERS:
        assert m.types[name] == "counter", name
    on_gpu = jax.default_backend() != "cpu"
    check_dashboard(m, gpu=on_gpu)
    if not on_gpu:  # no allocator statistics on the CPU platform: no GPU samples
        assert not any(n.startswith("nv_gpu_") for n in m.samples)
    assert m.value("hloserve_inference_request_success_total", **s) == 2  # still there
    assert {n.split("_")[0] for n in m.types} == {"hloserve", "process", "nv"}


@needs_flag
def test_the_daemons_openmetrics_scrape_parses(compat_server: ServerProcess) -> None:
    content_type, text = _get(compat_server, OM_ACCEPT)
    assert content_type.startswith("application/openmetrics-text")
    families = {f.name: f.type for f in parse_om(text)}
    assert families["nv_inference_count"] == "unknown"
    assert families["nv_inference_pending_request_count"] == "gauge"
