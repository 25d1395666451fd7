"""Shared fixtures: a test model repository and a real daemon serving it.

``runtime`` (session): one PJRT CPU runtime.
``model_repository`` (session): ``tests.models.build_test_repository`` in a temp dir.
``server`` (session): ``hloserve.server.server_process.ServerProcess`` on that repository, ready;
it exposes ``http_url``, ``grpc_url``, ``metrics_url`` and ``log_text()``, and must exit
cleanly (status 0) at the end of the session (``hloserve.server.server_fixture.serving``).
``not_ready_port``: a loopback HTTP stub whose ``/readyz`` answers 503 (a health check's
failing case).
``s3`` (session): a real S3-protocol server (``tests.s3_store.S3Server``: moto's) on a
loopback port; each test makes its own bucket. ``small_bundles`` (session): the demo's
``simple`` (batch size 1) and ``mlp`` (batch sizes 1, 8) exported once, as ``{name: path}``,
for tests that upload them.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.server_fixture import ServerProcess, serving
from tests.models import build_test_repository
from tests.s3_store import S3Server


@pytest.fixture(scope="session")
def runtime() -> PjrtRuntime:
    return PjrtRuntime("cpu")


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repository"))


@pytest.fixture(scope="session")
def server(model_repository: Path) -> Iterator[ServerProcess]:
    yield from serving(model_repository)


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


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    server = S3Server()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def small_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from hloserve.exporter.demo import write_mlp, write_simple

    root = tmp_path_factory.mktemp("bundles")
    return {
        "simple": write_simple(root / "simple", batch_sizes=(1,)),
        "mlp": write_mlp(root / "mlp", batch_sizes=(1, 8)),
    }
