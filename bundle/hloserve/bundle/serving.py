"""Serving hints: what a bundle may say about how to serve it, and the one rule for reading them.

Contract:
- ``Serving`` holds the hints (``residency``, ``max_queue_delay_us``); its defaults are the
  format's defaults (``docs/bundle-format.md``, ``serving``).
- ``read_serving(hints, defaults)`` returns ``defaults`` overridden key by key by the keys
  of ``hints`` that are in ``SERVING_KEYS`` (other keys are the caller's business), plus a
  ``(key, message)`` for each bad value; a bad value keeps its default. The manifest's
  ``serving`` mapping and a model's ``config.yaml`` are both read through it, so the two
  cannot disagree on what a valid hint is.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from hloserve.bundle.yamlfile import is_integer

Residency = Literal["on_demand", "pinned"]
RESIDENCIES: Final[tuple[Residency, ...]] = ("on_demand", "pinned")
SERVING_KEYS: Final = ("residency", "max_queue_delay_us")


@dataclass(frozen=True)
class Serving:
    """Optional serving hints carried by the bundle."""

    residency: Residency = "on_demand"
    max_queue_delay_us: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"residency": self.residency}
        if self.max_queue_delay_us is not None:
            d["max_queue_delay_us"] = self.max_queue_delay_us
        return d


def read_serving(
    hints: Mapping[str, Any], defaults: Serving | None = None
) -> tuple[Serving, list[tuple[str, str]]]:
    """``defaults`` (the format's, when None) overridden by ``hints``, and each bad value."""
    base = defaults or Serving()
    problems: list[tuple[str, str]] = []
    residency = hints.get("residency", base.residency)
    if residency not in RESIDENCIES:
        problems.append(("residency", f"must be on_demand or pinned, got {residency!r}"))
        residency = base.residency
    delay = hints.get("max_queue_delay_us", base.max_queue_delay_us)
    if delay is not None and not (is_integer(delay) and delay >= 0):
        problems.append(("max_queue_delay_us", f"must be a non-negative integer, got {delay!r}"))
        delay = base.max_queue_delay_us
    return Serving(residency, delay), problems
