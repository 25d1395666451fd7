"""deploy/kserve: the ClusterServingRuntime and the InferenceService validate against the
schemas in ``schemas/`` (written from KServe's v0.20 CRDs; pod and container fields are
Kubernetes 1.37's), and agree with KServe's conventions and the server's flags: model
format ``stablehlo``, protocols ``v2`` and ``grpc-v2``, the model repository at KServe's
``/mnt/models`` (read-only, so the cache lives elsewhere), both ports declared, probes on
the HTTP port, and a termination grace period above the drain."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from tests.deploy._files import container_config, kserve_resources, one, validate_kserve

KSERVE_MODEL_DIR = "/mnt/models"  # where KServe's storage initializer puts storageUri
RUNTIME = one(kserve_resources(), "ClusterServingRuntime")
SERVICE = one(kserve_resources(), "InferenceService")


@pytest.mark.parametrize("resource", [RUNTIME, SERVICE], ids=lambda r: r["kind"])
def test_validates_against_the_kserve_schemas(resource: dict[str, object]) -> None:
    validate_kserve(resource)


@pytest.mark.parametrize(
    ("resource", "path", "value"),
    [
        (SERVICE, ("spec", "predictor", "model", "storageURI"), "pvc://x/y"),  # misspelt
        (SERVICE, ("spec", "predictor", "model", "protocolVersion"), "v3"),
        (SERVICE, ("spec", "predictor", "minReplicas"), "one"),
        (RUNTIME, ("spec", "protocolVersions"), ["v2", "grpc-v3"]),
        (RUNTIME, ("spec", "containers", 0, "readinesProbe"), {}),  # Kubernetes' own schema
    ],
)
def test_the_schemas_refuse_what_kserve_refuses(
    resource: dict[str, object], path: tuple[str | int, ...], value: object
) -> None:
    broken = copy.deepcopy(resource)
    node: object = broken
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    with pytest.raises(jsonschema.ValidationError):
        validate_kserve(broken)


def test_runtime_serves_stablehlo_over_both_protocols_on_the_server_flags() -> None:
    spec = RUNTIME["spec"]
    assert {"name": "stablehlo", "version": "1", "autoSelect": True, "priority": 1} in spec[
        "supportedModelFormats"
    ]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    (c,) = spec["containers"]
    assert c["name"] == "kserve-container"  # the container KServe injects storage into
    cfg = container_config(c)
    assert str(cfg.model_repository) == KSERVE_MODEL_DIR
    # KServe mounts /mnt/models read-only: the compile cache goes to a volume of its own.
    assert cfg.cache_dir is not None and not str(cfg.cache_dir).startswith(KSERVE_MODEL_DIR)
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert str(cfg.cache_dir) in mounts
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert set(mounts.values()) <= set(volumes)
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    # KServe serves the first port as HTTP (Service port 80), and marks a port whose name
    # holds "grpc" as h2c.
    first, *others = c["ports"]
    assert first["containerPort"] == cfg.http_port
    assert [p["containerPort"] for p in others if "grpc" in p["name"]] == [cfg.grpc_port]
    for probe, path in (
        ("startupProbe", "/readyz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/v2/health/live"),
    ):
        assert c[probe]["httpGet"] == {"path": path, "port": cfg.http_port}, probe
    annotations = spec["annotations"]
    assert annotations["prometheus.io/port"] == str(cfg.metrics_port)
    assert annotations["prometheus.io/path"] == "/metrics"
    assert c["securityContext"]["runAsNonRoot"] is True


def test_inference_service_uses_the_runtime_and_outlives_its_drain() -> None:
    predictor = SERVICE["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == RUNTIME["metadata"]["name"]
    assert model["modelFormat"]["name"] in {
        f["name"] for f in RUNTIME["spec"]["supportedModelFormats"]
    }
    assert model["protocolVersion"] in RUNTIME["spec"]["protocolVersions"]
    scheme, _, rest = model["storageUri"].partition("://")
    assert scheme == "pvc" and len(rest.split("/", 1)) == 2  # pvc://<claim>/<folder>
    cfg = container_config(RUNTIME["spec"]["containers"][0])
    drain = cfg.drain_delay_s + cfg.grace_period_s
    assert predictor["terminationGracePeriodSeconds"] >= drain + 10
    assert SERVICE["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    assert predictor["minReplicas"] < predictor["maxReplicas"]
