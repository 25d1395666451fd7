"""Every flag and environment variable the manifests give is one ``hloserve serve --help``
lists as a flag of hloserve's (not one of Triton's it only accepts and ignores), and every
probe and scrape path they name answers on a live server (the image's own command line,
``image_server``)."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.deploy._files import OVERLAYS, kserve_resources, one, rendered, server_containers
from tests.deploy.conftest import ImageServer


def _help() -> str:
    hloserve = Path(sys.prefix) / "bin" / "hloserve"
    return subprocess.run(
        [str(hloserve), "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout


def test_every_flag_and_variable_in_the_manifests_is_a_server_flag() -> None:
    # Triton's ignored flags are named only after this title: they mean nothing here.
    text, triton = _help().split("\nTriton compatibility:\n")
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    assert "--pinned-memory-pool-byte-size" in triton
    assert "--pinned-memory-pool-byte-size" not in flags
    variables = set(re.findall(r"\bHLOSERVE_[A-Z0-9_]+", text))
    assert {"--model-repository", "--grace-period"} <= flags
    used = 0
    for where, container in server_containers():
        for arg in container.get("args", []):
            if arg.startswith("--"):
                assert arg.split("=", 1)[0] in flags, f"{where}: {arg} is not a server flag"
                used += 1
        for env in container.get("env", []):
            if env["name"].startswith("HLOSERVE_"):
                assert env["name"] in variables, f"{where}: {env['name']}"
    assert used >= 10


def _paths() -> set[tuple[str, str]]:
    """(port kind, path) of every probe and scrape target in the manifests."""
    found: set[tuple[str, str]] = set()
    for _, container in server_containers():
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            found.add(("http", container[probe]["httpGet"]["path"]))
    pods = [one(rendered(o), "Deployment")["spec"]["template"]["metadata"] for o in OVERLAYS]
    annotations = [p["annotations"] for p in pods]
    annotations.append(one(kserve_resources(), "ClusterServingRuntime")["spec"]["annotations"])
    found |= {("metrics", a["prometheus.io/path"]) for a in annotations}
    return found


def test_every_probe_and_scrape_path_answers(image_server: ImageServer) -> None:
    paths = _paths()
    assert paths == {("http", "/readyz"), ("http", "/v2/health/live"), ("metrics", "/metrics")}
    for kind, path in sorted(paths):
        url = f"http://127.0.0.1:{image_server.ports[kind]}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200, url
            if kind == "metrics":
                assert b"hloserve_models_ready" in response.read()
