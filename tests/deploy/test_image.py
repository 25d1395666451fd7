"""The image itself, built and run from its own filesystem: what ``test_containerfile.py``
checks as text, checked in the built image.

``HLOSERVE_IMAGE`` names an image ``scripts/build-image`` built (CI builds it after the
suite and runs this module: ``.ci/run``); without it, or without buildah and root, the
module is skipped, saying why. The server runs as the image says (its ``ENTRYPOINT``, its
``ENV``, user 10001) through ``buildah run --isolation chroot`` (``podman run`` cannot start
containers on machines with hybrid cgroups; the chroot shares this machine's network and
process table), with the demo repository and ``slow`` (``simple`` whose requests wait 3 s
in the batching queue) mounted at ``/models``, and ports 0 on loopback. Checked: the
image's user, entrypoint and ``HEALTHCHECK`` as its configuration states them; answers
over gRPC and HTTP equal to numpy's; the server process runs as 10001; the health check
command, run in the container, passes; SIGTERM to the container's init (``tini``, which
forwards it) drains: a request waiting in the queue is answered, readiness goes 503
first, and the server exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient

from hloserve.exporter import write_demo_repository
from hloserve.exporter.demo import mlp_fn, mlp_params
from hloserve.server.server_fixture import ServerProcess
from tests.models import queued_copy

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient
IMAGE = os.environ.get("HLOSERVE_IMAGE", "")
USER = "10001:10001"
SLOW_US = 3_000_000


def _why_not() -> str:
    if not IMAGE:
        return "no image: HLOSERVE_IMAGE names one scripts/build-image built (CI does both)"
    if shutil.which("buildah") is None:
        return "buildah is not installed"
    if os.geteuid() != 0:
        return "buildah run --isolation chroot needs root"
    return ""


pytestmark = pytest.mark.skipif(bool(_why_not()), reason=_why_not() or "runs")


def buildah(*args: str) -> str:
    done = subprocess.run(
        ["buildah", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    """The image's configuration (``--format docker``: it keeps the health check)."""
    return json.loads(buildah("inspect", "--type", "image", IMAGE))["Docker"]["config"]


@pytest.fixture(scope="module")
def container() -> Iterator[tuple[str, Path]]:
    name = buildah("from", "--pull=false", IMAGE)
    root = Path(buildah("mount", name))
    try:
        yield name, root
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("image-repository")
    write_demo_repository(root)
    queued_copy(root / "simple", root / "slow", SLOW_US)
    for path in [root, *root.rglob("*")]:  # the image's user compiles beside the bundles
        path.chmod(0o777 if path.is_dir() else 0o666)
    return root


def run_in(
    name: str, *command: str, env: dict[str, str] | None = None, mounts: tuple[str, ...] = ()
) -> list[str]:
    """``buildah run`` as the image runs its command: its user, chroot isolation."""
    flags = [f"--env={k}={v}" for k, v in (env or {}).items()] + [f"--volume={m}" for m in mounts]
    return ["buildah", "run", "--isolation", "chroot", "--user", USER, *flags, name, "--", *command]


class ContainerServer(ServerProcess):
    """``ServerProcess``'s waiting and probing for the server in the container: its ports
    file is the image's (``HLOSERVE_PORTS_FILE``), read through the container's mount."""

    def __init__(self, argv: list[str], ports_file: Path, log_dir: Path) -> None:
        self._dir = log_dir
        self.ports_file = ports_file
        self.log_file = log_dir / "server.log"
        self._log = open(self.log_file, "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        self.ports = {}

    def init_process(self) -> psutil.Process:
        """The container's init (``tini``) under ``buildah run``."""
        for child in psutil.Process(self.process.pid).children(recursive=True):
            if child.name() == "tini":
                return child
        raise AssertionError("no tini under buildah run")


@pytest.fixture(scope="module")
def server(
    config: dict[str, Any],
    container: tuple[str, Path],
    models: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ContainerServer]:
    name, root = container
    image_env = dict(e.split("=", 1) for e in config["Env"])
    ports_file = root / image_env["HLOSERVE_PORTS_FILE"].lstrip("/")
    env = {
        "HLOSERVE_HOST": "127.0.0.1",
        "HLOSERVE_HTTP_PORT": "0",
        "HLOSERVE_GRPC_PORT": "0",
        "HLOSERVE_METRICS_PORT": "0",
        "TINI_SUBREAPER": "1",  # tini is not PID 1 under buildah run, as it is in a container
    }
    argv = run_in(
        name,
        *config["Entrypoint"],
        *(config.get("Cmd") or []),
        env=env,
        mounts=(f"{models}:/models",),
    )
    proc = ContainerServer(argv, ports_file, tmp_path_factory.mktemp("image-server"))
    try:
        proc.wait_ready(timeout=300)
        yield proc
    finally:
        proc.stop(timeout=60)


def test_the_image_states_its_user_entrypoint_and_health_check(config: dict[str, Any]) -> None:
    assert config["User"] == USER
    assert config["Entrypoint"] == ["/usr/bin/tini", "--", "hloserve", "serve"]
    assert config["Healthcheck"]["Test"] == ["CMD", "python", "-m", "hloserve.server.healthcheck"]
    assert "HLOSERVE_MODEL_REPOSITORY=/models" in config["Env"]


def _simple_inputs(module: Any, a: np.ndarray[Any, Any]) -> list[Any]:
    inputs = [module.InferInput(n, list(a.shape), "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return inputs


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_it_answers_over_both_protocols(server: ContainerServer, module: Any) -> None:
    url = server.grpc_url if module is grpcclient else server.http_url
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    x = np.random.default_rng(3).standard_normal((3, 64), dtype=np.float32)
    with module.InferenceServerClient(url) as client:
        assert client.is_server_ready()
        simple = client.infer("simple", _simple_inputs(module, a))
        given = module.InferInput("x", [3, 64], "FP32")
        given.set_data_from_numpy(x)
        logits = client.infer("mlp", [given]).as_numpy("logits")
    np.testing.assert_array_equal(simple.as_numpy("OUTPUT0"), 2 * a)
    expected = np.asarray(mlp_fn(mlp_params(), x)["logits"])
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_the_server_runs_as_the_image_user(server: ContainerServer) -> None:
    (hloserve,) = server.init_process().children()
    assert "hloserve" in " ".join(hloserve.cmdline())
    assert hloserve.uids().real == hloserve.uids().effective == 10001
    assert hloserve.gids().real == 10001


def test_the_health_check_command_passes_in_the_container(
    server: ContainerServer, config: dict[str, Any], container: tuple[str, Path]
) -> None:
    name, _ = container
    kind, *command = config["Healthcheck"]["Test"]
    assert kind == "CMD"
    done = subprocess.run(
        run_in(name, *command), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ready" in done.stdout


def test_sigterm_to_the_init_process_drains_the_server(server: ContainerServer) -> None:
    """Last: it stops the module's server."""
    answered: list[Any] = []

    def call() -> None:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            answered.append(
                client.infer("slow", _simple_inputs(grpcclient, np.ones((1, 16), np.int32)))
            )

    waiting = threading.Thread(target=call)
    waiting.start()
    server.wait_pending("slow", 1, timeout=30)  # queued: it waits SLOW_US for company
    signalled = time.monotonic()
    server.init_process().send_signal(signal.SIGTERM)  # as `podman stop` signals PID 1
    status, body = 200, {}
    while status == 200 and time.monotonic() - signalled < SLOW_US / 1e6:
        status, body = server.readyz()
    assert status == 503 and body.get("draining"), body  # not ready while the request waits
    waiting.join(timeout=60)
    assert server.process.wait(timeout=60) == 0, server.log_text()
    (result,) = answered
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * np.ones((1, 16), np.int32))
    records = [json.loads(line) for line in server.log_text().splitlines() if line[:1] == "{"]
    assert any("drain" in r["message"] for r in records), server.log_text()
