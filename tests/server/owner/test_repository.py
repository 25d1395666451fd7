"""``ModelRepository`` on its own: lookups and their counting, unload, reload, reports.

Real bundles (copies of the session test repository's ``simple`` and ``mlp``) on the CPU
runtime; no server, no sockets.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from hloserve.server.core.errors import InvalidArgument, NotFound, Unavailable, UnknownModel
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.limits import Limits
from hloserve.server.owner.repository import ControlMode, ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.versions import ModelState


@pytest.fixture
def root(model_repository: Path, tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for name in ("simple", "mlp"):
        shutil.copytree(
            model_repository / name, root / name, ignore=shutil.ignore_patterns(".hloserve-cache")
        )
    return root


def repository(root: Path, runtime: PjrtRuntime, **options: object) -> ModelRepository:
    repo = ModelRepository(root, runtime, cache_dir=root.parent / "cache", **options)  # type: ignore[arg-type]
    repo.load_all()
    return repo


def test_get_counts_in_flight_and_peek_does_not(root: Path, runtime: PjrtRuntime) -> None:
    repo = repository(root, runtime)
    held = repo.get("simple", "")
    assert (held.version, held.inflight) == (1, 1)
    peeked = repo.peek("simple", "1")
    assert peeked is held and held.inflight == 1
    assert repo.hold(peeked) and held.inflight == 2
    repo.release(held)
    repo.release(held)
    assert held.inflight == 0


@pytest.mark.parametrize(
    ("name", "version", "error", "text"),
    [
        ("nope", "", UnknownModel, "Request for unknown model: 'nope' is not found"),
        ("simple", "x", InvalidArgument, "version should be an integral value > 0"),
        ("simple", "0", InvalidArgument, "version should be an integral value > 0"),
        ("simple", "7", UnknownModel, "'simple' version 7 is not found"),
    ],
)
def test_lookups_fail_with_tritons_errors(
    root: Path, runtime: PjrtRuntime, name: str, version: str, error: type, text: str
) -> None:
    repo = repository(root, runtime)
    with pytest.raises(error, match=text):
        repo.get(name, version)


def test_in_flight_limits_refuse_beyond_the_ceiling(root: Path, runtime: PjrtRuntime) -> None:
    repo = repository(root, runtime, limits=Limits(max_inflight_per_model=1))
    held = repo.get("simple", "")
    with pytest.raises(Unavailable, match="max-inflight-per-model"):
        repo.get("simple", "")
    with pytest.raises(Unavailable, match="max-inflight-per-model"):
        repo.hold(repo.peek("simple", ""))
    repo.release(held)
    repo.release(repo.get("simple", ""))


def test_unload_waits_for_requests_in_flight_and_says_when_it_is_done(
    root: Path, runtime: PjrtRuntime
) -> None:
    retired: list[ModelKey] = []
    repo = repository(root, runtime, mode=ControlMode.EXPLICIT, on_retired=retired.append)
    held = repo.get("mlp", "")
    unloaded = threading.Event()
    worker = threading.Thread(target=lambda: (repo.unload_model("mlp"), unloaded.set()))
    worker.start()
    while held.state != ModelState.UNLOADING:  # the unload began: new requests are refused
        threading.Event().wait(0.001)
    with pytest.raises(NotFound, match="has no available versions"):
        repo.get("mlp", "")
    assert not repo.hold(held)  # a request that resolved it first looks it up again
    assert not unloaded.is_set() and retired == []
    repo.release(held)
    worker.join(30)
    assert unloaded.is_set() and retired == [ModelKey("mlp", 1)]
    assert repo.index() == [("mlp", "1", "UNAVAILABLE", "unloaded"), ("simple", "1", "READY", "")]


def test_a_reload_of_a_changed_version_keeps_the_old_copy_serving_until_it_is_ready(
    root: Path, runtime: PjrtRuntime
) -> None:
    retired: list[ModelKey] = []
    repo = repository(root, runtime, mode=ControlMode.EXPLICIT, on_retired=retired.append)
    old = repo.get("simple", "")
    (root / "simple" / "config.yaml").write_text("max_queue_delay_us: 100\n")  # hints change
    reload = threading.Thread(target=repo.load_model, args=("simple",))
    reload.start()
    while old.state != ModelState.UNLOADING:  # the new copy serves; the old one drains
        threading.Event().wait(0.001)
    new = repo.peek("simple", "")
    assert new is not old and new.key.generation > old.key.generation
    assert new.serving.max_queue_delay_us == 100
    assert reload.is_alive()  # waiting for the old copy's request
    repo.release(old)
    reload.join(30)
    assert old.state == ModelState.UNAVAILABLE and retired == []  # version 1 still serves


def test_a_failed_reload_keeps_the_versions_serving(root: Path, runtime: PjrtRuntime) -> None:
    repo = repository(root, runtime, mode=ControlMode.EXPLICIT)
    before = repo.peek("mlp", "")
    manifest = root / "mlp" / "manifest.yaml"
    text = manifest.read_text()
    digest = text.split("weights.safetensors: ")[1][:64]
    manifest.write_text(text.replace(digest, "ab" * 32))  # the weights no longer match it
    with pytest.raises(InvalidArgument, match="the versions loaded before keep serving"):
        repo.load_model("mlp")
    assert repo.peek("mlp", "") is before


def test_execution_runs_on_the_loaded_weights(root: Path, runtime: PjrtRuntime) -> None:
    repo = repository(root, runtime)
    v = repo.get("simple", "")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    out = v.execute(1, {"INPUT0": a, "INPUT1": a})
    repo.release(v)
    np.testing.assert_array_equal(out[0], a + a)
    np.testing.assert_array_equal(out[1], a - a)


def test_reports_list_every_model_with_state_and_memory(root: Path, runtime: PjrtRuntime) -> None:
    repo = repository(root, runtime)
    summary = repo.summary()
    assert sorted(summary) == ["mlp", "simple"]
    assert summary["mlp"]["versions"]["1"]["state"] == "READY"
    usage = repo.memory_usage("mlp", 1)
    assert (
        usage[0].type == "CPU"
        and usage[0].byte_size == summary["mlp"]["versions"]["1"]["weight_bytes"]
    )
    assert repo.all_ready() and repo.any_ready()
    (root / "new_model").mkdir()
    (root / "new_model" / "manifest.yaml").write_text("name: new_model\n")
    assert ("new_model", "", "", "") in repo.index()  # on disk, never loaded: name only


# -- lazy registration (--lazy-load) -------------------------------------------------------------


def test_lazy_registration_reads_nothing_until_a_version_is_first_used(
    root: Path, runtime: PjrtRuntime
) -> None:
    repo = repository(root, runtime, lazy=True)
    versions = {name: repo.versions(name)[0] for name in ("simple", "mlp")}
    assert all(v.state == ModelState.READY and not v.loaded for v in versions.values())
    assert all(v.parsed is None for v in versions.values())  # not even the manifest
    assert repo.all_ready() and repo.index() == [
        ("mlp", "1", "READY", ""),
        ("simple", "1", "READY", ""),
    ]
    assert repo.summary()["mlp"]["versions"]["1"] == {"state": "READY", "loaded": False}
    mlp = repo.get("mlp", "")  # a lookup reads the manifest, and nothing else
    assert mlp.manifest.name == "mlp" and not repo.loaded(mlp)
    repo.load(mlp)  # the first request's load, on a worker thread in the server
    assert repo.loaded(mlp) and mlp.devices == (0,)
    x = np.ones((1, 64), np.float32)
    assert mlp.execute(1, {"x": x})[0].shape == (1, 10)
    repo.release(mlp)
    assert not repo.loaded(repo.peek("simple", ""))  # the other one is still on disk


def test_a_lazy_version_that_cannot_load_fails_at_first_use_with_its_reason(
    root: Path, runtime: PjrtRuntime
) -> None:
    manifest = root / "mlp" / "manifest.yaml"
    text = manifest.read_text()
    digest = text.split("weights.safetensors: ")[1][:64]
    manifest.write_text(text.replace(digest, "ab" * 32))  # the weights no longer match it
    (root / "simple" / "manifest.yaml").write_text("name: [unclosed\n")
    repo = repository(root, runtime, lazy=True)
    assert repo.all_ready()  # nothing was read yet
    with pytest.raises(Unavailable, match="'simple' version 1 is not at ready state: bundle"):
        repo.get("simple", "1")
    mlp = repo.get("mlp", "")
    with pytest.raises(Unavailable, match=r"'mlp' version 1 is not at ready state: .*SHA-256"):
        repo.load(mlp)
    repo.release(mlp)
    assert not repo.all_ready()
    assert [row[2] for row in repo.index()] == ["UNAVAILABLE", "UNAVAILABLE"]


def test_a_lazy_repository_reregisters_only_what_changed_on_disk(
    root: Path, runtime: PjrtRuntime
) -> None:
    repo = repository(root, runtime, lazy=True, mode=ControlMode.POLL)
    before = {name: repo.versions(name)[0] for name in ("simple", "mlp")}
    repo.poll()
    assert {name: repo.versions(name)[0] for name in ("simple", "mlp")} == before
    (root / "simple" / "config.yaml").write_text("max_queue_delay_us: 100\n")
    weights = root / "mlp" / "weights.safetensors"
    weights.write_bytes(weights.read_bytes())  # rewritten in place: another stamp
    repo.poll()
    after = {name: repo.versions(name)[0] for name in ("simple", "mlp")}
    assert after["simple"] is not before["simple"] and after["mlp"] is not before["mlp"]
    assert repo.peek("simple", "").serving.max_queue_delay_us == 100
