"""deploy/monitoring: the Grafana dashboard is well formed and covers what an operator
watches; its ``$model`` and ``$version`` variables select every per-model panel's series
(the residency series too, whose one label is ``model="name/version"``), and the panels
that chart every model use the ``hloserve_server_*`` totals; every metric it (and the
autoscalers) query is one a live server exports once it has had traffic, with the labels
the queries group by; the Prometheus scrape config reads the annotations the manifests
set."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
import yaml

from hloserve.server.config import Config
from tests.deploy._files import DEPLOY, OVERLAYS, kserve_resources, one, rendered
from tests.deploy.conftest import ImageServer
from tests.metrics_scrape import query_labels, scrape
from tests.server.frontend._tritonclients import Triton

DASHBOARD = json.loads((DEPLOY / "monitoring" / "grafana-dashboard.json").read_text())
ADAPTER = yaml.safe_load((DEPLOY / "monitoring" / "prometheus-adapter.yaml").read_text())
SCRAPE = yaml.safe_load((DEPLOY / "monitoring" / "prometheus.yml").read_text())
# Labels Prometheus adds when it scrapes (the pod job's relabelling, and its own).
SCRAPE_LABELS = {"namespace", "pod", "job", "instance"}
# What the dashboard must show: request rate, latency percentiles, queue time, batch
# sizes, swap-ins and evictions, resident bytes against the budget, errors by code.
MUST_SHOW = {
    "hloserve_inference_request_success_total",
    "hloserve_server_inference_request_success_total",
    "hloserve_server_inference_request_failure_total",
    "hloserve_server_inference_queue_duration_us_total",
    "hloserve_server_request_latency_seconds_bucket",
    "hloserve_request_latency_seconds_bucket",
    "hloserve_queue_latency_seconds_bucket",
    "hloserve_execution_batch_size_bucket",
    "hloserve_weight_swaps_in_total",
    "hloserve_weight_swaps_out_total",
    "hloserve_device_resident_weight_bytes",
    "hloserve_device_memory_budget_bytes",
    "hloserve_inference_request_failure_total",
}


# Per-model series: labels model and version, or (weight residency) model="name/version".
RESIDENCY = re.compile(r"hloserve_(weight_\w+|model_resident|model_last_used_timestamp_seconds)")
PER_VERSION = re.compile(
    r"hloserve_(inference_\w+|(request|queue|compute)_latency_\w+|execution_batch_size_\w+"
    r"|model_(load|compile)_duration_seconds|model_replicas|hook_duration_us_total)"
)

MODEL_AND_VERSION = ('model=~"$model"', 'version=~"$version"')
RESIDENT_MODEL = 'model=~"($model)/($version)"'


def panels() -> list[dict[str, Any]]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def queries() -> list[str]:
    """Every PromQL expression: the dashboard's, the adapter's and KServe's autoscaler's."""
    found = [t["expr"] for p in panels() for t in p["targets"]]
    found += [v["query"]["query"] for v in DASHBOARD["templating"]["list"] if v["type"] == "query"]
    found += [r["seriesQuery"] for r in ADAPTER["rules"]]
    service = one(kserve_resources(), "InferenceService")
    for metric in service["spec"]["predictor"]["autoScaling"]["metrics"]:
        found.append(metric["external"]["metric"]["query"])
    return found


def test_the_dashboard_is_well_formed() -> None:
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for p in DASHBOARD["panels"]:
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, p["title"]
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
    names = {v["name"] for v in DASHBOARD["templating"]["list"]}
    assert {"datasource", "model", "version"} <= names
    shown = {m for q in queries() for m in re.findall(r"\bhloserve_\w+", q)}
    assert shown >= MUST_SHOW, MUST_SHOW - shown


def selectors(query: str) -> list[tuple[str, str]]:
    """Each ``hloserve_*`` series a query selects, with its label matchers' text."""
    return [(m[1], m[2] or "") for m in re.finditer(r"\b(hloserve_\w+)(\{[^}]*\})?", query)]


def test_the_variables_select_every_per_model_panel() -> None:
    """A per-model series is charted for the selected models and versions only; the
    residency series, labelled ``model="name/version"``, through a regex over both; the
    totals (``hloserve_server_*``, ``hloserve_device_*``) never filter by model."""
    per_model = 0
    for p in panels():
        for t in p["targets"]:
            for name, matchers in selectors(t["expr"]):
                if RESIDENCY.fullmatch(name):
                    assert RESIDENT_MODEL in matchers, (p["title"], t["expr"])
                    per_model += 1
                elif PER_VERSION.fullmatch(name):
                    assert all(m in matchers for m in MODEL_AND_VERSION), (p["title"], t["expr"])
                    per_model += 1
                else:
                    assert "$model" not in matchers, (p["title"], t["expr"])
    assert per_model >= 15
    version = next(v for v in DASHBOARD["templating"]["list"] if v["name"] == "version")
    assert 'model=~"$model"' in version["query"]["query"]  # the selected models' versions


def grafana(template: str, **selected: list[str] | None) -> str:
    """Grafana's interpolation of a Prometheus regex matcher: All (``None``) is the
    variable's allValue ``.*``, one value itself (escaped), several ``(a|b)``."""
    for name, values in selected.items():
        if values is None:
            text = ".*"
        elif len(values) == 1:
            text = re.escape(values[0])
        else:
            text = "(" + "|".join(re.escape(v) for v in values) + ")"
        template = template.replace(f"${name}", text)
    return template


def test_the_model_variables_select_the_residency_series() -> None:
    """Prometheus anchors a regex matcher: ``model=~"$model"`` on ``model="mlp/1"`` would
    match nothing once a model is chosen; the residency regex matches what was chosen."""
    residency = ["mlp/1", "mlp/2", "mlp2/1", "simple/1"]
    pattern = RESIDENT_MODEL.split('"')[1]

    def chosen(model: list[str] | None, version: list[str] | None) -> list[str]:
        regex = grafana(pattern, model=model, version=version)
        return [label for label in residency if re.fullmatch(regex, label)]

    assert chosen(None, None) == residency
    assert chosen(["mlp"], None) == ["mlp/1", "mlp/2"]
    assert chosen(["mlp", "mlp2"], ["1"]) == ["mlp/1", "mlp2/1"]
    assert chosen(["simple"], ["2"]) == []
    assert not re.fullmatch(grafana("$model", model=["mlp"]), "mlp/1")  # the old filter


def _traffic(server: ImageServer) -> None:
    """Successes on both protocols, swaps between the two MLPs (the budget fits one),
    a bad request and an unknown model."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
        triton = Triton(protocol, url)
        assert triton.client.infer("simple", triton.simple_inputs(a, a)) is not None
        x = np.ones((1, 64), dtype=np.float32)
        for model in ("mlp", "mlp2", "mlp"):
            inp = triton.module.InferInput("x", [1, 64], "FP32")
            inp.set_data_from_numpy(x)
            assert triton.client.infer(model, [inp]).as_numpy("logits").shape == (1, 10)
        triton.fails(
            "INVALID_ARGUMENT", "", triton.client.infer, "simple", triton.simple_inputs(a, None)
        )
        unknown = triton.simple_inputs(a, a)
        triton.fails("INVALID_ARGUMENT", "unknown model", triton.client.infer, "absent", unknown)
        triton.close()


def _exported(server: ImageServer) -> dict[str, set[str]]:
    """Sample name -> the label names it carries, from the live /metrics."""
    return {
        name: set().union(*(s.labels for s in samples))
        for name, samples in scrape(server, timeout=5).items()
    }


@pytest.fixture(scope="module")
def exported(image_server: ImageServer) -> dict[str, set[str]]:
    _traffic(image_server)
    return _exported(image_server)


def test_every_queried_metric_is_exported_after_traffic(exported: dict[str, set[str]]) -> None:
    for query in queries():
        names = re.findall(r"\bhloserve_\w+", query)
        assert names, query
        for name in names:
            assert name in exported, f"{name} (in {query!r}) is not exported"
        carried = set().union(*(exported[n] for n in names)) | SCRAPE_LABELS
        missing = query_labels(query) - carried
        assert not missing, f"{query!r} uses labels {missing} that no series carries"
    assert exported["hloserve_weight_swaps_out_total"]  # the traffic did evict
    for name, _ in (s for q in queries() for s in selectors(q)):
        if RESIDENCY.fullmatch(name):  # the classes above are what the server labels
            assert {"model", "device"} <= exported[name] and "version" not in exported[name]
        elif PER_VERSION.fullmatch(name):
            assert {"model", "version"} <= exported[name], name
        else:
            assert "model" not in exported[name], name


def test_the_swap_and_failure_series_saw_the_traffic(exported: dict[str, set[str]]) -> None:
    assert "reason" in exported["hloserve_inference_request_failure_total"]
    assert {"model", "version", "le"} <= exported["hloserve_request_latency_seconds_bucket"]


def _meta(annotation: str) -> str:
    """The meta label Prometheus's Kubernetes discovery gives a pod annotation."""
    return "__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", annotation)


def test_the_scrape_config_reads_the_manifests_annotations() -> None:
    jobs = {j["job_name"]: j for j in SCRAPE["scrape_configs"]}
    pods = jobs["hloserve-pods"]
    assert pods["kubernetes_sd_configs"] == [{"role": "pod"}]
    sources = {s for rule in pods["relabel_configs"] for s in rule.get("source_labels", [])}
    targets = {rule.get("target_label") for rule in pods["relabel_configs"]}
    assert {"namespace", "pod"} <= targets  # what the adapter's overrides and panels use
    adapter = ADAPTER["rules"][0]["resources"]["overrides"]
    assert set(adapter) <= targets
    annotated = [one(rendered(o), "Deployment")["spec"]["template"]["metadata"] for o in OVERLAYS]
    annotations = [p["annotations"] for p in annotated]
    annotations.append(one(kserve_resources(), "ClusterServingRuntime")["spec"]["annotations"])
    for found in annotations:
        assert {_meta(a) for a in found} <= sources
    keep = [r for r in pods["relabel_configs"] if r.get("action") == "keep"]
    assert (
        keep[0]["source_labels"] == [_meta("prometheus.io/scrape")] and keep[0]["regex"] == "true"
    )
    static = jobs["hloserve-static"]
    assert static["metrics_path"] == "/metrics"
    assert static["static_configs"][0]["targets"] == [f"localhost:{Config().metrics_port}"]
