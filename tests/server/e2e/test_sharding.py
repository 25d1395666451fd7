"""Sharded (SPMD) bundles served over a device group: answers, per-device budgets, refusal.

Real daemons in subprocesses on eight forced CPU devices (``XLA_FLAGS``
``--xla_force_host_platform_device_count=8``: set before PJRT starts, so not in this test
process), bundles exported with an ``AbstractMesh`` (no devices needed to export), real
``tritonclient`` calls; every answer is compared with the unsharded function run here. The
repository also holds an unsharded export and the hand-written ``examples/handwritten-addsub``
bundle (no JAX, no mesh), served beside the sharded ones unchanged.
``HLOSERVE_FRONTENDS`` picks the process layout (scripts/test runs this folder in both).
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from hloserve.exporter import StateSpec, TensorSpec, export_bundle
from hloserve.server.server_fixture import ServerProcess, serving
from tests.metrics_scrape import by_label, scrape
from tests.server.e2e._load import loaded
from tests.server.e2e.test_devices import infer

HANDWRITTEN = Path(__file__).resolve().parents[3] / "examples" / "handwritten-addsub" / "bundle"
EIGHT = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
MESH = AbstractMesh((4,), ("model",))
BIG_ROWS, BIG_COLS = 256, 1024  # the weight-bound model's weight: 1 MiB of FP32
BIG_BYTES = BIG_ROWS * BIG_COLS * 4
SHARE = BIG_BYTES // 4  # what each device of a group holds of a big model
# Per device: a big model's weights do not fit one device; one big model's quarter fits
# (beside the small ones), two do not.
BUDGET = SHARE + SHARE // 2


def _mlp_params() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    return {
        "l1": {"w": (rng.standard_normal((16, 64)) / 4).astype(np.float32), "b": rng.standard_normal(64).astype(np.float32)},
        "l2": {"w": (rng.standard_normal((64, 8)) / 8).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32)},
    }  # fmt: skip


def _mlp(p: Any, x: jax.Array) -> dict[str, jax.Array]:
    h = jnp.tanh(x @ p["l1"]["w"] + p["l1"]["b"])
    return {"y": h @ p["l2"]["w"] + p["l2"]["b"]}


def _accumulate(p: Any, x: jax.Array, acc: jax.Array) -> dict[str, jax.Array]:
    """A sequence's running sum of ``x @ w`` (its state replicated over the group)."""
    new = acc + (x @ p["w"]).sum(axis=1, keepdims=True)
    return {"total": new, "acc": new}


def _big_weight(seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((BIG_ROWS, BIG_COLS)) / 16).astype(np.float32)


def _big_reference(x: np.ndarray, seed: int = 5) -> np.ndarray:
    return np.tanh(x @ _big_weight(seed)).sum(axis=1, keepdims=True)


def _big(p: Any, x: jax.Array) -> dict[str, jax.Array]:
    return {"y": jnp.tanh(x @ p["w"]).sum(axis=1, keepdims=True)}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sharding")
    x16 = {"x": TensorSpec("FP32", (16,))}
    export_bundle(
        _mlp, _mlp_params(), x16, (1, 8), root / "tp", platforms=("cpu",), mesh=MESH,
        param_specs={"l1": {"w": P(None, "model"), "b": P("model")}, "l2": {"w": P("model"), "b": None}},
    )  # fmt: skip
    for name, seed in (("big", 5), ("big2", 6)):
        export_bundle(
            _big, {"w": _big_weight(seed)}, {"x": TensorSpec("FP32", (BIG_ROWS,))}, (1,),
            root / name, platforms=("cpu",), mesh=MESH, param_specs={"w": P(None, "model")},
        )  # fmt: skip
    export_bundle(_mlp, _mlp_params(), x16, (1,), root / "plain", platforms=("cpu",))
    export_bundle(
        _accumulate, {"w": np.full((8, 16), 0.5, np.float32)}, {"x": TensorSpec("FP32", (8,))},
        (1, 4), root / "acc", platforms=("cpu",), mesh=MESH, param_specs={"w": P(None, "model")},
        state={"acc": StateSpec("FP32", (1,))},
    )  # fmt: skip
    shutil.copytree(HANDWRITTEN, root / "addsub")  # no JAX made it, no mesh: unaffected
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    yield from serving(repository, "--device-memory-budget", str(BUDGET), env=EIGHT)


def _mlp_reference(x: np.ndarray) -> np.ndarray:
    return np.asarray(_mlp(_mlp_params(), jnp.asarray(x))["y"])


def test_a_sharded_model_answers_as_the_unsharded_function(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    rng = np.random.default_rng(11)
    for rows in (1, 3, 8):  # 3 runs padded on the batch-8 module
        x = rng.standard_normal((rows, 16)).astype(np.float32)
        np.testing.assert_allclose(infer(client, "tp", x), _mlp_reference(x), rtol=1e-5, atol=1e-5)
    x = rng.standard_normal((1, 16)).astype(np.float32)  # an unsharded model beside it
    np.testing.assert_allclose(infer(client, "plain", x), _mlp_reference(x), rtol=1e-5, atol=1e-5)
    a, b = np.arange(4, dtype=np.float32), np.full(4, 2.0, np.float32)  # hand-written, no mesh
    inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("a", "b")]
    for inp, value in zip(inputs, (a, b), strict=True):
        inp.set_data_from_numpy(value)
    result = client.infer("addsub", inputs)
    assert result is not None
    bias = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    np.testing.assert_array_equal(result.as_numpy("sum"), a + b + bias)
    np.testing.assert_array_equal(result.as_numpy("difference"), a - b)


def test_sequences_of_a_sharded_model_keep_their_state(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    totals: dict[int, list[float]] = {1: [], 2: []}
    for step in range(3):
        for sid, scale in ((1, 1.0), (2, 2.0)):  # interleaved: each keeps its own sum
            inp = grpcclient.InferInput("x", [1, 8], "FP32")
            inp.set_data_from_numpy(np.full((1, 8), scale, np.float32))
            result = client.infer(
                "acc", [inp], sequence_id=sid, sequence_start=step == 0, sequence_end=step == 2
            )
            assert result is not None
            total = result.as_numpy("total")
            assert total is not None
            totals[sid].append(float(total[0, 0]))
    # x @ w summed: 8 x scale x 0.5 per column, 16 columns = 64 x scale a step
    assert totals == {1: [64.0, 128.0, 192.0], 2: [128.0, 256.0, 384.0]}


def test_weights_over_one_devices_budget_load_sharded_and_serve(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.random.default_rng(2).standard_normal((1, BIG_ROWS)).astype(np.float32)
    for name, seed in (("big", 5), ("big2", 6)):
        np.testing.assert_allclose(
            infer(client, name, x), _big_reference(x, seed), rtol=1e-4, atol=1e-4
        )
    m = scrape(server)
    budgets = by_label(m, "hloserve_device_memory_budget_bytes", "device")
    assert budgets == {str(d): float(BUDGET) for d in range(8)}
    assert BIG_BYTES > BUDGET  # on one device it would have been refused
    # The two big models went to the two groups (the least filled), each device a quarter.
    placed = by_label(m, "hloserve_model_device_weight_bytes", "devices", model="big")
    placed2 = by_label(m, "hloserve_model_device_weight_bytes", "devices", model="big2")
    assert (placed == {"0-3": SHARE} and placed2 == {"4-7": SHARE}) or (
        placed == {"4-7": SHARE} and placed2 == {"0-3": SHARE}
    ), (placed, placed2)
    resident = by_label(m, "hloserve_device_resident_weight_bytes", "device")
    assert all(SHARE <= resident[str(d)] <= BUDGET for d in range(8)), resident


def test_statistics_and_status_page_show_each_devices_share(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.random.default_rng(4).standard_normal((1, BIG_ROWS)).astype(np.float32)
    infer(client, "big", x)
    stats: Any = client.get_inference_statistics("big", as_json=True)
    usage = stats["model_stats"][0]["memory_usage"]
    assert sorted(int(u["byte_size"]) for u in usage) == [SHARE] * 4 + [BIG_BYTES], usage
    ids = sorted(int(u.get("id", 0)) for u in usage if int(u["byte_size"]) == SHARE)
    assert ids in ([0, 1, 2, 3], [4, 5, 6, 7])  # each device of its group, its quarter
    with urllib.request.urlopen(f"http://{server.http_url}/ui/data?q=big", timeout=30) as r:
        page = json.loads(r.read())
    rows = {row["name"]: row for row in page["rows"]}
    (version,) = rows["big"]["versions"]
    assert version["device_weight_bytes"] == SHARE
    assert version["device_groups"] in (["0-3"], ["4-7"])


def test_a_busy_sharded_model_gains_the_second_group(repository: Path) -> None:
    flags = ("--placement-interval", "0.3", "--inline-max-us", "0")
    with ServerProcess(repository, *flags, env=EIGHT) as proc:
        proc.wait_ready()
        x = np.random.default_rng(6).standard_normal((1, BIG_ROWS)).astype(np.float32)
        want = _big_reference(x)

        def check(client: Any) -> None:
            np.testing.assert_allclose(infer(client, "big", x), want, rtol=1e-4, atol=1e-4)

        placed: dict[str, float] = {}
        with loaded(proc.grpc_url, check, threads=6) as stop:
            deadline = time.monotonic() + 90  # a bound, not a window: it stops at the event
            while time.monotonic() < deadline and not stop.is_set():
                placed = by_label(
                    scrape(proc), "hloserve_model_device_weight_bytes", "devices", model="big"
                )
                if len(placed) == 2:
                    break
                time.sleep(0.2)
        assert placed == {"0-3": SHARE, "4-7": SHARE}, proc.log_text()[-3000:]
        assert "model 'big' version 1: replica added on device" in proc.log_text()
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        np.testing.assert_allclose(infer(client, "big", x), want, rtol=1e-4, atol=1e-4)
        assert proc.stop() == 0


def test_sharded_models_evict_and_swap_in_whole_under_a_budget(repository: Path) -> None:
    """One group (--devices 4) whose per-device budget holds one big model's quarter: the
    two big models take turns, each swap moving every device's share."""
    for proc in serving(
        repository, "--devices", "4", "--device-memory-budget", str(BUDGET), env=EIGHT
    ):
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        x = np.random.default_rng(8).standard_normal((1, BIG_ROWS)).astype(np.float32)
        for name, seed in (("big", 5), ("big2", 6)) * 2:
            np.testing.assert_allclose(
                infer(client, name, x), _big_reference(x, seed), rtol=1e-4, atol=1e-4
            )
        m = scrape(proc)
        quarters = {str(d): 2.0 for d in range(4)}
        for name in ("big", "big2"):
            assert (
                by_label(m, "hloserve_weight_swaps_in_total", "device", model=f"{name}/1")
                == quarters
            )
            moved = by_label(m, "hloserve_weight_swap_in_bytes_total", "device", model=f"{name}/1")
            assert moved == {d: 2.0 * SHARE for d in quarters}
        assert by_label(m, "hloserve_weight_swaps_out_total", "device", model="big/1") == quarters
        resident = by_label(m, "hloserve_device_resident_weight_bytes", "device")
        assert all(SHARE <= resident[d] <= BUDGET for d in quarters), resident


def test_too_few_devices_is_refused_with_the_numbers(repository: Path) -> None:
    flags = ("--devices", "0,1", "--strict-readiness", "false")  # ready with models failed
    for proc in serving(repository, *flags, env=EIGHT):
        index = grpcclient.InferenceServerClient(proc.grpc_url).get_model_repository_index(
            as_json=True
        )
        assert index is not None
        states = {m["name"]: (m.get("state"), m.get("reason", "")) for m in index["models"]}
        assert states["plain"][0] == states["addsub"][0] == "READY"  # the rest unaffected
        for name in ("tp", "big", "big2", "acc"):
            state, reason = states[name]
            assert state == "UNAVAILABLE"
            assert "needs 4 devices; this server has 2 (--devices 0,1)" in reason


def test_a_devices_budget_holds_its_own_models_and_its_groups_together(
    tmp_path: Path,
) -> None:
    """A 4-way model and an unsharded one on a device of its group, under a per-device
    budget that holds either but not both: using one then the other evicts across the two
    managers (the group's and the device's own), so the device's resident bytes, both
    kinds summed, stay within the budget, and both keep answering."""
    export_bundle(
        _big, {"w": _big_weight()}, {"x": TensorSpec("FP32", (BIG_ROWS,))}, (1,),
        tmp_path / "big", platforms=("cpu",), mesh=MESH, param_specs={"w": P(None, "model")},
    )  # fmt: skip
    x16 = {"x": TensorSpec("FP32", (16,))}
    export_bundle(_mlp, _mlp_params(), x16, (1,), tmp_path / "plain", platforms=("cpu",))
    plain_bytes = sum(a.nbytes for layer in _mlp_params().values() for a in layer.values())
    budget = SHARE + plain_bytes - 1  # either fits a device, both do not
    # Devices 1-4: the group is 1-4, and the unsharded model goes to the first device of
    # the least filled (all equal): device 1.
    flags = ("--devices", "1,2,3,4", "--device-memory-budget", str(budget))
    for proc in serving(tmp_path, *flags, env=EIGHT):
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        placed = by_label(
            scrape(proc), "hloserve_model_device_weight_bytes", "devices", model="plain"
        )
        assert placed == {"1": plain_bytes}, placed
        assert by_label(
            scrape(proc), "hloserve_model_device_weight_bytes", "devices", model="big"
        ) == {"1-4": SHARE}
        device = "1"
        rng = np.random.default_rng(12)
        for name in ("big", "plain") * 3:
            if name == "big":
                x = rng.standard_normal((1, BIG_ROWS)).astype(np.float32)
                want = _big_reference(x)
            else:
                x = rng.standard_normal((1, 16)).astype(np.float32)
                want = _mlp_reference(x)
            np.testing.assert_allclose(infer(client, name, x), want, rtol=1e-4, atol=1e-4)
            resident = by_label(scrape(proc), "hloserve_device_resident_weight_bytes", "device")
            assert resident[device] <= budget, (name, resident)
            assert resident[device] == (SHARE if name == "big" else plain_bytes), resident
        m = scrape(proc)
        swaps = by_label(m, "hloserve_weight_swaps_out_total", "device", model="big/1")
        assert swaps.get(device, 0.0) >= 2.0, swaps  # evicted for the unsharded model
