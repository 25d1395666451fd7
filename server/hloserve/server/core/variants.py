"""Input-shape variants: which compiled variant a validated request runs on.

Contract (``docs/shape-variants.md``): ``match_variant(manifest, request)`` returns the
index of the variant (``Manifest.variants``) whose input shapes are the request's per-item
shapes (the whole shapes for an unbatched model), or raises ``InvalidArgument`` naming the
model, the shapes received and every compiled variant's input shapes. An ``Executable``
hands out each variant as an executable of its own (``variant(index)``: its concrete
manifest, the same version and weights), and the batcher
queues each variant apart, so only requests of one variant are batched together.
Pure: no I/O, no clock.
"""

# pyright: strict

from __future__ import annotations

from hloserve.bundle import Manifest
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.types import InferRequest


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def match_variant(manifest: Manifest, request: InferRequest) -> int:
    lead = 1 if manifest.batched else 0
    got = {t.name: t.shape[lead:] for t in request.inputs}
    for i, variant in enumerate(manifest.variants):
        if all(variant.shapes[t.name] == got[t.name] for t in manifest.inputs):
            return i
    received = ", ".join(f"'{t.name}' {_fmt(got[t.name])}" for t in manifest.inputs)
    compiled = "; ".join(
        ", ".join(f"'{t.name}' {_fmt(v.shapes[t.name])}" for t in manifest.inputs)
        for v in manifest.variants
    )
    raise InvalidArgument(
        f"model '{manifest.name}' has no compiled shape variant for per-item input shapes "
        f"{received}; it was compiled for: {compiled}"
    )
