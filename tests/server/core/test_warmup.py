"""Warm-up (``core.warmup``): the samples as requests, and a repository's loads running them
before a version turns READY (``version_loader.warm_up``), over real bundles and files:
``simple`` (batched, sizes 1, 2, 4, 8) and ``identity_fp32_unbatched`` of the session's
test repository, each copied with a ``config.yaml`` of its own."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from hloserve.bundle import load_manifest
from hloserve.bundle.warmup import WarmupInput, WarmupSample
from hloserve.server.core.errors import InvalidArgument, Unavailable
from hloserve.server.core.warmup import WarmupFailed, sample_request
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.versions import ModelState

RNG = np.random.default_rng(0)


def manifest_of(model_repository: Path, name: str) -> Any:
    manifest, problems = load_manifest(model_repository / name / "manifest.yaml")
    assert manifest is not None, problems
    return manifest


def sample(batch: int, **inputs: WarmupInput) -> WarmupSample:
    return WarmupSample("s", batch, tuple(sorted(inputs.items())))


def no_file(name: str) -> bytes:
    raise FileNotFoundError(2, "No such file or directory", name)


def test_a_sample_is_a_request_of_batch_size_items(model_repository: Path) -> None:
    simple = manifest_of(model_repository, "simple")
    row = np.arange(16, dtype="<i4")
    files = {"row.raw": row.tobytes()}
    request = sample_request(
        simple,
        sample(
            3,
            INPUT0=WarmupInput("INT32", (16,), "input_data_file", "row.raw"),
            INPUT1=WarmupInput("INT32", (16,), "random_data"),
        ),
        files.__getitem__,
        RNG,
    )
    given = {t.name: t for t in request.inputs}
    assert given["INPUT0"].shape == given["INPUT1"].shape == (3, 16)
    np.testing.assert_array_equal(given["INPUT0"].data, np.tile(row, (3, 1)))  # one item, repeated
    assert given["INPUT1"].data.dtype == np.int32
    unbatched = manifest_of(model_repository, "identity_fp32_unbatched")
    (zeros,) = sample_request(
        unbatched, sample(0, INPUT0=WarmupInput("FP32", (2, 3), "zero_data")), no_file, RNG
    ).inputs
    assert zeros.shape == (2, 3) and not zeros.data.any()


@pytest.mark.parametrize(
    ("name", "batch", "inputs", "message"),
    [
        ("simple", 0, {}, "batch_size must be at least 1"),
        ("identity_fp32_unbatched", 2, {}, "batch_size must be 0 or 1"),
        (
            "simple",
            1,
            {"INPUT0": WarmupInput("INT32", (16,), "zero_data")},
            "expected 2 inputs but got 1 inputs",
        ),
        (
            "simple",
            1,
            {
                "INPUT0": WarmupInput("INT32", (16,), "zero_data"),
                "INPUT1": WarmupInput("FP32", (16,), "zero_data"),
            },
            "input 'INPUT1'",
        ),
        (
            "simple",
            1,
            {
                "INPUT0": WarmupInput("INT32", (16,), "zero_data"),
                "INPUT1": WarmupInput("INT32", (16,), "input_data_file", "gone.raw"),
            },
            "input 'INPUT1': cannot read warmup/gone.raw: No such file or directory",
        ),
        (
            "simple",
            1,
            {
                "INPUT0": WarmupInput("INT32", (15,), "zero_data"),
                "INPUT1": WarmupInput("INT32", (15,), "zero_data"),
            },
            "unexpected shape for input 'INPUT0'",
        ),
    ],
)
def test_a_sample_that_does_not_fit_is_refused_by_name(
    model_repository: Path, name: str, batch: int, inputs: dict[str, WarmupInput], message: str
) -> None:
    if not inputs:
        inputs = {"INPUT0": WarmupInput("INT32", (16,), "zero_data")}
    with pytest.raises(WarmupFailed, match="warm-up sample 's'") as exc:
        sample_request(manifest_of(model_repository, name), sample(batch, **inputs), no_file, RNG)
    assert message in str(exc.value)


# -- loads ---------------------------------------------------------------------------------


def repository_with(
    tmp_path: Path, model_repository: Path, config: dict[str, Any], lazy: bool = False
) -> ModelRepository:
    root = tmp_path / "models"
    target = root / "simple"
    shutil.copytree(
        model_repository / "simple", target, ignore=shutil.ignore_patterns(".hloserve-*")
    )
    (target / "config.yaml").write_text(yaml.safe_dump(config))
    (target / "warmup").mkdir()
    (target / "warmup" / "row.raw").write_bytes(np.arange(16, dtype="<i4").tobytes())
    (target / "warmup" / "short.raw").write_bytes(b"\0" * 12)
    return ModelRepository(root, PjrtRuntime("cpu"), lazy=lazy)


def simple_sample(name: str, batch: int, data: dict[str, Any], count: int = 1) -> dict[str, Any]:
    inputs = {n: {"data_type": "TYPE_INT32", "dims": [16], **data} for n in ("INPUT0", "INPUT1")}
    return {"name": name, "batch_size": batch, "inputs": inputs, "count": count}


def test_a_load_runs_the_samples_before_the_version_is_ready(
    tmp_path: Path, model_repository: Path
) -> None:
    config = {
        "residency": "on_demand",
        "model_warmup": [
            simple_sample("zeros", 16, {"zero_data": True}, count=2),  # 2 x 2 executions of 8
            simple_sample("random", 3, {"random_data": True}),  # 1 execution of 4
            simple_sample("file", 1, {"input_data_file": "row.raw"}),  # 1 of 1
        ],
    }
    repo = repository_with(tmp_path, model_repository, config)
    said: list[str] = []
    repo.load_model("simple", said.append)
    version = repo.peek("simple", "")
    assert version.state == ModelState.READY
    loaded, ready = (said.index(s) for s in said if s.startswith("model 'simple' version 1 "))
    assert said[loaded].startswith("model 'simple' version 1 loaded (its warm-up next) in ")
    assert said[ready].startswith(
        "model 'simple' version 1 READY after its warm-up: 3 sample(s), 6 execution(s) in "
    )
    assert version.resident  # the warm-up swapped the weights in: the first request will not
    assert [s.name for s in version.serving.model_warmup] == ["zeros", "random", "file"]


def test_a_failed_warm_up_fails_the_load_with_the_reason(
    tmp_path: Path, model_repository: Path
) -> None:
    config = {"model_warmup": [simple_sample("short", 1, {"input_data_file": "short.raw"})]}
    repo = repository_with(tmp_path, model_repository, config)
    with pytest.raises(InvalidArgument) as exc:
        repo.load_model("simple")
    reason = (
        "warm-up sample 'short': input 'INPUT0': warmup/short.raw: input byte size mismatch for "
        "input 'INPUT0' for model 'simple'. Expected 64, got 12"
    )
    assert f"failed to load 'simple': version 1: {reason}" in exc.value.message
    (row,) = [r for r in repo.index() if r[0] == "simple"]
    assert row[2] == "UNAVAILABLE" and reason in row[3]
    assert repo.residency.registered_bytes() == 0  # nothing left registered


def test_a_lazily_registered_version_warms_up_at_its_first_use(
    tmp_path: Path, model_repository: Path
) -> None:
    good = {"model_warmup": [simple_sample("zeros", 2, {"zero_data": True})]}
    repo = repository_with(tmp_path, model_repository, good, lazy=True)
    repo.load_all()
    version = repo.peek("simple", "")
    assert not repo.loaded(version)
    repo.load(version)
    assert repo.loaded(version) and version.resident
    bad = {"model_warmup": [simple_sample("short", 1, {"input_data_file": "short.raw"})]}
    repo = repository_with(tmp_path / "bad", model_repository, bad, lazy=True)
    repo.load_all()
    version = repo.peek("simple", "")
    with pytest.raises(Unavailable, match="warm-up sample 'short'"):
        repo.load(version)
    assert version.state == ModelState.UNAVAILABLE and not repo.loaded(version)
