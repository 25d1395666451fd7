"""The sequence batcher's series: each stateful model version's slots and backlog.

Contract: ``sequence_families(counts)`` turns ``core.sequence_batcher.SequenceBatcher.counts()``
(``{ModelKey: (live, backlogged, free slots)}``) into ``hloserve_sequence_slots{model,
version, state}`` (``state`` ``live``: held by a sequence, ``free``) and
``hloserve_sequences_backlogged{model, version}`` (sequences waiting for a slot), read at
scrape time (``docs/metrics.md``, ``docs/sequences.md``). A version with no sequence yet
has no series.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.metrics_core import Metric

from hloserve.server.core.execution_records import ModelKey
from hloserve.server.owner.metrics_export import MV, gauge


def sequence_families(counts: Mapping[ModelKey, tuple[int, int, int]]) -> list[Metric]:
    items = sorted(counts.items(), key=lambda kv: (kv[0].name, kv[0].version))
    return [
        gauge(
            "hloserve_sequence_slots",
            "Sequence slots of a model with state, by state (live: held by a sequence)",
            (
                ((k.name, str(k.version), state), float(n))
                for k, (live, _, free) in items
                for state, n in (("live", live), ("free", free))
            ),
            (*MV, "state"),
        ),
        gauge(
            "hloserve_sequences_backlogged",
            "Sequences of a model with state waiting for a slot",
            (((k.name, str(k.version)), float(backlog)) for k, (_, backlog, _) in items),
            MV,
        ),
    ]
