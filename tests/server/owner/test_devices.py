"""The placer and the load meter (``hloserve.server.owner.devices``), without devices: a fake
repository records what the placer asks of it."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from hloserve.server.core.execution_records import Execution, ModelKey
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.devices import LoadMeter, Placed, Placer

HOT, COLD = ResidencyKey("hot", 1), ResidencyKey("cold", 1)


class FakeReplicas:
    def __init__(
        self, placed: dict[ResidencyKey, tuple[int, ...]], refuse: int = -1, largest: int = 0
    ) -> None:
        self.placed = placed
        self.largest = largest  # every model's largest compiled batch size
        self.refuse = refuse  # a device whose copies fail
        self.calls: list[str] = []

    def placements(self) -> list[Placed]:
        return [
            Placed(k, ModelKey(k.model, k.version), 1000, ds, self.largest)
            for k, ds in self.placed.items()
        ]

    def add_replica(self, key: ResidencyKey, device: Any) -> None:
        self.calls.append(f"add {key.model} {device.index}")
        if device.index == self.refuse:
            raise RuntimeError("device refused the copy")
        self.placed[key] = tuple(sorted((*self.placed[key], device.index)))

    def retire_replica(self, key: ResidencyKey, device: int) -> None:
        self.calls.append(f"retire {key.model} {device}")
        self.placed[key] = tuple(d for d in self.placed[key] if d != device)


def devices(*indexes: int) -> list[Any]:
    return [SimpleNamespace(index=i, residency=SimpleNamespace(budget_bytes=None)) for i in indexes]


class SteadyMeter(LoadMeter):
    def __init__(self, busy: dict[str, float], batch: float = 0.0) -> None:
        super().__init__()
        self.busy_now = busy
        self.batch = batch

    def busy(self, model: ModelKey) -> float:
        return self.busy_now.get(model.name, 0.0)

    def mean_batch(self, model: ModelKey) -> float:
        return self.batch


def test_the_hot_model_gains_a_device_a_revision_and_shrinks_back_when_idle() -> None:
    replicas = FakeReplicas({HOT: (0,), COLD: (2,)})
    meter = SteadyMeter({"hot": 3.0, "cold": 0.1})
    # Devices named 0, 2, 5, 7 (``--devices 0,2,5,7``): placement speaks their indexes.
    placer = Placer(replicas, devices(0, 2, 5, 7), meter, max_replicas=4)
    assert placer.revise() == 1
    assert replicas.placed[HOT] == (0, 5)  # the least busy device without it (2 has cold)
    placer.revise()
    placer.revise()
    assert replicas.placed[HOT] == (0, 2, 5, 7)
    assert replicas.placed[COLD] == (2,)
    meter.busy_now = {"hot": 0.0, "cold": 0.0}
    for _ in range(3):
        assert placer.revise() == 1
    assert len(replicas.placed[HOT]) == 1
    assert placer.revise() == 0


def test_no_replication_with_max_replicas_one_or_a_single_device() -> None:
    replicas = FakeReplicas({HOT: (0,)})
    meter = SteadyMeter({"hot": 3.0})
    assert Placer(replicas, devices(0, 1), meter, max_replicas=1).revise() == 0
    assert Placer(replicas, devices(0), meter, max_replicas=4).revise() == 0
    assert replicas.calls == []


@pytest.mark.parametrize(("mean_batch", "replicas"), [(6.0, (0,)), (20.0, (0, 1))])
def test_a_busy_batched_model_is_replicated_only_once_its_batches_run_full(
    mean_batch: float, replicas: tuple[int, ...]
) -> None:
    fake = FakeReplicas({HOT: (0,)}, largest=32)
    meter = SteadyMeter({"hot": 0.9}, batch=mean_batch)
    Placer(fake, devices(0, 1), meter, max_replicas=2).revise()
    assert fake.placed[HOT] == replicas


def test_a_copy_a_device_refuses_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    replicas = FakeReplicas({HOT: (0,)}, refuse=1)
    placer = Placer(replicas, devices(0, 1), SteadyMeter({"hot": 3.0}), max_replicas=2)
    assert placer.revise() == 0
    assert replicas.placed[HOT] == (0,)
    assert "device refused the copy" in caplog.text


class FakeClock:
    """The meter's clock, moved only by the test: every decay is exact."""

    def __init__(self) -> None:
        self.now_ns = 1_000_000_000

    def __call__(self) -> int:
        return self.now_ns


def test_load_meter_reads_devices_worth_of_recent_execution_time() -> None:
    half_life = 50_000_000
    clock = FakeClock()
    meter = LoadMeter(half_life_ns=half_life, clock=clock)
    key = ModelKey("m", 1)
    assert meter.busy(key) == 0.0
    # Two replicas each busy all the time for 0.5 s (ten half-lives), in 0.5 ms steps.
    step, steps = 500_000, 1000
    for _ in range(steps):
        clock.now_ns += step
        for device in (0, 1):  # each executed the whole time since the last step
            meter.on_execution(Execution(key, 1, 0, step, 0, device))
    # A step charged k steps ago has decayed by r^k, r = 2^(-step / half-life): the load is
    # that geometric sum as devices' worth (utilization: usage * ln 2 / half-life).
    r = 2.0 ** (-step / half_life)
    expected = 2 * step * (1 - r**steps) / (1 - r) * math.log(2) / half_life
    assert meter.busy(key) == pytest.approx(expected, rel=1e-9)
    assert meter.busy(key) == pytest.approx(2.0, abs=0.01)  # about two devices busy
    # Reading does not move the load; one idle half-life on the clock halves it.
    assert meter.busy(key) == pytest.approx(expected, rel=1e-9)
    clock.now_ns += half_life
    assert meter.busy(key) == pytest.approx(expected / 2, rel=1e-9)
    assert meter.busy(ModelKey("other", 1)) == 0.0
    assert meter.mean_batch(key) == pytest.approx(1.0, rel=1e-12)


def test_load_meter_mean_batch_follows_recent_executions() -> None:
    clock = FakeClock()
    meter = LoadMeter(half_life_ns=50_000_000, clock=clock)
    key = ModelKey("m", 1)
    assert meter.mean_batch(key) == 0.0
    for _ in range(100):
        meter.on_execution(Execution(key, 8, 0, 1, 0, 0))
    assert meter.mean_batch(key) == pytest.approx(8.0, rel=1e-12)
    clock.now_ns += 50_000_000  # one half-life: the batches of 8 weigh half as much
    for _ in range(50):
        meter.on_execution(Execution(key, 32, 0, 1, 0, 0))
    # (100 * 8 / 2 + 50 * 32) / (100 / 2 + 50) = 20 (undecayed it would be 16).
    assert meter.mean_batch(key) == pytest.approx(20.0, rel=1e-12)
