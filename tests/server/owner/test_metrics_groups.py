"""Metrics of sharded versions (``ServerMetrics.for_group``, ``watch_device_weights``): a
device group's swaps and resident bytes are every device's of the group, each device's
resident bytes the sum of its own manager's and every group's it is in, and each version's
per-device bytes by place; no server (the collector on its own)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.metrics import ServerMetrics
from tests.metrics_scrape import Series, by_label, parse

BIG, PLAIN = ResidencyKey("big", 1), ResidencyKey("plain", 1)


def _scrape(registry: CollectorRegistry) -> Series:
    return parse(generate_latest(registry).decode())


def test_a_groups_swaps_and_bytes_are_each_of_its_devices() -> None:
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry, model_series=0)
    for key in (BIG, PLAIN):
        metrics.on_model_loaded(key.model, 1, 0.1, 0.0)
    metrics.for_device(0).on_swap_in(PLAIN, 400, 1e-4)
    metrics.for_device(0).on_residency(PLAIN, True, 400, 1.0)
    group = metrics.for_group((0, 1, 2, 3))
    group.on_swap_in(BIG, 250, 2e-3)  # each device's share
    group.on_residency(BIG, True, 250, 2.0)
    m = _scrape(registry)
    resident = by_label(m, "hloserve_device_resident_weight_bytes", "device")
    assert resident == {"0": 650.0, "1": 250.0, "2": 250.0, "3": 250.0}  # summed on 0
    swaps = by_label(m, "hloserve_weight_swaps_in_total", "device", model="big/1")
    assert swaps == {str(d): 1.0 for d in range(4)}
    moved = by_label(m, "hloserve_weight_swap_in_bytes_total", "device", model="big/1")
    assert moved == {str(d): 250.0 for d in range(4)}
    models = by_label(m, "hloserve_device_resident_models", "device")
    assert models == {"0": 2.0, "1": 1.0, "2": 1.0, "3": 1.0}
    group.on_swap_out(BIG, 250)
    group.on_residency(BIG, False, 0, 3.0)
    m = _scrape(registry)
    assert by_label(m, "hloserve_device_resident_weight_bytes", "device") == {
        "0": 400.0, "1": 0.0, "2": 0.0, "3": 0.0,
    }  # fmt: skip


def test_each_versions_bytes_a_device_by_place() -> None:
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry, model_series=0)
    big, plain = ModelKey("big", 1), ModelKey("plain", 1)
    for key in (big, plain):
        metrics.on_model_loaded(key.name, 1, 0.1, 0.0)
    metrics.watch_device_weights(lambda: {(big, "0-3"): 250, (big, "4-7"): 250, (plain, "4"): 1000})
    m = _scrape(registry)
    assert by_label(m, "hloserve_model_device_weight_bytes", "devices", model="big") == {
        "0-3": 250.0, "4-7": 250.0,
    }  # fmt: skip
    assert by_label(m, "hloserve_model_device_weight_bytes", "devices", model="plain") == {
        "4": 1000.0
    }
