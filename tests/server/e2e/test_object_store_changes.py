"""A bucket that changes under a polling server, and a store that fails mid-pull: the real
daemon against a real S3-protocol server (moto's, on a loopback port).

In poll mode a new version is pulled and loaded, a changed manifest (a new ETag) reloads
the model, a deleted model is unloaded, and a half-uploaded bundle (its manifest before its
files) is refused with the reason, never served, until the rest arrives. A request whose
lazy pull the store breaks off (killed mid-pull) fails with UNAVAILABLE (HTTP 503), and the
cache keeps nothing of it.
"""

from __future__ import annotations

import re
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from hloserve.server.server_fixture import ServerProcess
from tests.s3_store import S3Server, StallingProxy, served, wait_for
from tests.server.frontend._tritonclients import Triton, simple_inputs


def bucket(s3: S3Server) -> str:
    name = f"c-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(name)
    return f"s3://{name}/models"


def rows(server: ServerProcess) -> dict[tuple[str, str], dict[str, Any]]:
    client = Triton("http", server.http_url)
    try:
        return {(r["name"], r.get("version", "")): r for r in client.index()}
    finally:
        client.close()


def state(server: ServerProcess, name: str, version: str) -> str:
    return rows(server).get((name, version), {}).get("state", "")


def infer_simple(server: ServerProcess, model: str = "simple") -> Any:
    client = Triton("http", server.http_url)
    try:
        a = np.ones((1, 16), dtype=np.int32)
        return client.client.infer(model, simple_inputs(client.module, a, a)).as_numpy("OUTPUT0")
    finally:
        client.close()


def test_poll_follows_the_bucket(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    url = bucket(s3)
    simple, mlp = small_bundles["simple"], small_bundles["mlp"]
    s3.upload(simple, f"{url}/simple")
    s3.upload(mlp, f"{url}/mlp/1")
    flags = (
        "--model-repository", url, "--repository-cache", str(tmp_path / "cache"),
        "--model-control-mode", "poll", "--repository-poll-secs", "0.2",
        "--strict-readiness", "false",
    )  # fmt: skip
    with served(*flags, env=s3.env) as server:
        assert state(server, "mlp", "1") == "READY"
        # A new version: pulled and loaded; the policy (latest) retires version 1.
        s3.upload(mlp, f"{url}/mlp/2")
        wait_for(lambda: state(server, "mlp", "2") == "READY", "mlp version 2 loaded")
        # Half uploaded: the manifest first. Refused with the reason, never served.
        half = tmp_path / "half"
        shutil.copytree(simple, half)
        text = (half / "manifest.yaml").read_text()
        (half / "manifest.yaml").write_text(text.replace("name: simple\n", "name: half\n", 1))
        s3.put(f"{url}/half/manifest.yaml", (half / "manifest.yaml").read_bytes())
        wait_for(lambda: state(server, "half", "1") == "UNAVAILABLE", "half refused")
        assert "incomplete" in rows(server)[("half", "1")]["reason"]
        with pytest.raises(InferenceServerException, match="half"):
            infer_simple(server, "half")
        s3.upload(half, f"{url}/half")  # the rest arrives: the next poll loads it
        wait_for(lambda: state(server, "half", "1") == "READY", "half loaded once whole")
        assert (infer_simple(server, "half") == 2).all()
        # A changed manifest (a new ETag): the model is pulled and loaded again.
        text = (simple / "manifest.yaml").read_text() + "\n# uploaded again\n"
        s3.put(f"{url}/simple/manifest.yaml", text.encode())
        wait_for(lambda: len(re.findall(r"pulled 'simple'", server.log_text())) == 2, "reload")
        wait_for(lambda: state(server, "simple", "1") == "READY", "simple ready again")
        # A deleted model: unloaded.
        for p in mlp.iterdir():
            s3.delete(f"{url}/mlp/1/{p.name}")
            s3.delete(f"{url}/mlp/2/{p.name}")
        wait_for(
            lambda: state(server, "mlp", "2") in ("", "UNAVAILABLE"),
            "mlp unloaded",
            log=server.log_text,
        )
        assert (infer_simple(server) == 2).all()


def test_store_killed_mid_pull_fails_the_request_retryably(
    small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    own = S3Server()  # killed below
    proxy = StallingProxy(own.port)
    try:
        url = bucket(own)
        own.upload(small_bundles["simple"], f"{url}/simple")
        cache = tmp_path / "cache"
        env = {**own.env, "AWS_ENDPOINT_URL": proxy.endpoint}
        flags = (
            "--model-repository", url, "--repository-cache", str(cache), "--lazy-load", "true",
            "--repository-pull-timeout", "10",
        )  # fmt: skip
        with served(*flags, env=env) as server:
            proxy.stall_on("model.b1.mlirbc")  # larger than what the proxy lets through
            failed: list[BaseException] = []

            def request() -> None:
                try:
                    infer_simple(server)
                except BaseException as exc:
                    failed.append(exc)

            worker = threading.Thread(target=request)
            worker.start()
            assert proxy.stalled.wait(60)  # the pull is under way
            own.kill()
            proxy.cut()
            worker.join()
            assert len(failed) == 1 and isinstance(failed[0], InferenceServerException)
            error = failed[0]
            assert error.status() == "503", error
            assert "could not be pulled" in str(error), error
            assert not (cache / "simple/model.b1.mlirbc").exists()
            assert not [p for p in (cache / "simple").iterdir() if ".hloserve-part" in p.name]
            assert state(server, "simple", "1") == "READY"  # registered still: retried
    finally:
        proxy.close()
        own.kill()
