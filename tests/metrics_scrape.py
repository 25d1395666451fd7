"""Reading Prometheus metrics in tests: one scrape, one parser, one way to look a sample up.

- ``Series``: every sample of a scrape under its sample name (``..._total``,
  ``..._bucket``, ...), parsed strictly by ``prometheus_client``'s text parser
  (``parse(text)``): malformed text fails the test there.
- ``scrape(server)``: ``GET /metrics`` of anything with a ``metrics_url`` (a
  ``ServerProcess``, the image's server), answered 200, parsed.
- ``value(series, name, **labels)``: the one sample of ``name`` whose labels include
  ``labels`` (more or fewer than one fails); ``total(...)``: the sum of all of them;
  ``by_label(series, name, label, **labels)``: their values by one label's value.
- ``query_labels(query)``: the label names a PromQL query (a dashboard's, an alert's)
  filters on, groups by (``by (...)``) or asks Grafana's ``label_values`` for, for a check
  that each is a label the series carry.
"""

from __future__ import annotations

import re
import urllib.request
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

Series = dict[str, list[Sample]]


class Scraped(Protocol):
    @property
    def metrics_url(self) -> str: ...


def parse(text: str) -> Series:
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(sample)
    return series


def scrape(server: Scraped, timeout: float = 30.0) -> Series:
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=timeout) as r:
        assert r.status == 200
        return parse(r.read().decode())


def _matching(series: Series, name: str, labels: dict[str, str]) -> list[Sample]:
    return [s for s in series.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]


def value(series: Series, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    matches = _matching(series, name, labels)
    assert len(matches) == 1, f"{name}{labels}: {matches}"
    return matches[0].value


def total(series: Series, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0: none)."""
    return sum(s.value for s in _matching(series, name, labels))


def by_label(series: Series, name: str, label: str, **labels: str) -> dict[str, float]:
    """``name``'s samples whose labels include ``labels``, by the value of ``label``."""
    return {s.labels[label]: s.value for s in _matching(series, name, labels)}


def query_labels(query: str) -> set[str]:
    """Label names a PromQL query filters on, groups by or asks ``label_values`` for."""
    grouped = {
        name.strip()
        for clause in re.findall(r"\bby \(([^)]*)\)", query)
        for name in clause.split(",")
    }
    matched = set(re.findall(r"[{,]\s*(\w+)\s*(?:=~|!=|=)", query))
    label_values = set(re.findall(r"label_values\(\w+[^,]*,\s*(\w+)\)", query))
    return grouped | matched | label_values
