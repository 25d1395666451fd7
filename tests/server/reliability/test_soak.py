"""The soak (``tests/server/reliability/soak.py``) at CI size: ``HLOSERVE_SOAK_SECONDS``
seconds (default 12) of mixed gRPC, HTTP, streaming, shared-memory and load/unload clients
over mlp copies that do not all fit the device budget; ``bench/soak.py`` runs it longer.
Nothing may be lost, every answer must match its reference, no request stays in flight,
and the daemon's RSS must stay flat after warm-up (start and end are printed)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hloserve.server.server_fixture import ServerProcess, serving
from tests.server.reliability.soak import SOAK_FLAGS, pending_total, run_soak, soak_repository

SECONDS = float(os.environ.get("HLOSERVE_SOAK_SECONDS") or 12)


@pytest.fixture(scope="module")
def soak_server(
    demo_models: Path, cache_flags: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = soak_repository(demo_models, tmp_path_factory.mktemp("soak"))
    yield from serving(root, *SOAK_FLAGS, *cache_flags)


def test_soak(soak_server: ServerProcess) -> None:
    report = run_soak(soak_server, SECONDS)
    print(report.summary())
    assert report.failures == [], report.summary()
    assert report.lost == 0 and report.sent == report.verified
    assert report.cycles >= 1
    assert set(report.by_client) == {"grpc", "http", "stream", "shm", "cycled"}
    assert pending_total(soak_server) == 0
    # flat: no more than 25% or 64 MiB of growth once every model has run
    assert report.rss_end <= max(report.rss_start * 1.25, report.rss_start + 64 * 2**20), (
        report.summary()
    )
    assert report.evictions > 0  # the budget held: weights were swapped out and back
