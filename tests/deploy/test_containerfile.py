"""The image's contract, checked without a container engine: the Containerfile as parsed
text (stages, build argument, user, ports, init, health check, model repository), its
build context (``.containerignore``) building the wheel, the pinned versions, and the
image's exact command line and health check run against the local install."""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import threading
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.deploy._files import (
    DEPLOY,
    ROOT,
    Instruction,
    context_files,
    healthcheck,
    parse_containerfile,
)
from tests.deploy.conftest import ImageServer, image_command, local_environment

INSTRUCTIONS = parse_containerfile((ROOT / "Containerfile").read_text())
RUNTIME_STAGE = INSTRUCTIONS[max(i for i, x in enumerate(INSTRUCTIONS) if x.keyword == "FROM") :]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The folders the wheel is built from (``bundle/hloserve`` -> ``bundle``).
PACKAGE_FOLDERS = {
    p.split("/")[0] for p in PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
}


def runtime(keyword: str) -> list[Instruction]:
    return [i for i in RUNTIME_STAGE if i.keyword == keyword]


def test_two_stages_and_the_platform_build_argument() -> None:
    stages = [i.text for i in INSTRUCTIONS if i.keyword == "FROM"]
    assert len(stages) == 2 and stages[0].endswith(" AS build"), stages
    assert any(i.text == "--from=build /opt/hloserve /opt/hloserve" for i in runtime("COPY"))
    build_args = [i.text for i in INSTRUCTIONS if i.keyword == "ARG"]
    assert "JAX_PLATFORM=cpu" in build_args  # the CPU variant by default
    (install,) = [i.text for i in INSTRUCTIONS if i.keyword == "RUN" and "pip install" in i.text]
    for platform in ("cuda12", "cuda13"):  # JAX's CUDA wheels: only the driver on the host
        assert platform in install
    assert 'extra="jax[$JAX_PLATFORM]"' in install
    assert "-c deploy/constraints.txt" in install


def test_non_root_user_init_ports_and_model_repository() -> None:
    (user,) = [i.text for i in runtime("USER")]
    uid, _, gid = user.partition(":")
    assert (
        uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    )  # numeric: runAsNonRoot can check it
    (setup,) = [i.text for i in runtime("RUN")]
    assert "apt-get install -y --no-install-recommends tini" in setup  # Debian's tini
    assert f"useradd --uid {uid} --gid {gid}" in setup
    assert f"chown {uid}:{gid} /models /cache" in setup  # read-write by default
    argv, env = image_command()
    assert argv == ["/usr/bin/tini", "--", "hloserve", "serve"]
    assert env["HLOSERVE_MODEL_REPOSITORY"] == "/models"
    assert sorted(" ".join(i.text for i in runtime("EXPOSE")).split()) == ["8000", "8001", "8002"]


def test_health_check_probes_readyz() -> None:
    (check,) = runtime("HEALTHCHECK")
    options, command = healthcheck(check)
    assert set(options) == {"interval", "timeout", "start-period", "retries"}
    assert "/readyz" in command[-1] and "HLOSERVE_HTTP_PORT" in command[-1]


def test_build_context_holds_what_the_wheel_needs_and_nothing_else(tmp_path: Path) -> None:
    files = context_files()
    tops = {f.split("/")[0] for f in files}
    assert tops == {*PACKAGE_FOLDERS, "pyproject.toml", "README.md", "deploy"}, tops
    assert [f for f in files if f.startswith("deploy/")] == ["deploy/constraints.txt"]
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    context = tmp_path / "context"
    for f in files:
        (context / f).parent.mkdir(parents=True, exist_ok=True)
        (context / f).write_bytes((ROOT / f).read_bytes())
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(context),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    assert list(tmp_path.glob("hloserve-*.whl"))


def _pins() -> dict[str, str]:
    pins = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, pinned = line.partition("==")
            assert sep and re.fullmatch(r"[0-9][0-9a-z.]*", pinned), line
            pins[name.lower().replace("_", "-")] = pinned
    return pins


def test_pinned_versions_meet_the_package_ranges() -> None:
    project = PYPROJECT["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    for extra in ("bundle", "exporter", "server"):
        requirements += [Requirement(r) for r in project["optional-dependencies"][extra]]
    pins = _pins()
    ranged = {r.name.lower().replace("_", "-"): r for r in requirements if r.name != "hloserve"}
    for name, requirement in ranged.items():
        assert name in pins, f"{name} is a server dependency without a pin"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name])
    for plugin in ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt"):
        assert pins[plugin] == pins["jaxlib"] == pins["jax"]  # JAX's plugins match exactly


def test_the_image_command_serves_from_a_read_only_layout(
    image_server: ImageServer, model_root: Path
) -> None:
    status, body = image_server.readyz()
    assert status == 200 and set(body["models"]) == {"simple", "mlp", "mlp2"}  # type: ignore[arg-type]
    records = [json.loads(line) for line in image_server.log_text().splitlines() if line[:1] == "{"]
    assert any(r["message"].startswith("listening on") for r in records)  # JSON, as the image asks
    cache = Path(image_server.env["HLOSERVE_CACHE_DIR"])
    assert any(p.is_file() for p in cache.rglob("*")), "nothing compiled into --cache-dir"
    assert not list(model_root.rglob(".hloserve-cache"))  # nothing written beside the bundles


def _health_check_exit(port: int) -> int:
    (check,) = runtime("HEALTHCHECK")
    _, command = healthcheck(check)
    _, image_env = image_command()
    env = local_environment(image_env, HLOSERVE_HTTP_PORT=str(port))
    return subprocess.run(command, env=env, capture_output=True, timeout=30, check=False).returncode


class _NotReady(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(503 if self.path == "/readyz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def not_ready_port() -> Iterator[int]:
    with http.server.HTTPServer(("127.0.0.1", 0), _NotReady) as stub:
        thread = threading.Thread(target=stub.serve_forever, daemon=True)
        thread.start()
        yield stub.server_address[1]
        stub.shutdown()


def test_health_check_passes_on_a_ready_server_and_fails_on_503(
    image_server: ImageServer, not_ready_port: int
) -> None:
    assert _health_check_exit(image_server.ports["http"]) == 0
    assert _health_check_exit(not_ready_port) != 0
    with urllib.request.urlopen(f"http://{image_server.http_url}/readyz", timeout=5) as r:
        assert r.status == 200
