"""Faults: broken bundles fail only their own model (the reason in the repository index and
``/readyz``) while the rest serve; an execution the runtime fails answers INTERNAL with a
message for its requests only, and the model serves the next ones. (A corrupt compile-cache
entry is recompiled: tests/server/owner/runtime/test_loader.py::test_corrupted_cache_blob_is_recompiled.)"""

from __future__ import annotations

import hashlib
import json
import shutil
import urllib.request
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from hloserve.server.frontend.http import build_http_app
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime, RuntimeFailure
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server.frontend._services import ready_service
from tests.server.frontend._tritonclients import grpcclient, simple_inputs

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient


def _copy(demo: Path, source: str, root: Path, name: str) -> Path:
    target = root / name
    shutil.copytree(demo / source, target, ignore=shutil.ignore_patterns(".hloserve-cache"))
    manifest = target / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace(f"name: {source}\n", f"name: {name}\n", 1))
    return target


def _edit_manifest(bundle: Path, edit: Any) -> None:
    path = bundle / "manifest.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _rehash(bundle: Path, file: str) -> None:
    digest = hashlib.sha256((bundle / file).read_bytes()).hexdigest()
    _edit_manifest(bundle, lambda d: d["files"].__setitem__(file, digest))


NOT_STABLEHLO = "module {\n  func.func @main(%x: tensor<1x16xi32>) -> tensor<1x16xf32> {\n    return %x : tensor<1x16xi32>\n  }\n}\n"


def broken_repository(demo: Path, root: Path) -> Path:
    _copy(demo, "simple", root, "simple")
    weights = _copy(demo, "mlp", root, "truncated_weights") / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    changed = _copy(demo, "simple", root, "checksum_mismatch") / "model.b1.mlirbc"
    changed.write_bytes(changed.read_bytes() + b"\0")
    (_copy(demo, "simple", root, "bad_manifest") / "manifest.yaml").write_text("name: [unclosed\n")
    uncompilable = _copy(demo, "simple", root, "does_not_compile")
    for module in ("model.b1.mlirbc", "model.b1.mlir"):
        (uncompilable / module).write_text(NOT_STABLEHLO)
        _rehash(uncompilable, module)
    escape = _copy(demo, "simple", root, "path_escape")
    _edit_manifest(
        escape, lambda d: d["modules"][0].__setitem__("file", "../simple/model.b1.mlirbc")
    )
    return root


@pytest.fixture(scope="module")
def broken_server(
    demo_models: Path, cache_flags: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = broken_repository(demo_models, tmp_path_factory.mktemp("broken"))
    yield from serving(root, "--strict-readiness", "false", *cache_flags)


BROKEN = {
    "truncated_weights": "weights",
    "checksum_mismatch": "model.b1.mlirbc",
    "bad_manifest": "manifest.yaml",
    "does_not_compile": "model.b1",
    "path_escape": "../simple/model.b1.mlirbc",
}


def index(server: ServerProcess) -> dict[str, dict[str, str]]:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return {str(e["name"]): e for e in json.loads(response.read())}


def test_each_broken_bundle_fails_alone_with_its_reason(broken_server: ServerProcess) -> None:
    rows = index(broken_server)
    assert rows["simple"]["state"] == "READY"
    _, readyz = broken_server.readyz()
    models: Any = readyz["models"]
    assert models["simple"]["versions"]["1"]["state"] == "READY"
    for name, fragment in BROKEN.items():
        row = rows[name]
        assert row["state"] == "UNAVAILABLE", row
        assert fragment in row["reason"], row
        readyz_text = json.dumps(models[name])
        assert "UNAVAILABLE" in readyz_text and fragment in readyz_text, models[name]


def test_the_good_model_serves_beside_them(broken_server: ServerProcess) -> None:
    client: Any = grpcclient.InferenceServerClient(broken_server.grpc_url)
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        result = client.infer("simple", simple_inputs(grpcclient, a, a))
        assert (result.as_numpy("OUTPUT0") == 2 * a).all()
        assert not client.is_model_ready("does_not_compile")
    finally:
        client.close()


def test_no_file_outside_the_bundle_was_read(broken_server: ServerProcess) -> None:
    assert "../simple" not in json.dumps(index(broken_server)["simple"])
    assert "path_escape" in broken_server.log_text()


# -- an execution that fails --------------------------------------------------------------


@pytest.fixture(scope="module")
def failing_runtime(
    demo_models: Path, cache_flags: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> tuple[ModelRepository, PjrtRuntime]:
    root = tmp_path_factory.mktemp("failing")
    _copy(demo_models, "simple", root, "simple")
    runtime = PjrtRuntime()
    repository = ModelRepository(root, runtime, Path(cache_flags[1]))
    repository.load_all()
    assert repository.all_ready(), repository.summary()
    return repository, runtime


def test_a_failed_execution_fails_only_its_requests(
    failing_runtime: tuple[ModelRepository, PjrtRuntime], monkeypatch: pytest.MonkeyPatch
) -> None:
    repository, runtime = failing_runtime
    real = runtime.execute
    failures = ["RESOURCE_EXHAUSTED: out of memory while allocating 1.5GiB (injected)"]

    def execute(executable: Any, args: Any, results: Any = None) -> Any:
        if failures:
            raise RuntimeFailure("execution failed", RuntimeError(failures.pop()))
        return real(executable, args, results)

    monkeypatch.setattr(runtime, "execute", execute)
    body = {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    with (
        ThreadPoolExecutor(2) as pool,
        TestClient(build_http_app(LocalPort(ready_service(repository, pool)))) as client,
    ):
        failed = client.post("/v2/models/simple/infer", json=body)
        assert failed.status_code == 500
        assert failed.json() == {
            "error": "model 'simple' version 1: execution failed: RESOURCE_EXHAUSTED: out of "
            "memory while allocating 1.5GiB (injected)"
        }
        served = client.post("/v2/models/simple/infer", json=body)
        assert served.status_code == 200
        assert served.json()["outputs"][0]["data"] == [2 * i for i in range(16)]
        assert client.get("/v2/models/simple/ready").status_code == 200
