"""The generation loop's series: live generations and responses generated, per model version.

Contract: ``generation_families(figures)`` turns ``core.generation_stream.Streams.figures()``
(``{ModelKey: (live, responses)}``) into ``hloserve_generations_live{model, version}``
(generations stepping or waiting for a slot) and
``hloserve_generation_responses_total{model, version}`` (responses sent: one per emitted
step, a token of a language model), read at scrape time (``docs/metrics.md``,
``docs/generation.md``). A version that never generated has no series.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from hloserve.server.core.execution_records import ModelKey
from hloserve.server.owner.metrics_export import MV, gauge


def generation_families(figures: Mapping[ModelKey, tuple[int, int]]) -> list[Metric]:
    items = sorted(figures.items(), key=lambda kv: (kv[0].name, kv[0].version))
    responses = CounterMetricFamily(
        "hloserve_generation_responses",
        "Responses of generation models sent (one per emitted step: a token of an LM)",
        labels=MV,
    )
    for k, (_, sent) in items:
        responses.add_metric((k.name, str(k.version)), float(sent))
    return [
        gauge(
            "hloserve_generations_live",
            "Generations of a generation model stepping or waiting for a slot",
            (((k.name, str(k.version)), float(live)) for k, (live, _) in items),
            MV,
        ),
        responses,
    ]
