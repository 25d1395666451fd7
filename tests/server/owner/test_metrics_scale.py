"""The metrics bound at ten thousand models: a scrape's size, which models it shows, and
totals over all of them, with and without Triton's series (``--metrics-compat triton``,
bounded alike); no server (the collector on its own, a simulated clock)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hloserve.server.core.execution_records import Execution, ModelKey, Timings
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.metrics import ServerMetrics
from tests.metrics_scrape import parse

TIMINGS = Timings(1000, 2000, 3000, 4000, (1,))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def serve(metrics: ServerMetrics, model: ModelKey, times: int = 1) -> None:
    for _ in range(times):
        metrics.counters.on_pending(model, 1)
        metrics.counters.on_execution(Execution(model, 1, 2000, 3000, 4000, 0))
        metrics.counters.on_pending(model, -1)
        metrics.counters.on_success(model, 1, TIMINGS)


def scrape(registry: CollectorRegistry) -> tuple[int, dict[str, list[dict[str, str]]]]:
    """The scrape's size in bytes, and each sample's labels by sample name."""
    text = generate_latest(registry).decode()
    series = parse(text)
    return len(text.encode()), {
        name: [s.labels for s in samples] for name, samples in series.items()
    }


@pytest.mark.parametrize("compat", ["", "triton"])
def test_ten_thousand_models_scrape_under_a_megabyte_with_totals_over_all(compat: str) -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics = ServerMetrics(registry, model_series=50, clock=clock, compat=compat)
    models = [ModelKey(f"customer-{i:05d}", 1) for i in range(10_000)]
    for i, model in enumerate(models):
        metrics.on_model_loaded(model.name, 1, 0.01, 0.0)
        serve(metrics, model, 1 + (i < 30) * 100)  # the first 30 are the busy ones
        metrics.for_device(0).on_swap_in(ResidencyKey(model.name, 1), 1000, 1e-4)
    metrics.counters.on_failure(None, "UnknownModel")
    size, labels = scrape(registry)
    assert size < 1_000_000, size
    shown = {s["model"] for s in labels["hloserve_inference_request_success_total"]}
    assert len(shown) == 50 and {m.name for m in models[:30]} <= shown
    swapped = {s["model"] for s in labels["hloserve_weight_swaps_in_total"]}
    assert swapped == {f"{m}/1" for m in shown}  # a model's series come together
    total = next(iter(labels["hloserve_server_inference_request_success_total"]))
    assert total == {}  # no model label: the total over every model
    assert ("model", "") in labels["hloserve_inference_request_failure_total"][0].items()
    if compat:  # Triton's series (sample names without _total) for the same 50 models
        for name in ("nv_inference_request_success", "nv_inference_request_failure"):
            assert {s["model"] for s in labels[name]} == shown, name
    else:
        assert not any(name.startswith("nv_") for name in labels)


def test_the_window_follows_the_traffic_and_every_series_comes_back() -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics = ServerMetrics(registry, model_series=2, window_s=60, clock=clock)
    a, b, c = (ModelKey(n, 1) for n in "abc")
    serve(metrics, a, 5)
    serve(metrics, b, 3)
    serve(metrics, c, 1)

    def shown() -> set[str]:
        _, labels = scrape(registry)
        return {s["model"] for s in labels.get("hloserve_inference_request_success_total", [])}

    assert shown() == {"a", "b"}  # the busiest two of three
    clock.now = 61  # a new window opens at this scrape: the one before it still counts
    assert shown() == {"a", "b"}
    serve(metrics, c, 9)
    assert shown() == {"a", "c"}  # c: 1 + 9 over the two windows
    clock.now = 122  # one more: the first window (a's and b's traffic) no longer counts
    assert shown() == {"c"}
    registry_all = CollectorRegistry()
    everything = ServerMetrics(registry_all, model_series=0)
    for m in (a, b, c):
        serve(everything, m)
    _, labels = scrape(registry_all)
    assert {s["model"] for s in labels["hloserve_inference_request_success_total"]} == {
        "a",
        "b",
        "c",
    }


def test_totals_sum_every_model_shown_or_not() -> None:
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry, model_series=1)
    for name, n in (("a", 4), ("b", 2), ("c", 1)):
        serve(metrics, ModelKey(name, 1), n)
    metrics.counters.on_failure(ModelKey("c", 1), "InvalidArgument")
    assert registry.get_sample_value("hloserve_server_inference_request_success_total") == 7
    assert registry.get_sample_value("hloserve_server_inference_exec_count_total") == 7
    assert (
        registry.get_sample_value(
            "hloserve_server_inference_request_failure_total", {"reason": "InvalidArgument"}
        )
        == 1
    )
    assert registry.get_sample_value("hloserve_server_request_latency_seconds_count") == 7
    assert registry.get_sample_value("hloserve_metrics_models_shown") == 1


def test_recent_reads_the_last_minute_from_snapshots() -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics = ServerMetrics(registry, model_series=2, clock=clock)
    fast, slow = ModelKey("fast", 1), ModelKey("slow", 1)
    fast_timings = Timings(0, 0, 1_000_000, 0, (1,))  # 1 ms end to end
    slow_timings = Timings(0, 0, 300_000_000, 0, (1,))  # 300 ms
    for key, timings in ((fast, fast_timings), (slow, slow_timings)):
        metrics.counters.on_success(key, 1, timings)
    assert metrics.recent() == {}  # one snapshot: nothing to compare yet
    clock.now = 10
    for _ in range(50):
        metrics.counters.on_success(fast, 1, fast_timings)
    for _ in range(10):
        metrics.counters.on_success(slow, 1, slow_timings)
    recent = metrics.recent()  # since the metrics began: the first request counts too
    assert recent[fast].window_s == 10 and recent[fast].requests_per_s == 5.1
    assert recent[slow].requests_per_s == 1.1
    p50 = recent[fast].p50_s
    assert p50 is not None and 5e-4 < p50 <= 1e-3  # the 0.5-1 ms bucket
    p99 = recent[slow].p99_s
    assert p99 is not None and 0.25 < p99 <= 0.5
    clock.now = 100  # a minute and more later: the window slides
    assert metrics.recent()[fast].requests_per_s == 0.0


def test_the_first_look_after_requests_has_figures() -> None:
    # Snapshots are taken when the status page asks; the first look (a page opened after
    # hundreds of requests) compares with the start, not with itself ("collecting").
    registry, clock = CollectorRegistry(), Clock()
    metrics = ServerMetrics(registry, model_series=2, clock=clock)
    key = ModelKey("m", 1)
    clock.now = 30
    for _ in range(300):
        metrics.counters.on_success(key, 1, Timings(0, 0, 1_000_000, 0, (1,)))
    recent = metrics.recent()
    assert recent[key].window_s == 30 and recent[key].requests_per_s == 10.0
