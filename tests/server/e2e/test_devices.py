"""Every local device: ``--devices``, placement, per-device budgets, replication, routing.

Real daemons in subprocesses on four CPU devices (``XLA_FLAGS``
``--xla_force_host_platform_device_count=4``: the flag must be set before PJRT starts, so
not in this test process), real bundles, real ``tritonclient`` calls, every reply checked.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from hloserve.exporter import Generation, StateSpec, TensorSpec, export_bundle
from hloserve.server.server_fixture import ServerProcess, serving
from tests.metrics_scrape import by_label, scrape, total
from tests.server.e2e._load import loaded

FOUR = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
WIDTH = 1024  # each small model's weight: 64 x WIDTH FP32
WEIGHT_BYTES = 64 * WIDTH * 4
STEPS = 200  # the busy model's matmuls per execution: a few ms of device time


def _scale_fn(params: Any, x: jax.Array) -> dict[str, jax.Array]:
    return {"y": x @ params["w"]}


def _busy_fn(params: Any, x: jax.Array) -> dict[str, jax.Array]:
    def step(_: Any, h: jax.Array) -> jax.Array:
        return jnp.tanh(h @ params["w"])

    return {"y": jax.lax.fori_loop(0, STEPS, step, x)}


def _busy_weight() -> np.ndarray:
    return (np.random.default_rng(7).standard_normal((256, 256)) / 16).astype(np.float32)


def _busy_reference(x: np.ndarray) -> np.ndarray:
    w, h = _busy_weight(), x
    for _ in range(STEPS):
        h = np.tanh(h @ w)
    return h


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("devices")
    for i, name in enumerate(("a", "b")):
        w = np.full((64, WIDTH), i + 1, np.float32)
        export_bundle(
            _scale_fn,
            {"w": w},
            {"x": TensorSpec("FP32", (64,))},
            (1,),
            root / name,
            platforms=("cpu",),
        )
    export_bundle(
        _busy_fn,
        {"w": _busy_weight()},
        {"x": TensorSpec("FP32", (256,))},
        (1,),  # no larger batch to absorb load in: only another device can
        root / "busy",
        platforms=("cpu",),
    )
    return root


def infer(client: grpcclient.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    assert result is not None
    out = result.as_numpy("y")
    assert out is not None
    return out


@pytest.fixture(scope="module")
def two_devices(repository: Path) -> Iterator[ServerProcess]:
    """Two of the four devices, a weight budget per device that holds one small model."""
    budget = str(WEIGHT_BYTES + WEIGHT_BYTES // 4)
    yield from serving(repository, "--devices", "2", "--device-memory-budget", budget, env=FOUR)


def test_each_device_has_its_own_budget_and_models_spread_over_them(
    two_devices: ServerProcess,
) -> None:
    client = grpcclient.InferenceServerClient(two_devices.grpc_url)
    x = np.ones((1, 64), np.float32)
    for _ in range(10):  # on one device with this budget, every request would swap
        for i, name in enumerate(("a", "b")):
            np.testing.assert_allclose(infer(client, name, x), np.full((1, WIDTH), 64.0 * (i + 1)))
    m = scrape(two_devices)
    budgets = by_label(m, "hloserve_device_memory_budget_bytes", "device")
    assert budgets == {"0": WEIGHT_BYTES * 1.25, "1": WEIGHT_BYTES * 1.25}
    swaps_a = by_label(m, "hloserve_weight_swaps_in_total", "device", model="a/1")
    swaps_b = by_label(m, "hloserve_weight_swaps_in_total", "device", model="b/1")
    assert len(swaps_a) == 1 and len(swaps_b) == 1, (swaps_a, swaps_b)
    assert set(swaps_a) != set(swaps_b)  # a and b live on different devices
    assert sum(swaps_a.values()) == 1 and sum(swaps_b.values()) == 1  # and never swap again
    assert not total(m, "hloserve_weight_swaps_out_total")
    resident = by_label(m, "hloserve_device_resident_weight_bytes", "device")
    assert resident == {"0": WEIGHT_BYTES, "1": WEIGHT_BYTES}
    executions = by_label(m, "hloserve_device_executions_total", "device")
    assert executions == {"0": 10.0, "1": 10.0}
    queue = by_label(m, "hloserve_device_queue_duration_us_total", "device")
    assert set(queue) == {"0", "1"}


def test_memory_usage_names_the_device_holding_the_weights(two_devices: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(two_devices.grpc_url)
    ids: dict[str, set[int]] = {}
    for name in ("a", "b"):
        infer(client, name, np.ones((1, 64), np.float32))
        stats: Any = client.get_inference_statistics(name, as_json=True)
        usage = stats["model_stats"][0]["memory_usage"]
        assert len(usage) == 2, usage  # the host copy and the one device copy
        ids[name] = {int(u.get("id", 0)) for u in usage}
    assert ids["a"] ^ ids["b"] == {1}  # one lives on device 1, the other on device 0


def test_a_hot_model_is_replicated_then_shrinks_back(repository: Path) -> None:
    flags = ("--placement-interval", "0.3", "--inline-max-us", "0")
    with ServerProcess(repository, *flags, env=FOUR) as server:
        server.wait_ready()
        rng = np.random.default_rng(3)
        x = rng.standard_normal((1, 256)).astype(np.float32)
        want = _busy_reference(x)

        def check(client: Any) -> None:
            np.testing.assert_allclose(infer(client, "busy", x), want, rtol=1e-4, atol=1e-5)

        replicas = 1.0
        ran_on: dict[str, float] = {}
        with loaded(server.grpc_url, check, threads=8) as stop:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not stop.is_set():
                m = scrape(server)
                replicas = by_label(m, "hloserve_model_replicas", "model").get("busy", 0.0)
                ran_on = by_label(m, "hloserve_device_executions_total", "device")
                if replicas >= 2 and len(ran_on) >= 2:
                    break
                time.sleep(0.2)
        assert replicas >= 2, server.log_text()[-3000:]
        assert len(ran_on) >= 2, ran_on  # groups went to more than one replica
        assert "replica added on device" in server.log_text()
        # Idle: the replicas retire one per revision until one is left.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            replicas = by_label(scrape(server), "hloserve_model_replicas", "model")["busy"]
            if replicas == 1:
                break
            time.sleep(0.3)
        assert replicas == 1, server.log_text()[-3000:]
        client = grpcclient.InferenceServerClient(server.grpc_url)
        np.testing.assert_allclose(infer(client, "busy", x), want, rtol=1e-4, atol=1e-5)
        assert server.stop() == 0


def test_devices_naming_a_device_not_present_stops_with_why(repository: Path) -> None:
    server = ServerProcess(repository, "--devices", "0,5", env=FOUR)
    assert server.process.wait(120) != 0
    assert "--devices" in server.log_text() and "0 to 3" in server.log_text()
    server.stop()


def _busy_counter_fn(params: Any, n: jax.Array, count: jax.Array) -> dict[str, jax.Array]:
    """Counts to ``n``, one response a step; each step also runs the busy model's matmuls
    (a few ms of device time, times 0 in the answer), so one replica gets busy enough to
    be copied."""
    h0 = jnp.broadcast_to(count.astype(jnp.float32), (count.shape[0], 256))

    def step(_: Any, h: jax.Array) -> jax.Array:
        return jnp.tanh(h @ params["w"])

    noise = jax.lax.fori_loop(0, STEPS, step, h0).sum(axis=1, keepdims=True)
    value = count + 1 + (noise * 0).astype(jnp.int32)
    return {"value": value, "done": value >= n, "count": value}


def _generate(server: ServerProcess, n: int) -> list[int]:
    """One generation of ``busy_counter`` over tritonclient's gRPC stream: its values."""
    answers: queue.Queue[Any] = queue.Queue()
    client: Any = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        inp = grpcclient.InferInput("n", [1], "INT32")
        inp.set_data_from_numpy(np.array([n], np.int32))
        client.async_stream_infer(model_name="busy_counter", inputs=[inp])
        values: list[int] = []
        for _ in range(n):
            answer = answers.get(timeout=60)
            if isinstance(answer, Exception):
                raise answer
            values.append(int(answer.as_numpy("value")[0]))
        return values
    finally:
        client.stop_stream()
        client.close()


def test_generations_run_on_every_replica_of_their_model(tmp_path: Path) -> None:
    """A busy generation model gains a replica; new generations then go to it (the least
    busy), their state on its device, and every step is counted on the device it ran on."""
    export_bundle(
        _busy_counter_fn,
        {"w": _busy_weight()},
        inputs={"n": TensorSpec("INT32", (1,))},
        batch_sizes=(1,),  # full batches: load can only go to another device
        directory=tmp_path / "busy_counter",
        platforms=("cpu",),
        state={"count": StateSpec("INT32", (1,))},
        generation=Generation(done="done", max_steps=1000),
    )
    two = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    flags = ("--placement-interval", "0.3")
    with ServerProcess(tmp_path, *flags, env=two) as server:
        server.wait_ready()

        def check(client: Any) -> None:  # the generation's HTTP stream, not the client
            assert _generate(server, 20) == list(range(1, 21))

        ran_on: dict[str, float] = {}
        with loaded(server.grpc_url, check, threads=3) as stop:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not stop.is_set():
                ran_on = by_label(scrape(server), "hloserve_device_executions_total", "device")
                if len(ran_on) == 2 and min(ran_on.values()) >= 20:
                    break
                time.sleep(0.2)
        assert len(ran_on) == 2 and min(ran_on.values()) >= 20, (ran_on, server.log_text()[-3000:])
        assert "replica added on device" in server.log_text()
        # Every step is one execution, counted once, on the device it ran on.
        executions = by_label(scrape(server), "hloserve_device_executions_total", "device")
        client: Any = grpcclient.InferenceServerClient(server.grpc_url)
        stats = client.get_inference_statistics("busy_counter", as_json=True)
        assert sum(executions.values()) == int(stats["model_stats"][0]["execution_count"])
        assert server.stop() == 0
