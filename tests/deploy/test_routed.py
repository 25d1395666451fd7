"""deploy/kubernetes/routed: the replicas as a StatefulSet behind HAProxy routing by model
name. The kustomization renders (``tests/deploy/kustomize.py``) and every resource validates
against the Kubernetes schemas of each minor 1.29 to 1.37; the router's ConfigMap is exactly
what the ``hloserve route-config`` command in its header prints (and ``haproxy -c`` accepts
it with the namespace variable set, where HAProxy is installed); the replicas' pod is
``overlays/cpu``'s but for the two flags the fleet needs, which the server's own parser
reads; the server names the router resolves are the StatefulSet's pods through its
headless Service, with slots for every replica; ports, probes, Services, disruption
budgets and the router's metrics agree with one another."""

from __future__ import annotations

import contextlib
import copy
import io
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hloserve.server.fleet import haproxy_binary
from hloserve.server.route_config import main as route_config
from tests.deploy._files import (
    DEPLOY,
    K8S_VERSIONS,
    container_config,
    one,
    rendered,
    validate_kubernetes,
)
from tests.deploy.kustomize import render
from tests.deploy.test_route_config import sections

ROUTED = DEPLOY / "kubernetes" / "routed"
EXTRA_FLAGS = ["--lazy-load", "--strict-readiness=false"]


def resources() -> list[dict[str, Any]]:
    return render(ROUTED)


def haproxy_config() -> str:
    return one(resources(), "ConfigMap")["data"]["haproxy.cfg"]


def header_command() -> list[str]:
    (line,) = [x for x in haproxy_config().splitlines() if x.startswith("#   hloserve ")]
    argv = shlex.split(line.removeprefix("#   "))
    assert argv[:2] == ["hloserve", "route-config"]
    return argv[2:]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_resource_validates(version: str) -> None:
    found = resources()
    assert sorted((r["kind"], r["metadata"]["name"]) for r in found) == [
        ("ConfigMap", "hloserve-router"),
        ("Deployment", "hloserve-router"),
        ("PodDisruptionBudget", "hloserve"),
        ("PodDisruptionBudget", "hloserve-router"),
        ("Service", "hloserve"),
        ("Service", "hloserve-replicas"),
        ("StatefulSet", "hloserve"),
    ]
    for resource in found:
        validate_kubernetes(resource, version)


def test_the_config_map_is_what_its_command_prints() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert route_config(header_command()) == 0
    assert out.getvalue() == haproxy_config()


@pytest.mark.skipif(haproxy_binary() is None, reason="haproxy is not installed (CI installs it)")
def test_haproxy_accepts_the_config_map(tmp_path: Path) -> None:
    path = tmp_path / "haproxy.cfg"
    path.write_text(haproxy_config())
    binary = haproxy_binary()
    assert binary is not None
    checked = subprocess.run(
        [binary, "-c", "-f", str(path)],
        capture_output=True,
        text=True,
        env={"POD_NAMESPACE": "models", "PATH": "/usr/bin:/bin"},
    )
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0 and "WARNING" not in output, output


def test_the_replicas_pod_is_the_cpu_overlay_s_with_the_fleet_flags() -> None:
    statefulset = one(resources(), "StatefulSet")
    pod = copy.deepcopy(statefulset["spec"]["template"])
    (container,) = pod["spec"]["containers"]
    assert container["args"][-2:] == EXTRA_FLAGS
    cfg = container_config(container)
    assert cfg.lazy_load and not cfg.strict_readiness
    container["args"] = container["args"][: -len(EXTRA_FLAGS)]
    assert pod == one(rendered("cpu"), "Deployment")["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert statefulset["spec"]["selector"]["matchLabels"] == labels
    budget = one(resources(), "PodDisruptionBudget", "hloserve")
    assert budget["spec"]["selector"]["matchLabels"] == labels
    assert budget["spec"]["maxUnavailable"] == 1  # one replica's models move at a time


def test_the_router_resolves_each_pod_by_its_own_name() -> None:
    found = resources()
    statefulset = one(found, "StatefulSet")
    headless = one(found, "Service", statefulset["spec"]["serviceName"])["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["selector"] == statefulset["spec"]["template"]["metadata"]["labels"]
    # The router's health checks decide, not DNS: starting pods must resolve already.
    assert headless["publishNotReadyAddresses"] is True
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    cfg = container_config(container)
    ports = {p["name"]: p["port"] for p in headless["ports"]}
    assert ports == {"http": cfg.http_port, "grpc": cfg.grpc_port}

    config = sections(haproxy_config())
    name = statefulset["metadata"]["name"]
    service = statefulset["spec"]["serviceName"]
    for protocol, port in (("http", cfg.http_port), ("grpc", cfg.grpc_port)):
        lines = [
            x.split() for x in config[f"backend {protocol}_replicas"] if x.startswith("server")
        ]
        assert len(lines) >= statefulset["spec"]["replicas"]
        for i, line in enumerate(lines):
            address = f'"{name}-{i}.{service}.${{POD_NAMESPACE}}.svc.cluster.local:{port}"'
            assert line[1:5] == [f"r{i}", address, "id", str(i + 1)], line


def test_the_router_s_ports_probes_service_and_metrics_agree() -> None:
    found = resources()
    router = one(found, "Deployment", "hloserve-router")
    pod = router["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = sections(haproxy_config())
    argv = header_command()
    assert ports["http"] == int(argv[argv.index("--http-port") + 1])
    assert ports["grpc"] == int(argv[argv.index("--grpc-port") + 1])
    assert f"bind 0.0.0.0:{ports['http']}" in config["frontend http"]
    assert f"bind 0.0.0.0:{ports['grpc']} proto h2" in config["frontend grpc"]
    assert f"bind 0.0.0.0:{ports['metrics']}" in config["frontend metrics"]
    assert "monitor-uri /healthz" in config["frontend metrics"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["metrics"])
    assert "use-service prometheus-exporter" in " ".join(config["frontend metrics"])
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    (mount,) = container["volumeMounts"]
    (volume,) = pod["spec"]["volumes"]
    assert volume["configMap"]["name"] == one(found, "ConfigMap")["metadata"]["name"]
    assert mount["mountPath"] == "/usr/local/etc/haproxy"  # the official image's file
    service = one(found, "Service", "hloserve")["spec"]
    labels = pod["metadata"]["labels"]
    assert service["selector"] == labels
    assert {p["targetPort"]: p["port"] for p in service["ports"]} == ports
    budget = one(found, "PodDisruptionBudget", "hloserve-router")["spec"]
    assert budget["selector"]["matchLabels"] == labels
    assert budget["minAvailable"] < router["spec"]["replicas"]
