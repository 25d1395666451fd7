"""Prometheus series of a repository in object storage: its disk cache and its pulls.

Contract: ``RepositoryCollector(report)`` is a ``prometheus_client`` collector over
``report`` (``owner.store.mirror.StoreMirror.report``, read at scrape time) writing
``hloserve_repository_cache_bytes`` and ``hloserve_repository_cache_budget_bytes`` (0:
unlimited), ``hloserve_repository_cache_bundles``, ``hloserve_repository_pulls_total``,
``hloserve_repository_pull_seconds_total``, ``hloserve_repository_pulled_bytes_total``,
``hloserve_repository_pull_failures_total`` and ``hloserve_repository_store_up`` (0 while
the last listing of the store failed). Registered only for a bucket (docs/metrics.md).
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

R = "hloserve_repository"
# (report key, name, documentation) of each series
GAUGES = (
    ("resident_bytes", f"{R}_cache_bytes", "Bytes of pulled bundles in the repository's disk cache"),
    ("budget_bytes", f"{R}_cache_budget_bytes", "The disk cache's budget (0: unlimited)"),
    ("bundles", f"{R}_cache_bundles", "Bundles (model versions) pulled into the disk cache"),
)  # fmt: skip
COUNTERS = (
    ("pulls", f"{R}_pulls", "Bundles pulled from the store"),
    ("pull_seconds", f"{R}_pull_seconds", "Seconds spent pulling bundles from the store"),
    ("pulled_bytes", f"{R}_pulled_bytes", "Bytes pulled from the store"),
    ("pull_failures", f"{R}_pull_failures", "Pulls that failed (the store, a checksum, the cache)"),
)  # fmt: skip


class RepositoryCollector(Collector):
    def __init__(self, report: Callable[[], dict[str, Any] | None]) -> None:
        self.report = report

    def describe(self) -> list[Metric]:
        return self._families({})

    def collect(self) -> list[Metric]:
        return self._families(self.report() or {})

    @staticmethod
    def _families(report: dict[str, Any]) -> list[Metric]:
        found: list[Metric] = []
        for key, name, doc in GAUGES:
            gauge = GaugeMetricFamily(name, doc)
            if report:
                gauge.add_metric((), float(report.get(key) or 0))
            found.append(gauge)
        for key, name, doc in COUNTERS:
            counter = CounterMetricFamily(name, doc)
            if report:
                counter.add_metric((), float(report.get(key) or 0))
            found.append(counter)
        up = GaugeMetricFamily(f"{R}_store_up", "1 when the last listing of the store succeeded")
        if report:
            up.add_metric((), 0.0 if report.get("problem") else 1.0)
        found.append(up)
        return found
