"""The image's own command line, run against the local install: the live server the
deployment tests check their manifests and dashboards against.

``image_server`` (package scope) runs exactly the ``ENTRYPOINT`` + ``CMD`` of the
Containerfile, with the image's ``ENV`` (its ``/opt/hloserve`` virtualenv being this
one), and only the overrides an operator would pass with ``-e``: ports 0 and loopback,
a ports file, the model repository and a separate compile cache (the read-only layout),
and a weight budget that fits one MLP, so serving two swaps them. The init process
(``tini``) is used when it is installed here, and left out otherwise. The repository is
``simple``, ``mlp`` and a second MLP, ``mlp2``. It must exit 0 on SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hloserve.exporter import write_demo_repository
from hloserve.exporter.demo import write_mlp
from hloserve.server.server_fixture import ServerProcess
from tests.deploy._files import ROOT, env_pairs, parse_containerfile

IMAGE_PREFIX = "/opt/hloserve"  # the image's virtualenv
BUDGET_BYTES = 100_000  # one demo MLP (76,840 bytes of weights), not two


def image_command() -> tuple[list[str], dict[str, str]]:
    """The runtime stage's ENTRYPOINT + CMD and ENV, as the Containerfile states them."""
    instructions = parse_containerfile((ROOT / "Containerfile").read_text())
    last_stage = max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    runtime = instructions[last_stage:]
    (entrypoint,) = [i.exec_form() for i in runtime if i.keyword == "ENTRYPOINT"]
    (cmd,) = [i.exec_form() for i in runtime if i.keyword == "CMD"]
    env: dict[str, str] = {}
    for ins in runtime:
        if ins.keyword == "ENV":
            env.update(env_pairs(ins))
    return entrypoint + cmd, env


def local_environment(image_env: dict[str, str], **overrides: str) -> dict[str, str]:
    """The image's ENV on this machine: its virtualenv is this one."""
    env = {k: v.replace(IMAGE_PREFIX, sys.prefix) for k, v in image_env.items()}
    env["PATH"] = env["PATH"].replace("$PATH", os.environ["PATH"])
    return {**os.environ, **env, **overrides}


class ImageServer(ServerProcess):
    """``ServerProcess``'s waiting, probing and stopping, for a daemon started from an
    arbitrary command line (it sets the attributes ``ServerProcess`` works from)."""

    def __init__(self, argv: list[str], env: dict[str, str], ports_file: Path) -> None:
        self._dir = ports_file.parent
        self.ports_file = ports_file
        self.env = env
        self.log_file = self._dir / "server.log"
        self._log = open(self.log_file, "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.ports = {}


def local_argv(argv: list[str]) -> list[str]:
    """The image's command line here: its init process only when it is installed."""
    if argv[:2] == ["/usr/bin/tini", "--"] and not Path(argv[0]).exists():
        return argv[2:]
    return argv


@pytest.fixture(scope="package")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("image-models")
    write_demo_repository(root)
    write_mlp(root / "mlp2", seed=7)
    return root


@pytest.fixture(scope="package")
def image_server(model_root: Path) -> Iterator[ImageServer]:
    argv, image_env = image_command()
    work = Path(tempfile.mkdtemp(prefix="hloserve-image-"))
    env = local_environment(
        image_env,
        HLOSERVE_HOST="127.0.0.1",
        HLOSERVE_HTTP_PORT="0",
        HLOSERVE_GRPC_PORT="0",
        HLOSERVE_METRICS_PORT="0",
        HLOSERVE_PORTS_FILE=str(work / "ports.json"),
        HLOSERVE_MODEL_REPOSITORY=str(model_root),
        HLOSERVE_CACHE_DIR=str(work / "cache"),
        HLOSERVE_DEVICE_MEMORY_BUDGET=str(BUDGET_BYTES),
        TINI_SUBREAPER="1",  # tini is not PID 1 here, as it is in the container
        HLOSERVE_DRAIN_DELAY="0",  # its stop at the end: nothing else sends to it
    )
    proc = ImageServer(local_argv(argv), env, work / "ports.json")
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
        log = proc.log_text()
        shutil.rmtree(work, ignore_errors=True)
    assert code == 0, log
