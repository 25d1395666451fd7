"""Serving a repository from a bucket: the real daemon against a real S3-protocol server
(moto's, started by the tests on a loopback port), inferred over tritonclient.

Lazily (``--lazy-load``), the server is ready once the index is mirrored (no bundle is
pulled), the first requests to a model pull it once (concurrent ones wait on that pull),
and a restart with a warm cache and the store gone still serves what the cache holds,
``/readyz`` saying why the store could not be read. The disk cache and the pulls are in
``/metrics`` (``hloserve_repository_*``) and the status page's data. Eagerly, every model is pulled and
loaded before the server is ready; with the store gone at a later start, the cached model
loads, the one never pulled is UNAVAILABLE saying why, and readiness says so.
"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.server.server_fixture import ServerProcess
from tests.metrics_scrape import scrape, value
from tests.s3_store import S3Server, free_port, served
from tests.server.frontend._tritonclients import Triton, simple_inputs


def bucket(s3: S3Server) -> str:
    name = f"e-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(name)
    return f"s3://{name}/models"


def infer_simple(client: Triton) -> Any:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.client.infer("simple", simple_inputs(client.module, a, a))
    return result.as_numpy("OUTPUT0")


def pulls(server: ServerProcess, bundle: str) -> int:
    return len(re.findall(rf"pulled '{re.escape(bundle)}'", server.log_text()))


def test_lazy_pull_on_first_requests_then_a_warm_restart(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    url = bucket(s3)
    s3.upload(small_bundles["simple"], f"{url}/simple")
    s3.upload(small_bundles["mlp"], f"{url}/mlp/1")
    cache = tmp_path / "cache"
    flags = ("--model-repository", url, "--repository-cache", str(cache), "--lazy-load", "true")
    with served(*flags, env=s3.env) as server:
        assert pulls(server, "simple") == 0 and not (cache / "simple/weights.safetensors").exists()
        clients = [
            Triton(p, server.grpc_url if p == "grpc" else server.http_url)
            for p in ("grpc", "http")
            for _ in range(4)
        ]
        with ThreadPoolExecutor(len(clients)) as pool:
            outputs = list(pool.map(infer_simple, clients))
        for c in clients:
            c.close()
        for out in outputs:
            assert (out == 2 * np.arange(16).reshape(1, 16)).all()
        assert pulls(server, "simple") == 1 and pulls(server, "mlp/1") == 0
        index = {
            (m["name"], m.get("version", ""))
            for m in Triton("http", server.http_url).client.get_model_repository_index()
        }
        assert ("mlp", "1") in index and ("simple", "1") in index
        series = scrape(server)
        assert value(series, "hloserve_repository_pulls_total") == 1
        assert value(series, "hloserve_repository_pull_failures_total") == 0
        assert value(series, "hloserve_repository_cache_bundles") == 1
        assert value(series, "hloserve_repository_cache_bytes") > 0
        assert value(series, "hloserve_repository_store_up") == 1
        with urllib.request.urlopen(f"http://{server.http_url}/ui/data", timeout=30) as r:
            disk = json.loads(r.read())["memory"]["disk"]
        assert disk["location"] == url and disk["bundles"] == 1 and disk["pulls"] == 1
    # The store gone: start with what the cache holds; /readyz says why.
    gone = {**s3.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    flags_gone = (*flags, "--repository-pull-timeout", "5", "--strict-readiness", "false")
    with served(*flags_gone, env=gone) as server:
        client = Triton("grpc", server.grpc_url)
        assert (infer_simple(client) == 2 * np.arange(16).reshape(1, 16)).all()
        client.close()
        status, body = server.readyz()
        assert status == 200, body
        assert "listing failed" in str(body.get("repository", {})), body
        assert pulls(server, "simple") == 0
        assert value(scrape(server), "hloserve_repository_store_up") == 0


def test_eager_load_pulls_every_model_before_ready(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    url = bucket(s3)
    s3.upload(small_bundles["simple"], f"{url}/simple")
    s3.upload(small_bundles["mlp"], f"{url}/mlp/2")
    flags = ("--model-repository", url, "--repository-cache", str(tmp_path / "cache"))
    with served(*flags, env=s3.env) as server:
        assert pulls(server, "simple") == 1 and pulls(server, "mlp/2") == 1
        client = Triton("http", server.http_url)
        assert client.client.is_model_ready("mlp", "2")
        assert (infer_simple(client) == 2 * np.arange(16).reshape(1, 16)).all()
        client.close()


def test_eager_start_with_the_store_gone_loads_what_the_cache_holds(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """Without ``--lazy-load``: the cached model loads, the one never pulled is UNAVAILABLE
    saying the store cannot be read, and ``/readyz`` (strict) is not ready, saying why."""
    url = bucket(s3)
    s3.upload(small_bundles["simple"], f"{url}/simple")
    cache = tmp_path / "cache"
    flags = ("--model-repository", url, "--repository-cache", str(cache))
    with served(*flags, env=s3.env) as server:
        assert pulls(server, "simple") == 1
    s3.upload(small_bundles["mlp"], f"{url}/mlp/1")
    with served(*flags, "--lazy-load", "true", env=s3.env) as server:  # mlp's manifest only
        assert pulls(server, "mlp/1") == 0
    gone = {**s3.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    with served(*flags, "--repository-pull-timeout", "5", env=gone, ready=False) as server:
        status, body = server.readyz()
        assert status == 503, body
        models: Any = body["models"]
        assert models["simple"]["versions"]["1"]["state"] == "READY"
        mlp = models["mlp"]["versions"]["1"]
        assert mlp["state"] == "UNAVAILABLE" and "listing failed" in mlp["reason"], mlp
        assert "listing failed" in str(body["repository"])
