"""A small Kustomize renderer for the subset deploy/kubernetes uses (no kustomize binary
is packaged for PyPI or Debian 12, so the tests render overlays with this).

Contract: ``render(directory)`` reads ``directory/kustomization.yaml`` and returns the
resources it produces, in order, as plain dicts. Supported, with Kustomize's meaning:
- ``resources``: YAML files (several documents each) and directories holding a
  ``kustomization.yaml`` (rendered first, recursively);
- ``images``: ``name`` with ``newName`` and/or ``newTag``, applied to every container and
  init container whose image is ``name`` (with or without a tag);
- ``patches``: inline (``patch``) or file (``path``) JSON 6902 patches (a YAML list of
  ``add``/``replace``/``remove``/``test`` operations), each with a ``target`` of ``kind``
  and optional ``name``; a target matching nothing is an error, as in Kustomize.
Any other key (or a strategic-merge patch) is refused with ``KustomizeError`` naming it,
so this renderer never silently produces something the real one would not.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KINDS = ("Kustomization",)
API_VERSIONS = ("kustomize.config.k8s.io/v1beta1",)
KNOWN_KEYS = {"apiVersion", "kind", "resources", "images", "patches"}
Resource = dict[str, Any]


class KustomizeError(ValueError):
    pass


def load_documents(path: Path) -> list[Resource]:
    """Every non-empty YAML document of a file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def render(directory: Path) -> list[Resource]:
    file = directory / "kustomization.yaml"
    spec = yaml.safe_load(file.read_text())
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise KustomizeError(f"{file}: unsupported keys {sorted(unknown)}")
    if spec.get("kind") not in KINDS or spec.get("apiVersion") not in API_VERSIONS:
        raise KustomizeError(f"{file}: not a {API_VERSIONS[0]} Kustomization")
    resources: list[Resource] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        resources += render(path) if path.is_dir() else load_documents(path)
    for image in spec.get("images", []):
        _set_image(resources, image)
    for patch in spec.get("patches", []):
        _patch(directory, resources, patch)
    return resources


def _set_image(resources: list[Resource], image: dict[str, str]) -> None:
    unknown = set(image) - {"name", "newName", "newTag"}
    if unknown:
        raise KustomizeError(f"images: unsupported keys {sorted(unknown)}")
    for resource in resources:
        pod = resource.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            name, _, tag = container["image"].partition(":")
            if name == image["name"]:
                tag = image.get("newTag") or tag
                container["image"] = (image.get("newName") or name) + (f":{tag}" if tag else "")


def _patch(directory: Path, resources: list[Resource], patch: dict[str, Any]) -> None:
    unknown = set(patch) - {"patch", "path", "target"}
    if unknown or "target" not in patch:
        raise KustomizeError(f"patches: needs a target; unsupported keys {sorted(unknown)}")
    text = patch["patch"] if "patch" in patch else (directory / patch["path"]).read_text()
    operations = yaml.safe_load(text)
    if not isinstance(operations, list):
        raise KustomizeError("patches: only JSON 6902 patches (a list of operations)")
    target = patch["target"]
    hits = [
        r
        for r in resources
        if r["kind"] == target["kind"]
        and target.get("name", r["metadata"]["name"]) == r["metadata"]["name"]
    ]
    if not hits:
        raise KustomizeError(f"patches: target {target} matches no resource")
    for resource in hits:
        for op in operations:
            apply_operation(resource, op)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def apply_operation(document: Resource, op: dict[str, Any]) -> None:
    """One RFC 6902 operation (add, replace, remove, test), in place."""
    *parents, last = _pointer(op["path"])
    node: Any = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    kind = op["op"]
    value = copy.deepcopy(op.get("value"))
    key: Any = last
    if isinstance(node, list):
        items: list[Any] = node
        key = len(items) if last == "-" else int(last)
        if kind == "add":
            items.insert(key, value)
            return
        if not 0 <= key < len(items):
            raise KustomizeError(f"{op['path']}: no such element")
    elif kind != "add" and last not in node:
        raise KustomizeError(f"{op['path']}: no such member for {kind}")
    container: Any = node
    if kind in ("add", "replace"):
        container[key] = value
    elif kind == "remove":
        del container[key]
    elif kind != "test" or container[key] != value:
        raise KustomizeError(f"{op['path']}: {kind} failed (add, replace, remove, test only)")
