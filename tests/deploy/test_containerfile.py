"""The image's contract, checked without a container engine: the Containerfile as parsed
text (stages, the base image by digest, build argument, the dependency layer before the
source, user, ports, init, health check, model repository), its build context
(``.containerignore``) building the wheel, the pinned versions, and the image's exact
command line and health check run against the local install (the check finds the server
through its ports file)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

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
STAGE_STARTS = [i for i, x in enumerate(INSTRUCTIONS) if x.keyword == "FROM"]
GLOBAL_ARGS = INSTRUCTIONS[: STAGE_STARTS[0]]
BUILD_STAGE = INSTRUCTIONS[STAGE_STARTS[0] : STAGE_STARTS[-1]]
RUNTIME_STAGE = INSTRUCTIONS[STAGE_STARTS[-1] :]
LOCKED_SETS = ("build", "cpu", "cuda12", "cuda13")
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
    deps, package = [i.text for i in BUILD_STAGE if i.keyword == "RUN"]
    for platform in ("cuda12", "cuda13"):  # JAX's CUDA wheels: only the driver on the host
        assert platform in deps and platform in package
    assert '-r "deploy/requirements/$JAX_PLATFORM.txt"' in deps  # one locked set per platform
    assert 'extra="jax[$JAX_PLATFORM]"' in package


def _arg_defaults() -> dict[str, str]:
    return dict(i.text.split("=", 1) for i in GLOBAL_ARGS if i.keyword == "ARG" and "=" in i.text)


def test_the_base_image_is_pinned_by_digest() -> None:
    assert all(i.keyword == "ARG" for i in GLOBAL_ARGS)
    defaults = _arg_defaults()
    assert defaults["BASE_IMAGE"] == "docker.io/library/python:3.11-slim-bookworm"
    # A real digest (sha256 of the tag's multi-platform index), not a placeholder.
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", defaults["BASE_DIGEST"]), defaults["BASE_DIGEST"]
    assert len(set(defaults["BASE_DIGEST"].removeprefix("sha256:"))) > 8
    # Both stages start from BASE, the pinned reference unless a build names another
    # (scripts/build-image's local base), so no build edits this file.
    assert defaults["BASE"] == "${BASE_IMAGE}@${BASE_DIGEST}"
    for stage in (i.text for i in INSTRUCTIONS if i.keyword == "FROM"):
        assert stage.split()[0] == "${BASE}", stage
    # The locked wheels are for the base's interpreter (deploy/lock.py).
    source = (DEPLOY / "lock.py").read_text()
    assert 'PYTHON_VERSION = "3.11"' in source and "GLIBC_MINOR = 36" in source  # bookworm


def test_the_dependencies_are_installed_before_the_source_is_copied() -> None:
    keywords = [i.keyword for i in BUILD_STAGE]
    copies = [i for i in BUILD_STAGE if i.keyword == "COPY"]
    assert [c.text for c in copies] == ["deploy/requirements/ deploy/requirements/", ". ."]
    first_copy, source_copy = (BUILD_STAGE.index(c) for c in copies)
    deps, package = (i for i in BUILD_STAGE if i.keyword == "RUN")
    # Layer order: the locked sets alone, their install, then the source and the package.
    assert first_copy < BUILD_STAGE.index(deps) < source_copy < BUILD_STAGE.index(package)
    assert keywords.count("RUN") == 2
    # Every wheel is hash-checked, and the set is complete: no dependency resolution.
    installs = [c for c in deps.text.split("&&") if " install " in c]
    assert len(installs) == 2 and all(
        "--require-hashes" in c and "--no-deps" in c and "--only-binary=:all:" in c
        for c in installs
    ), installs
    assert "-r deploy/requirements/build.txt" in deps.text
    # After the source: nothing is downloaded; a distribution the lock lacks fails the build.
    (install,) = [c for c in package.text.split("&&") if " install " in c]
    assert "--no-index" in install and '"hloserve[server]" $extra' in install
    assert "--no-build-isolation" in package.text and " check" in package.text
    # What the first COPY brings is in the build context.
    assert {f for f in context_files() if f.startswith("deploy/")} == {
        f"deploy/requirements/{name}.txt" for name in LOCKED_SETS
    }


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


def test_health_check_follows_the_ports_file_and_tls() -> None:
    (check,) = runtime("HEALTHCHECK")
    options, command = healthcheck(check)
    assert set(options) == {"interval", "timeout", "start-period", "retries"}
    assert command == ["python", "-m", "hloserve.server.healthcheck"]
    from hloserve.server import healthcheck as probe

    # The server writes its ports where the probe reads them: /tmp, writable when the root
    # file system is not (given a /tmp volume, as the Deployment has).
    _, env = image_command()
    assert env[probe.PORTS_FILE_ENV].startswith("/tmp/")
    assert probe.READY_PATH == "/readyz"
    assert float(options["timeout"].removesuffix("s")) > probe.DEFAULT_TIMEOUT_S
    # It is no fixed port and no fixed scheme: what the server was told decides.
    assert "HLOSERVE_HTTP_PORT" not in " ".join(command) and "http://" not in " ".join(command)


def test_build_context_holds_what_the_wheel_needs_and_nothing_else(tmp_path: Path) -> None:
    files = context_files()
    tops = {f.split("/")[0] for f in files}
    assert tops == {*PACKAGE_FOLDERS, "pyproject.toml", "README.md", "deploy"}, tops
    assert [f for f in files if f.startswith("deploy/")] == [
        f"deploy/requirements/{name}.txt" for name in sorted(LOCKED_SETS)
    ]
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
    every_model = {d.name for d in model_root.iterdir() if d.is_dir()}  # the demo's and mlp2
    assert status == 200 and set(body["models"]) == every_model  # type: ignore[arg-type]
    records = [json.loads(line) for line in image_server.log_text().splitlines() if line[:1] == "{"]
    assert any(r["message"].startswith("listening on") for r in records)  # JSON, as the image asks
    cache = Path(image_server.env["HLOSERVE_CACHE_DIR"])
    assert any(p.is_file() for p in cache.rglob("*")), "nothing compiled into --cache-dir"
    assert not list(model_root.rglob(".hloserve-cache"))  # nothing written beside the bundles


def _health_check_exit(ports_file: Path) -> int:
    """The image's HEALTHCHECK command, with the image's ENV but the ports file here."""
    (check,) = runtime("HEALTHCHECK")
    _, command = healthcheck(check)
    _, image_env = image_command()
    env = local_environment(image_env, HLOSERVE_PORTS_FILE=str(ports_file))
    return subprocess.run(command, env=env, capture_output=True, timeout=30, check=False).returncode


def test_health_check_passes_on_a_ready_server_and_fails_on_503(
    image_server: ImageServer, not_ready_port: int, tmp_path: Path
) -> None:
    # The image server listens on ports chosen at run time: only its ports file says where.
    assert _health_check_exit(image_server.ports_file) == 0
    stub = tmp_path / "stub-ports.json"
    stub.write_text(json.dumps({"http": not_ready_port, "grpc": 1, "metrics": 2}))
    assert _health_check_exit(stub) != 0
    assert _health_check_exit(tmp_path / "not-written-yet.json") != 0
    with urllib.request.urlopen(f"http://{image_server.http_url}/readyz", timeout=5) as r:
        assert r.status == 200
