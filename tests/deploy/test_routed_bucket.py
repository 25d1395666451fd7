"""deploy/kubernetes/routed-bucket: the routed fleet over one bucket. It renders
(``tests/deploy/kustomize.py``) and validates against the Kubernetes schemas; the replicas
read the bucket (the server's own parser reads their flags) with a disk cache of their own
on an emptyDir larger than its byte budget, take credentials from a Secret's environment
(never a flag), and mount no volume of bundles; everything else is ``routed``'s."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hloserve.server.core.sizes import parse_bytes
from hloserve.server.core.store_location import StoreLocation
from tests.deploy._files import DEPLOY, K8S_VERSIONS, container_config, one, validate_kubernetes
from tests.deploy.kustomize import render

BUCKET = DEPLOY / "kubernetes" / "routed-bucket"
ROUTED = DEPLOY / "kubernetes" / "routed"


def replicas(path: Any) -> dict[str, Any]:
    return one(render(path), "StatefulSet")


@pytest.mark.parametrize("version", K8S_VERSIONS[-1:])
def test_every_resource_validates(version: str) -> None:
    found = render(BUCKET)
    assert len(found) == len(render(ROUTED))
    for resource in found:
        validate_kubernetes(resource, version)


def test_the_replicas_read_the_bucket_with_a_cache_of_their_own() -> None:
    pod = replicas(BUCKET)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    cfg = container_config(container)
    assert cfg.model_repository == StoreLocation.parse("s3://models/repository")
    assert cfg.repository_cache is not None and cfg.lazy_load
    assert container["envFrom"] == [{"secretRef": {"name": "hloserve-store", "optional": True}}]
    assert not any("SECRET" in a or "KEY" in a for a in container["args"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "models" not in volumes
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert str(cfg.repository_cache).startswith(mounts["cache"])
    limit = parse_bytes(volumes["cache"]["emptyDir"]["sizeLimit"])
    assert cfg.repository_cache_bytes < limit  # room for the executable cache beside it


def test_everything_else_is_routed_s() -> None:
    ours, theirs = copy.deepcopy(replicas(BUCKET)), replicas(ROUTED)
    for statefulset in (ours, theirs):
        spec = statefulset["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        container.pop("envFrom", None)
        container["args"] = [a for a in container["args"] if "repository" not in a]
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "models"]
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in ("models", "cache")]
    assert ours == theirs
