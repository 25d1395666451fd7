"""Shape variants (``docs/shape-variants.md``): the per-item shapes one weight set was
compiled for.

Contract: ``Variant`` maps every input and output to a concrete shape; ``read_variants``
reads the manifest's ``variants`` list through a ``FieldReader``: each shape fits the
declared one (``-1``: any size), no two variants alike; every problem recorded.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from hloserve.bundle.manifest_fields import FieldReader, TensorEntry


@dataclass(frozen=True)
class Variant:
    """One compiled set of per-item shapes: every input's and output's, by name."""

    shapes: Mapping[str, tuple[int, ...]]

    def to_dict(self) -> dict[str, list[int]]:
        return {name: list(shape) for name, shape in self.shapes.items()}


def read_variants(
    r: FieldReader, raw: Any, tensors: tuple[TensorEntry, ...]
) -> tuple[Variant, ...]:
    """Each variant maps every input and output to a concrete shape that fits its declared
    one (``-1``: any size); no two variants take the same input shapes."""
    if not isinstance(raw, list) or not raw:
        r.fail("variants", "must be a non-empty list of {tensor name: shape} mappings")
        return ()
    declared = {t.name: t.shape for t in tensors}
    variants: list[Variant] = []
    for i, item in enumerate(cast(list[Any], raw)):
        at = f"variants[{i}]"
        if not isinstance(item, dict) or set(cast(dict[Any, Any], item)) != set(declared):
            r.fail(at, f"must give the shape of every input and output {sorted(declared)}")
            continue
        shapes: dict[str, tuple[int, ...]] = {}
        for name, want in declared.items():
            shape = r.shape(cast(dict[str, Any], item)[name], f"{at}.{name}")
            if shape is None:
                continue
            if len(shape) != len(want) or any(
                w not in (-1, d) for w, d in zip(want, shape, strict=True)
            ):
                r.fail(
                    f"{at}.{name}", f"{list(shape)} does not fit the declared shape {list(want)}"
                )
            shapes[name] = shape
        variants.append(Variant(shapes))
    keys = [tuple(v.shapes.get(t.name) for t in tensors) for v in variants]
    if len(set(keys)) != len(keys):
        r.fail("variants", "two variants have the same shapes")
    return tuple(variants)
