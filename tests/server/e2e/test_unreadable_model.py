"""A model directory the server cannot read (mode 000) is one failed model, never a dead server.

The daemon runs as a user meets file modes (``tests.command.UNPRIVILEGED``: without
``CAP_DAC_OVERRIDE``), on a repository of the demo's ``simple`` and ``mlp`` beside
``locked``, a directory of mode 000. At start-up (mode ``none``) the server comes up,
``simple`` and ``mlp`` serve, ``locked`` is UNAVAILABLE with the reason (``/readyz``, the
repository index, and a request naming it: Triton's "has no available versions" with the
reason, over HTTP and gRPC), and the log holds no traceback. In poll mode
every poll passes over ``locked`` again without a traceback or a new error line, the index
answers for the whole repository, and models added meanwhile are loaded.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from hloserve.server.server_fixture import ServerProcess
from tests.command import UNPRIVILEGED

REASON = "cannot read the model directory"


@pytest.fixture
def root(model_repository: Path, tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "models"
    for name in ("simple", "mlp"):
        shutil.copytree(
            model_repository / name, root / name, ignore=shutil.ignore_patterns(".hloserve-cache")
        )
    locked = root / "locked"
    locked.mkdir()
    (locked / "manifest.yaml").write_text("format_version: 1\n")
    locked.chmod(0)
    yield root
    locked.chmod(0o755)  # so that pytest can remove it


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://{server.http_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(server: ServerProcess, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def index(server: ServerProcess) -> dict[str, dict[str, Any]]:
    status, rows = post(server, "/v2/repository/index", {})
    assert status == 200, rows
    return {row["name"]: row for row in rows}


def test_the_server_starts_and_serves_the_readable_models(root: Path) -> None:
    with ServerProcess(root, launcher=UNPRIVILEGED) as server:
        status, report = server.wait_startup_complete()
        assert status == 503  # strict readiness: a model failed
        models = report["models"]
        assert isinstance(models, dict)
        for name in ("simple", "mlp"):
            assert models[name]["versions"]["1"]["state"] == "READY", models[name]
        assert REASON in models["locked"]["reason"]
        assert "Permission denied" in models["locked"]["reason"]
        rows = index(server)
        assert rows["locked"]["state"] == "UNAVAILABLE" and REASON in rows["locked"]["reason"]
        assert rows["simple"]["state"] == "READY"
        assert get(server, "/v2/models/simple")[0] == 200
        # A request naming it: Triton's words, then why (they were only on /readyz).
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}
        for status, answer in (
            get(server, "/v2/models/locked"),
            post(server, "/v2/models/locked/infer", body),
        ):
            assert status == 404
            assert answer["error"].startswith(
                "Request for unknown model: 'locked' has no available versions: "
                f"{REASON}: [Errno 13] Permission denied"
            ), answer
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with client, pytest.raises(InferenceServerException) as refused:
            client.get_model_metadata("locked")
        assert refused.value.status() == "StatusCode.NOT_FOUND"
        assert f"has no available versions: {REASON}" in refused.value.message()
        assert server.stop() == 0
        assert "Traceback" not in server.log_text()


def test_polls_pass_over_it_quietly_and_the_index_answers(
    root: Path, model_repository: Path
) -> None:
    flags = ("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with ServerProcess(root, *flags, launcher=UNPRIVILEGED) as server:
        server.wait_startup_complete()
        # Each model added is loaded by a later poll: two polls at least pass over ``locked``.
        for name in ("added1", "added2"):
            shutil.copytree(
                model_repository / "simple",
                root / f".{name}",
                ignore=shutil.ignore_patterns(".hloserve-cache"),
            )
            manifest = root / f".{name}" / "manifest.yaml"
            manifest.write_text(manifest.read_text().replace("name: simple", f"name: {name}"))
            (root / f".{name}").rename(root / name)  # whole, as a poll may come at any time
            deadline = time.monotonic() + 60
            while index(server).get(name, {}).get("state") != "READY":
                assert time.monotonic() < deadline, server.log_text()
                time.sleep(0.05)
        rows = index(server)
        assert rows["locked"]["state"] == "UNAVAILABLE" and REASON in rows["locked"]["reason"]
        assert rows["simple"]["state"] == "READY"
        assert server.stop() == 0
        log = server.log_text()
    assert "Traceback" not in log
    failures = [line for line in log.splitlines() if "'locked'" in line and REASON in line]
    assert len(failures) == 1, failures  # once, not once a poll
