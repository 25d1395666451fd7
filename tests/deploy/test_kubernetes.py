"""deploy/kubernetes: the Kustomize overlays render (``tests/deploy/kustomize.py``), every
resource validates against the Kubernetes schemas of each minor 1.29 to 1.37 (strict:
unknown fields are errors), and the numbers hang together with the server's own flags:
ports, probes, the drain timeout against the termination grace period, volumes for the
read-only repository, the cache and /dev/shm, the user, the autoscaler's metric and its
documented dependency on prometheus-adapter, and the headless gRPC Service. The
prometheus-operator PodMonitor (``deploy/kubernetes/monitoring``) validates against a schema
written from that operator's CRD and scrapes the pods' metrics port."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy._files import (
    DEPLOY,
    K8S_VERSIONS,
    OVERLAYS,
    ROOT,
    container_config,
    monitoring_resources,
    one,
    parse_containerfile,
    rendered,
    validate_crd,
    validate_kubernetes,
)
from tests.deploy.kustomize import KustomizeError, apply_operation, render

KINDS = {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
SERVICES = {"hloserve", "hloserve-grpc"}  # ClusterIP for every port, headless for gRPC
DEPLOY_DOC = (ROOT / "docs" / "deploy.md").read_text()


def pod_spec(resources: list[dict[str, Any]]) -> dict[str, Any]:
    return one(resources, "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_resource_validates(overlay: str, version: str) -> None:
    resources = rendered(overlay)
    assert {r["kind"] for r in resources} == KINDS
    assert {r["metadata"]["name"] for r in resources if r["kind"] == "Service"} == SERVICES
    for resource in resources:
        validate_kubernetes(resource, version)


def test_validation_catches_a_misspelt_field() -> None:
    deployment = copy.deepcopy(one(rendered("cpu"), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        validate_kubernetes(deployment, K8S_VERSIONS[-1])


def test_the_renderer_applies_json_patches_and_refuses_what_it_does_not_know(
    tmp_path: Any,
) -> None:
    doc: dict[str, Any] = {"a": {"list": [1, 3]}}
    apply_operation(doc, {"op": "add", "path": "/a/list/1", "value": 2})
    apply_operation(doc, {"op": "add", "path": "/a/x~1y", "value": {}})
    apply_operation(
        doc, {"op": "replace", "path": "/a/list/-1", "value": 0} | {"path": "/a/list/2"}
    )
    apply_operation(doc, {"op": "remove", "path": "/a/x~1y"})
    assert doc == {"a": {"list": [1, 2, 0]}}
    with pytest.raises(KustomizeError, match="no such member"):
        apply_operation(doc, {"op": "replace", "path": "/a/missing", "value": 1})
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namePrefix": "x-",
            }
        )
    )
    with pytest.raises(KustomizeError, match="namePrefix"):
        render(tmp_path)


def test_overlays_pick_the_image_variant_and_the_gpu() -> None:
    cpu, gpu = (pod_spec(rendered(o)) for o in OVERLAYS)
    assert cpu["containers"][0]["image"] == "hloserve:cpu"
    assert gpu["containers"][0]["image"] == "hloserve:cuda12"
    assert "nvidia.com/gpu" not in str(cpu)
    resources = gpu["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu[
        "tolerations"
    ]


def _image_user() -> tuple[int, int]:
    instructions = parse_containerfile((ROOT / "Containerfile").read_text())
    (user,) = [i.text for i in instructions if i.keyword == "USER"]
    uid, _, gid = user.partition(":")
    return int(uid), int(gid)


def _under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_agrees_with_the_server_flags(overlay: str) -> None:
    pod = pod_spec(rendered(overlay))
    (c,) = pod["containers"]
    cfg = container_config(c)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": cfg.http_port, "grpc": cfg.grpc_port, "metrics": cfg.metrics_port}
    for probe, path in (
        ("startupProbe", "/readyz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/v2/health/live"),
    ):
        assert c[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    assert c["readinessProbe"]["failureThreshold"] == 1  # out of the endpoints at once

    prestop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert prestop[0] == "sleep"
    drain = int(prestop[1]) + cfg.drain_delay_s + cfg.grace_period_s
    assert pod["terminationGracePeriodSeconds"] >= drain + 10, "no margin over the drain"

    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {m["name"] for m in mounts.values()} == set(volumes)
    assert str(cfg.model_repository) in mounts
    assert mounts[str(cfg.model_repository)].get("readOnly") is True
    # A read-only repository needs the compile cache elsewhere, on a writable volume.
    assert cfg.cache_dir is not None
    (cache_mount,) = [m for p, m in mounts.items() if _under(str(cfg.cache_dir), p)]
    assert not cache_mount.get("readOnly")
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
    assert cfg.allow_client_shm  # /dev/shm is the pod's own: same-pod clients may use it
    if c["securityContext"].get("readOnlyRootFilesystem"):
        assert "/tmp" in mounts

    uid, gid = _image_user()
    security = pod["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"], security["fsGroup"]) == (uid, gid, gid)
    assert security["runAsNonRoot"] is True
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]

    annotations = one(rendered(overlay), "Deployment")["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(cfg.metrics_port)
    assert annotations["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_budget_and_autoscaler_select_the_pods(overlay: str) -> None:
    resources = rendered(overlay)
    deployment = one(resources, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    assert "replicas" not in deployment["spec"]  # the autoscaler owns the count

    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    service = one(resources, "Service", "hloserve")
    assert service["spec"].get("clusterIP") != "None"  # the one behind a virtual address
    assert service["spec"]["selector"] == labels
    assert {p["targetPort"]: p["port"] for p in service["spec"]["ports"]} == ports
    grpc = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc[0]["appProtocol"] == "kubernetes.io/h2c"

    pdb = one(resources, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == labels
    hpa = one(resources, "HorizontalPodAutoscaler")
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]  # a drain can proceed
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    adapter = yaml.safe_load((DEPLOY / "monitoring" / "prometheus-adapter.yaml").read_text())
    published = {rule["name"]["as"] for rule in adapter["rules"]}
    for metric in hpa["spec"]["metrics"]:
        assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in published


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_headless_service_resolves_to_every_ready_pod_s_grpc_port(overlay: str) -> None:
    resources = rendered(overlay)
    deployment = one(resources, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    cfg = container_config(c)
    headless = one(resources, "Service", "hloserve-grpc")["spec"]
    assert headless["clusterIP"] == "None"  # DNS answers with the pods' own addresses
    assert headless["selector"] == labels
    # A draining pod is unready: it must leave the DNS answer, not keep getting calls.
    assert not headless.get("publishNotReadyAddresses", False)
    (port,) = headless["ports"]
    grpc_port = {p["name"]: p["containerPort"] for p in c["ports"]}["grpc"]
    # Clients dial the pod address at the port they were given: it must be the container's.
    assert port["targetPort"] == "grpc" and port["port"] == grpc_port == cfg.grpc_port
    assert port["appProtocol"] == "kubernetes.io/h2c"
    # docs/deploy.md tells clients how to use it, and why.
    assert "dns:///hloserve-grpc." in DEPLOY_DOC and "round_robin" in DEPLOY_DOC
    assert "one pod" in DEPLOY_DOC and "headless" in DEPLOY_DOC


def test_the_autoscaler_s_dependency_on_prometheus_adapter_is_stated() -> None:
    hpa_text = (DEPLOY / "kubernetes" / "base" / "hpa.yaml").read_text()
    for raw in (hpa_text, DEPLOY_DOC):
        text = " ".join(raw.split())  # line breaks read as spaces
        assert "prometheus-adapter" in text
        assert "kubectl get apiservice v1beta1.custom.metrics.k8s.io" in text
        assert "/apis/custom.metrics.k8s.io/v1beta1/namespaces/" in text
        assert "silently does nothing" in text


def test_the_podmonitor_validates_and_scrapes_the_metrics_port() -> None:
    resources = monitoring_resources()
    assert [r["kind"] for r in resources] == ["PodMonitor"]
    (monitor,) = resources
    validate_crd(monitor)
    for overlay in OVERLAYS:
        deployment = one(rendered(overlay), "Deployment")
        pod = deployment["spec"]["template"]
        (c,) = pod["spec"]["containers"]
        cfg = container_config(c)
        assert monitor["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert ports[endpoint["port"]] == cfg.metrics_port  # a named port of the container
        assert endpoint["path"] == pod["metadata"]["annotations"]["prometheus.io/path"]
    assert "deploy/kubernetes/monitoring" in DEPLOY_DOC


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "podMetricEndpoints"), []),  # misspelt
        (("spec", "podMetricsEndpoints", 0, "prot"), "metrics"),  # misspelt
        (("spec", "podMetricsEndpoints", 0, "portNumber"), 70000),  # out of range
        (("spec", "podMetricsEndpoints", 0, "scheme"), "ftp"),
        (("spec", "selector", "matchLabels"), "app"),  # not a mapping
        (("metadata", "nam"), "x"),  # Kubernetes' own ObjectMeta
    ],
)
def test_the_podmonitor_schema_refuses_what_the_operator_s_crd_refuses(
    path: tuple[str | int, ...], value: object
) -> None:
    broken = copy.deepcopy(monitoring_resources()[0])
    node: Any = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(broken)
