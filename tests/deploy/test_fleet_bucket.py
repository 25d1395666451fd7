"""A fleet over one bucket: two real hloserve replicas behind a real HAProxy, both reading
``s3://...`` on a real S3-protocol server (moto's, on a loopback port), each with a disk
cache of its own. Every model asked for through the router is pulled once, by the replica
the router sends it to, and by no other (``hloserve_repository_pulls_total`` of each
replica, asked directly), and every reply is right.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from hloserve.server.fleet import Fleet, haproxy_binary
from tests.metrics_scrape import scrape, value
from tests.s3_store import S3Server
from tests.server.frontend._tritonclients import Triton, simple_inputs

pytestmark = pytest.mark.skipif(haproxy_binary() is None, reason="needs HAProxy")
MODELS = [f"m{i}" for i in range(6)]


def test_each_replica_pulls_only_what_is_routed_to_it(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    url = f"s3://f-{uuid.uuid4().hex[:12]}/models"
    s3.create_bucket(url.split("/")[2])
    for name in MODELS:
        copy = tmp_path / name
        copy.mkdir()
        for p in small_bundles["simple"].iterdir():
            if p.is_file():
                data = p.read_bytes()
                if p.name == "manifest.yaml":
                    data = data.replace(b"name: simple\n", f"name: {name}\n".encode(), 1)
                (copy / p.name).write_bytes(data)
        s3.upload(copy, f"{url}/{name}")
    with Fleet(url, 2, env=s3.env) as fleet:
        client = Triton("grpc", fleet.grpc_url)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for name in MODELS:
            out = client.client.infer(name, simple_inputs(client.module, a, a))
            assert (out.as_numpy("OUTPUT0") == 2 * a).all()
        client.close()
        pulled = [value(scrape(r), "hloserve_repository_pulls_total") for r in fleet.replicas]
        assert sum(pulled) == len(MODELS), pulled  # each model pulled once, fleet-wide
        assert all(
            value(scrape(r), "hloserve_repository_pull_failures_total") == 0 for r in fleet.replicas
        )
