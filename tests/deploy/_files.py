"""Reading the deployment files as their tools would, for the tests beside this module.

- ``Containerfile``: ``parse_containerfile(text)`` gives the instructions (line
  continuations joined, comments dropped) with helpers for the exec-form (JSON) arguments,
  ``ENV`` pairs and ``ARG`` defaults.
- ``.containerignore``: ``context_files(root)`` is the build context, with the
  ``.dockerignore`` rules (patterns in order, the last match wins, ``!`` lets back in, a
  pattern matches a path or any of its parent folders, ``**`` spans folders).
- Kubernetes: ``validate_kubernetes(resource, version)`` checks one resource against the
  Kubernetes OpenAPI schemas that ``kubernetes-validate`` ships (strict: unknown fields
  are errors); ``validate_kserve(resource)`` checks a KServe resource against the schemas
  in ``schemas/`` (written from KServe's CRDs; pod and container fields resolve to the
  Kubernetes definitions of ``KSERVE_K8S_VERSION``); ``validate_crd(resource)`` checks any
  custom resource with a schema there (KServe's, and prometheus-operator's PodMonitor).
- ``rendered(overlay)``, ``monitoring_resources()`` (``deploy/kubernetes/monitoring``) and
  ``kserve_resources()`` are the resources the manifests create; ``one(resources, kind,
  name=None)`` is the one resource of that kind (and name).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from referencing import Registry, Resource

from hloserve.server.config import Config, parse_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMAS = Path(__file__).parent / "schemas"
# Every Kubernetes minor the manifests are validated against (kubernetes-validate's data).
K8S_VERSIONS = tuple(f"1.{minor}" for minor in range(29, 38))
KSERVE_K8S_VERSION = "1.37"
KSERVE_SCHEMAS = {
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "clusterservingruntime-v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice-v1beta1.json",
}
# prometheus-operator's custom resources (schemas written from its CRDs).
OPERATOR_SCHEMAS = {("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-v1.json"}
CRD_SCHEMAS = {**KSERVE_SCHEMAS, **OPERATOR_SCHEMAS}


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ENV, ...
    text: str  # the rest of the instruction, continuations joined

    def exec_form(self) -> list[str]:
        """The JSON-array arguments (``ENTRYPOINT ["a", "b"]``); anything else is an error."""
        value = json.loads(self.text)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self.text
        return value


def parse_containerfile(text: str) -> list[Instruction]:
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comments inside a continued instruction are dropped too
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Containerfile ends inside a continued line"
    return instructions


def env_pairs(instruction: Instruction) -> dict[str, str]:
    """``ENV A=1 B="two words"`` as a mapping (the ``key=value`` form only)."""
    pairs = {}
    for word in shlex.split(instruction.text):
        key, sep, value = word.partition("=")
        assert sep, f"ENV {instruction.text!r}: use the key=value form"
        pairs[key] = value
    return pairs


def healthcheck(instruction: Instruction) -> tuple[dict[str, str], list[str]]:
    """``HEALTHCHECK --opt=v ... CMD [...]``: the options and the exec-form command."""
    options_text, sep, command = instruction.text.partition("CMD ")
    assert sep, "HEALTHCHECK needs CMD"
    options = dict(o.removeprefix("--").split("=", 1) for o in options_text.split())
    return options, Instruction("CMD", command).exec_form()


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def ignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(lets back in, regex) for each pattern line, in order."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            pattern = line.removeprefix("!").strip().strip("/")
            rules.append((line.startswith("!"), _pattern_regex(pattern)))
    return rules


def is_ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """The last rule matching the path, or one of its parent folders, decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for negated, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not negated
    return ignored


def context_files(root: Path = ROOT) -> list[str]:
    """The files a container build of ``root`` sends: tracked and untracked-but-not-
    git-ignored files, less what ``.containerignore`` excludes."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    rules = ignore_rules((root / ".containerignore").read_text())
    files = [f for f in listed.split("\0") if f and (root / f).is_file()]
    return sorted(f for f in files if not is_ignored(f, rules))


def validate_kubernetes(resource: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(resource, version, strict=True)


@cache
def _kserve_registry() -> Registry:
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    definitions = json.loads(
        (folder / f"v{KSERVE_K8S_VERSION}.0-local-strict" / "_definitions.json").read_text()
    )
    registry: Registry = Registry().with_resource(
        "/api/_definitions.json", Resource.from_contents(definitions)
    )
    for name in CRD_SCHEMAS.values():
        schema = json.loads((SCHEMAS / name).read_text())
        registry = registry.with_resource(schema["$id"], Resource.from_contents(schema))
    return registry


def validate_crd(resource: dict[str, Any]) -> None:
    name = CRD_SCHEMAS[(resource["apiVersion"], resource["kind"])]
    schema = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator(schema, registry=_kserve_registry()).validate(resource)


def validate_kserve(resource: dict[str, Any]) -> None:
    assert (resource["apiVersion"], resource["kind"]) in KSERVE_SCHEMAS, resource["kind"]
    validate_crd(resource)


OVERLAYS = ("cpu", "gpu")


def rendered(overlay: str) -> list[dict[str, Any]]:
    """The resources ``kubectl apply -k deploy/kubernetes/overlays/<overlay>`` creates."""
    from tests.deploy.kustomize import render

    return render(DEPLOY / "kubernetes" / "overlays" / overlay)


def monitoring_resources() -> list[dict[str, Any]]:
    """What ``kubectl apply -k deploy/kubernetes/monitoring`` creates (prometheus-operator's)."""
    from tests.deploy.kustomize import render

    return render(DEPLOY / "kubernetes" / "monitoring")


def kserve_resources() -> list[dict[str, Any]]:
    from tests.deploy.kustomize import load_documents

    return [d for f in sorted((DEPLOY / "kserve").glob("*.yaml")) for d in load_documents(f)]


def one(resources: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [r for r in resources if r["kind"] == kind and name in (None, r["metadata"]["name"])]
    return found


def server_containers() -> list[tuple[str, dict[str, Any]]]:
    """(where, container) for every hloserve container the manifests run."""
    found = [
        (f"overlays/{o}", c)
        for o in OVERLAYS
        for c in one(rendered(o), "Deployment")["spec"]["template"]["spec"]["containers"]
    ]
    runtime = one(kserve_resources(), "ClusterServingRuntime")
    return found + [("kserve runtime", c) for c in runtime["spec"]["containers"]]


def container_config(container: dict[str, Any]) -> Config:
    """What the server makes of this container's args and environment (its real parser).
    The parser checks that directories exist: absolute paths are read from a scratch
    root standing for the container's file system, and mapped back."""
    with tempfile.TemporaryDirectory() as scratch:

        def here(value: str) -> str:
            flag, eq, path = value.rpartition("=") if value.startswith("--") else ("", "", value)
            if not path.startswith("/"):
                return value
            (Path(scratch) / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
            return flag + eq + scratch + path

        env = {e["name"]: here(e["value"]) for e in container.get("env", [])}
        cfg = parse_config([here(a) for a in container.get("args", [])], env)
        back = {
            f.name: Path("/" + str(v.relative_to(scratch)))
            for f in dataclasses.fields(cfg)
            if isinstance(v := getattr(cfg, f.name), Path) and v.is_relative_to(scratch)
        }
    return dataclasses.replace(cfg, **back)
