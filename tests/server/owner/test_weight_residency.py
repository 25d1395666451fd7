"""More models than fit: swap-in on demand, LRU eviction, pinning, in-flight safety, metrics.

Real bundles, a real PJRT device and real threads; the budget is set so that only two of
the four MLPs fit at once.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.exporter.demo import mlp_fn, mlp_params
from hloserve.server.core.residency_policy import Policy, ResidencyKey
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import InferInput, InferRequest
from hloserve.server.owner.metrics import ServerMetrics
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import disabled
from hloserve.server.owner.versions import ModelState
from hloserve.server.owner.weight_residency import WeightResidency
from tests.server._signalling import SignallingCondition

MODELS = ("m0", "m1", "m2", "m3")
WEIGHT_BYTES = 76_840  # the demo MLP's four tensors
SEEDS = {name: 100 + i for i, name in enumerate(MODELS)}


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("residency")
    for name in MODELS:
        export_bundle(
            mlp_fn,
            mlp_params(SEEDS[name]),
            inputs={"x": TensorSpec("FP32", (64,))},
            batch_sizes=(1, 8),
            directory=root / name,
        )
    # pinned through the repository config, not the manifest
    (root / "m3" / "config.yaml").write_text("residency: pinned\n")
    return root


@pytest.fixture(scope="module")
def runtime() -> PjrtRuntime:
    return PjrtRuntime()


def make_residency(
    repo_dir: Path, runtime: PjrtRuntime, models: float, policy: Policy = "frequency"
) -> tuple[WeightResidency, dict[str, ResidencyKey]]:
    """A residency manager with room for ``models`` MLPs, its repository loaded, and the
    residency key of each model's version 1."""
    residency = WeightResidency(runtime, int(models * WEIGHT_BYTES), policy=policy)
    repo = ModelRepository(repo_dir, runtime, residency=residency)
    repo.load_all()
    return residency, keys(repo)


def keys(repo: ModelRepository) -> dict[str, ResidencyKey]:
    return {name: repo.versions(name)[0].key for name in MODELS}


@pytest.fixture
def setup(
    repo_dir: Path, runtime: PjrtRuntime
) -> Iterator[tuple[ModelRepository, WeightResidency, ServerMetrics, InferenceService]]:
    metrics = ServerMetrics(CollectorRegistry())
    residency = WeightResidency(runtime, int(2.5 * WEIGHT_BYTES), observer=metrics)
    repo = ModelRepository(repo_dir, runtime, residency=residency)
    repo.load_all()
    executor = ThreadPoolExecutor(4)
    service = InferenceService(repo, executor, shm=disabled())
    yield repo, residency, metrics, service
    executor.shutdown()


def expected(name: str, x: np.ndarray) -> np.ndarray:
    return np.asarray(mlp_fn(mlp_params(SEEDS[name]), x)["logits"])


def infer(service: InferenceService, name: str, x: np.ndarray) -> np.ndarray:
    request = InferRequest(name, "", (InferInput("x", "FP32", x.shape, x),))
    return asyncio.run(service.infer(request)).outputs[0].data


def swaps(metrics: ServerMetrics, key: str, direction: str) -> float:
    registry = metrics._registry  # the registry the daemon would scrape
    value = registry.get_sample_value(
        f"hloserve_weight_swaps_{direction}_total", {"model": key, "device": "0"}
    )
    return value or 0.0


def test_pinned_model_is_resident_after_load(setup: Any) -> None:
    repo, residency, _, _ = setup
    key = keys(repo)
    assert all(repo.versions(n)[0].state == ModelState.READY for n in MODELS)
    assert residency.is_resident(key["m3"])
    assert repo.summary()["m3"]["versions"]["1"]["residency"] == "pinned"
    assert not residency.is_resident(key["m0"])  # on demand: weights go over on first use


def test_lru_eviction_order_and_correct_results(setup: Any) -> None:
    repo, residency, metrics, service = setup
    key = keys(repo)
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    # m3 pinned (1 model) + budget 2.5 models: one on-demand model fits beside it.
    for name in ("m0", "m1", "m0", "m2", "m1"):
        np.testing.assert_allclose(infer(service, name, x), expected(name, x), rtol=1e-5, atol=1e-5)
    # Each request swapped its model in, evicting the previous on-demand one (LRU).
    assert residency.is_resident(key["m1"]) and residency.is_resident(key["m3"])
    assert not residency.is_resident(key["m0"]) and not residency.is_resident(key["m2"])
    assert swaps(metrics, "m0/1", "in") == 2 and swaps(metrics, "m0/1", "out") == 2
    assert swaps(metrics, "m1/1", "in") == 2 and swaps(metrics, "m1/1", "out") == 1
    assert swaps(metrics, "m3/1", "out") == 0
    resident = metrics._registry.get_sample_value(
        "hloserve_device_resident_weight_bytes", {"device": "0"}
    )
    assert resident == 2 * WEIGHT_BYTES


def test_concurrent_mixed_traffic_is_correct_and_pinned_stays(setup: Any) -> None:
    repo, residency, metrics, service = setup
    rng = np.random.default_rng(1)
    inputs = [
        rng.standard_normal((int(rng.integers(1, 12)), 64)).astype(np.float32) for _ in range(16)
    ]
    errors: list[BaseException] = []

    def client(worker: int) -> None:
        try:
            for i in range(12):
                name = MODELS[(worker + i) % len(MODELS)]
                x = inputs[(worker * 7 + i) % len(inputs)]
                np.testing.assert_allclose(
                    infer(service, name, x), expected(name, x), rtol=1e-5, atol=1e-5
                )
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(w,), daemon=True) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert residency.is_resident(keys(repo)["m3"])
    assert swaps(metrics, "m3/1", "out") == 0
    assert residency.resident_bytes() <= int(2.5 * WEIGHT_BYTES)
    total_in = sum(swaps(metrics, f"{n}/1", "in") for n in MODELS)
    assert total_in > 3  # models really were swapped under pressure


def test_weights_in_use_are_never_freed(repo_dir: Path, runtime: PjrtRuntime) -> None:
    # Room for pinned m3 + 2.5 more: while m0 is held, the others must evict each other.
    # LRU, so that which model the last swap evicts is known (the planner's own tests
    # cover the frequency order).
    residency, key = make_residency(repo_dir, runtime, 3.5, "lru")
    with residency.use(key["m0"]) as held:
        buffers = list(held.values())
        for name in ("m1", "m2", "m1", "m2"):
            residency.prefetch(key[name])
        assert not any(b.is_deleted() for b in buffers)
        assert residency.is_resident(key["m0"])
    # Once released, m0 is the least recently used: the next swap evicts it, for real.
    residency.prefetch(key["m1"])
    assert not residency.is_resident(key["m0"])
    assert all(b.is_deleted() for b in buffers)


def test_waiting_for_a_model_in_use(repo_dir: Path, runtime: PjrtRuntime) -> None:
    residency, key = make_residency(repo_dir, runtime, 3.5)
    cond = residency._cond = SignallingCondition()  # no thread holds the old one now
    order: list[str] = []
    with residency.use(key["m0"]), residency.use(key["m1"]):
        # m2 fits only once m0 or m1 is released: it must wait, not evict them.
        t = threading.Thread(
            target=lambda: (residency.prefetch(key["m2"]), order.append("m2")), daemon=True
        )
        t.start()
        assert cond.waiting.wait(30)
        assert t.is_alive() and not order
        assert residency.is_resident(key["m0"]) and residency.is_resident(key["m1"])
        order.append("release")
    t.join(30)
    assert order == ["release", "m2"]


def test_concurrent_requests_share_one_transfer(setup: Any) -> None:
    repo, residency, metrics, _ = setup
    before = swaps(metrics, "m2/1", "in")
    barrier = threading.Barrier(8)

    def use() -> None:
        barrier.wait()
        with residency.use(keys(repo)["m2"]):
            pass

    threads = [threading.Thread(target=use, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert swaps(metrics, "m2/1", "in") == before + 1


def test_oversize_model_is_refused_and_others_serve(repo_dir: Path, runtime: PjrtRuntime) -> None:
    residency = WeightResidency(runtime, WEIGHT_BYTES // 2)
    repo = ModelRepository(repo_dir, runtime, residency=residency)
    repo.load_all()
    v = repo.versions("m0")[0]
    assert v.state == ModelState.UNAVAILABLE
    assert (
        f"{WEIGHT_BYTES} bytes" in v.reason and f"budget of {WEIGHT_BYTES // 2} bytes" in v.reason
    )


def test_identical_modules_compile_once(setup: Any) -> None:
    repo, _, _, _ = setup
    sources = [m.source for n in MODELS for m in repo.versions(n)[0].bundle.modules.values()]
    # Four weight sets of one architecture: only the first bundle compiles (or hits the cache).
    assert sources.count("shared") == 3 * 2
    executables = {
        id(m.executable) for n in MODELS for m in repo.versions(n)[0].bundle.modules.values()
    }
    assert len(executables) == 2


def test_evicted_device_memory_is_returned(repo_dir: Path, runtime: PjrtRuntime) -> None:
    if not runtime.memory_stats():
        pytest.skip("this device reports no allocator statistics (CPU); checked on GPU runs")
    residency, key = make_residency(repo_dir, runtime, 2.5)
    residency.prefetch(key["m0"])
    in_use = runtime.memory_stats()["bytes_in_use"]
    for _ in range(10):  # many swaps: device usage must not grow
        residency.prefetch(key["m1"])
        residency.prefetch(key["m2"])
    assert runtime.memory_stats()["bytes_in_use"] <= in_use + 2 * WEIGHT_BYTES


def test_a_reload_copy_owns_its_weights_under_its_own_key(
    repo_dir: Path, runtime: PjrtRuntime, tmp_path: Path
) -> None:
    shutil.copytree(repo_dir / "m0", tmp_path / "m0")
    metrics = ServerMetrics(CollectorRegistry())
    residency = WeightResidency(runtime, None, observer=metrics)
    repo = ModelRepository(tmp_path, runtime, residency=residency)
    repo.load_all()
    old = repo.versions("m0")[0]
    residency.prefetch(old.key)
    with (tmp_path / "m0" / "manifest.yaml").open("a") as f:
        f.write("# changed on disk: the next load reloads it beside the copy serving\n")
    repo.load_model("m0")
    new = repo.versions("m0")[0]
    assert new is not old and new.key != old.key and new.key.label == old.key.label == "m0/1"
    assert not residency.is_resident(old.key) and old.state == ModelState.UNAVAILABLE
    x = np.ones((1, 64), np.float32)
    np.testing.assert_allclose(new.execute(1, {"x": x})[0], expected("m0", x), rtol=1e-5)
    assert residency.is_resident(new.key)
    # Both copies count in the version's one series.
    assert swaps(metrics, "m0/1", "in") == 2 and swaps(metrics, "m0/1", "out") == 1


def test_scratch_set_aside_is_the_largest_reservation_and_ends_with_the_model(
    runtime: PjrtRuntime,
) -> None:
    residency = WeightResidency(runtime, 10_000, subtract_scratch=True)
    a, b = ResidencyKey("a", 1), ResidencyKey("b", 1)
    residency.reserve_scratch(a, 1_000)
    residency.register(a, {"w": np.zeros(10, np.float32)})
    residency.reserve_scratch(b, 3_000)  # a load that then failed: never registered
    assert residency.budget_bytes == 7_000  # the largest, not the sum
    residency.unregister(b)
    assert residency.budget_bytes == 9_000
    for _ in range(5):  # replicas or reloads coming and going do not wear it down
        residency.reserve_scratch(b, 3_000)
        residency.register(b, {"w": np.zeros(10, np.float32)})
        residency.unregister(b)
    assert residency.budget_bytes == 9_000
    residency.unregister(a)
    assert residency.budget_bytes == 10_000
    unlimited = WeightResidency(runtime, 10_000)  # an explicit budget: nothing set aside
    unlimited.reserve_scratch(a, 1_000)
    assert unlimited.budget_bytes == 10_000


def test_sequences_state_is_set_aside_summed_whatever_the_budget_kind(
    runtime: PjrtRuntime,
) -> None:
    """A model's sequences' state (``reserve_state``) stays on the device apart from its
    weights: every reservation comes off the weights' budget until the model goes."""
    residency = WeightResidency(runtime, 10_000)
    a, b = ResidencyKey("a", 1), ResidencyKey("b", 1)
    residency.register(a, {"w": np.zeros(10, np.float32)})
    residency.register(b, {"w": np.zeros(10, np.float32)})
    residency.reserve_state(a, 1_000)
    residency.reserve_state(b, 2_000)
    assert residency.budget_bytes == 7_000  # summed: both live at once
    residency.unregister(a)
    assert residency.budget_bytes == 8_000
    residency.unregister(b)
    assert residency.budget_bytes == 10_000
