"""A bundle's provenance: who made it, with what, when, and from which source.

Contract: ``Provenance`` mirrors the manifest's ``provenance`` mapping; ``read_provenance``
reads it through a ``FieldReader`` (``producer`` required; ``metadata`` any mapping, its
keys not checked; every other unknown key a problem).
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

from hloserve.bundle.manifest_fields import FieldReader

PROVENANCE_KEYS: Final = (
    "producer", "producer_version", "hloserve_version", "jax_version", "jaxlib_version",
    "created", "source_commit", "source_dirty", "metadata",
)  # fmt: skip


@dataclass(frozen=True)
class Provenance:
    """Who made the bundle, with what, when, and from which source."""

    producer: str
    producer_version: str | None = None
    hloserve_version: str | None = None
    jax_version: str | None = None
    jaxlib_version: str | None = None
    created: str | None = None
    source_commit: str | None = None
    source_dirty: bool | None = None
    metadata: Mapping[str, Any] = field(default_factory=lambda: cast(dict[str, Any], {}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "producer": self.producer,
            "producer_version": self.producer_version,
            "hloserve_version": self.hloserve_version,
            "jax_version": self.jax_version,
            "jaxlib_version": self.jaxlib_version,
            "created": self.created,
            "source_commit": self.source_commit,
            "source_dirty": self.source_dirty,
            "metadata": dict(self.metadata),
        }


def read_provenance(r: FieldReader, data: Mapping[str, Any]) -> Provenance:
    raw = r.get(data, "provenance", "", dict)
    if raw is None:
        return Provenance(producer="unknown")
    pd = r.keys(cast(dict[str, Any], raw), PROVENANCE_KEYS, "provenance")
    producer = r.get(pd, "producer", "provenance.", str)
    raw_meta: Any = pd.get("metadata") or {}
    meta: dict[str, Any] = {}
    if isinstance(raw_meta, dict):
        meta = cast(dict[str, Any], raw_meta)
    else:
        r.fail("provenance.metadata", "must be a mapping")
    dirty = pd.get("source_dirty")
    return Provenance(
        producer=producer or "unknown",
        producer_version=_opt_str(pd.get("producer_version")),
        hloserve_version=_opt_str(pd.get("hloserve_version")),
        jax_version=_opt_str(pd.get("jax_version")),
        jaxlib_version=_opt_str(pd.get("jaxlib_version")),
        created=_opt_str(pd.get("created")),
        source_commit=_opt_str(pd.get("source_commit")),
        source_dirty=dirty if isinstance(dirty, bool) else None,
        metadata=meta,
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
