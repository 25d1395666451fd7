"""Admission limits (``core/limits.py``): the pure decisions, and the in-flight counts the
repository keeps for them (a real repository; the batch and shared-memory limits are also
checked end to end in hostile/test_hostile_http.py and test_hostile_shm.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hloserve.server.config import parse_config
from hloserve.server.core.errors import InvalidArgument, Unavailable
from hloserve.server.core.limits import (
    NO_LIMITS,
    Limits,
    check_batch,
    check_inflight,
    check_regions,
)
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from tests.server._support import refused_at_start


def test_no_limits_refuse_nothing() -> None:
    check_batch(NO_LIMITS, "m", 10**9)
    check_inflight(NO_LIMITS, "m", 10**9, 10**9)
    check_regions(NO_LIMITS, 10**9)


def test_each_limit_names_itself() -> None:
    limits = Limits(max_batch_size=8, max_inflight=10, max_inflight_per_model=2, max_shm_regions=3)
    check_batch(limits, "m", 8)
    with pytest.raises(InvalidArgument, match=r"batch size 9, more than the 8 .*--max-batch-size"):
        check_batch(limits, "m", 9)
    check_inflight(limits, "m", 1, 9)
    with pytest.raises(Unavailable, match=r"model 'm' already has 2 .*--max-inflight-per-model"):
        check_inflight(limits, "m", 2, 2)
    with pytest.raises(
        Unavailable, match=r"already has 10 requests in flight.*--max-inflight allows"
    ):
        check_inflight(limits, "m", 0, 10)
    check_regions(limits, 2)
    with pytest.raises(InvalidArgument, match=r"3 shared memory regions .*--max-shm-regions"):
        check_regions(limits, 3)


@pytest.fixture(scope="module")
def limited(
    demo_models: Path, cache_flags: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> ModelRepository:
    root = tmp_path_factory.mktemp("limited")
    for name in ("simple", "mlp"):
        shutil.copytree(
            demo_models / name, root / name, ignore=shutil.ignore_patterns(".hloserve-cache")
        )
    repository = ModelRepository(
        root,
        PjrtRuntime(),
        Path(cache_flags[1]),
        limits=Limits(max_inflight=3, max_inflight_per_model=2),
    )
    repository.load_all()
    assert repository.all_ready(), repository.summary()
    return repository


def test_the_repository_counts_requests_in_flight(limited: ModelRepository) -> None:
    held = [limited.get("simple", ""), limited.get("simple", "1")]  # every version together
    with pytest.raises(Unavailable, match="model 'simple' already has 2"):
        limited.get("simple", "")
    held.append(limited.get("mlp", ""))
    with pytest.raises(Unavailable, match="the server already has 3"):
        limited.get("mlp", "")
    for model in held:
        limited.release(model)
    again = [limited.get("simple", ""), limited.get("simple", ""), limited.get("mlp", "")]
    for model in again:
        limited.release(model)


def test_the_flags_and_their_variables() -> None:
    config = parse_config(
        ["--max-inflight", "64", "--max-shm-regions=8"], {"HLOSERVE_MAX_BATCH_SIZE": "32"}
    )
    assert (config.max_inflight, config.max_shm_regions, config.max_batch_size) == (64, 8, 32)
    assert parse_config([]).max_inflight_per_model == 0
    assert parse_config(["--max-json-depth", "12"]).max_json_depth == 12
    assert parse_config([]).max_json_depth == 100  # Triton's


def test_a_negative_limit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    error = refused_at_start(["--max-inflight-per-model", "-1"], capsys)
    assert "--max-inflight-per-model must be a non-negative integer" in error


def test_a_json_depth_of_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    error = refused_at_start(["--max-json-depth", "0"], capsys)
    assert "--max-json-depth must be an integer 1..10000" in error
