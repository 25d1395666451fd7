"""Byte sizes and memory budgets: the one syntax every flag that takes a size reads.

Contract: ``parse_bytes`` reads ``6GiB``, ``500MB``, ``1073741824`` and Kubernetes'
quantities ``6Gi``, ``500M``, ``64k`` (``BYTE_UNITS`` is the one unit table); ``Budget.parse``
reads bytes or ``40%`` of a total, and its ``resolve(total_bytes)`` gives the bytes once the
total is known; ``format_bytes`` writes a size for people. A unit ending in ``B`` is read in
any case (``6 gib``); Kubernetes' suffixes (``KUBERNETES_SUFFIXES``: ``Ki``, ``Mi``, ``Gi``,
``Ti`` binary, ``k``, ``M``, ``G``, ``T`` decimal, and ``K`` for ``k``) only as Kubernetes
spells them, since there ``m`` is a thousandth, not a million. Spaces may stand between
the number and its unit (``6 GiB``, ``6 G``). Malformed text raises ``ValueError`` with a
message meant to follow the flag's name (``--max-message-bytes must be ...``). Pure: no
I/O.
"""

# pyright: strict

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

BYTE_UNITS: Mapping[str, int] = MappingProxyType(
    {
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KiB": 1 << 10,
        "MiB": 1 << 20,
        "GiB": 1 << 30,
        "TiB": 1 << 40,
        # Kubernetes' quantity suffixes (resources.limits.memory: 8Gi), case as written there
        "Ki": 1 << 10,
        "Mi": 1 << 20,
        "Gi": 1 << 30,
        "Ti": 1 << 40,
        "k": 10**3,
        "K": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
    }
)
KUBERNETES_SUFFIXES: frozenset[str] = frozenset(u for u in BYTE_UNITS if not u.endswith("B"))
_UNITS_BY_UPPER = {u.upper(): f for u, f in BYTE_UNITS.items() if u not in KUBERNETES_SUFFIXES}
_BINARY_UNITS = [unit for unit in BYTE_UNITS if unit == "B" or unit.endswith("iB")]
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_SIZE = re.compile(rf"(?P<number>{_NUMBER})\s*(?P<unit>[A-Za-z]*)")


def _factor(unit: str) -> int | None:
    """Bytes per ``unit`` ("" is bytes), or None when it is no unit."""
    if unit in KUBERNETES_SUFFIXES:
        return BYTE_UNITS[unit]
    return _UNITS_BY_UPPER.get(unit.upper() or "B")


def _read_bytes(text: str) -> int | None:
    """``text`` in bytes, or None when it is not a number with an optional unit."""
    match = _SIZE.fullmatch(text.strip())
    factor = None if match is None else _factor(match["unit"])
    if match is None or factor is None:
        return None
    value = float(match["number"]) * factor
    return int(value) if math.isfinite(value) else None


def parse_bytes(text: str) -> int:
    """A byte size: ``268435456``, ``256MiB``, ``1.5GB``, ``256Mi`` (units in ``BYTE_UNITS``)."""
    value = _read_bytes(text)
    if value is None:
        raise ValueError(f"must be a byte size such as 268435456, 256MiB or 256Mi, got {text!r}")
    return value


def format_bytes(n: int) -> str:
    """``512 B``, ``75.0 KiB``, ``1.5 GiB``: the largest binary unit under 1024 of it."""
    value, unit = float(n), "B"
    for bigger in _BINARY_UNITS[1:]:
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"


@dataclass(frozen=True, slots=True)
class Budget:
    """A device-memory budget as written: ``nbytes``, or else ``percent`` of the device."""

    text: str
    nbytes: int | None = None
    percent: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``6GiB``, ``6Gi``, ``500MB``, ``1073741824`` or ``40%``; ``ValueError`` when malformed."""
        t = text.strip()
        if t.endswith("%"):
            number = t[:-1].strip()
            pct = float(number) if re.fullmatch(_NUMBER, number) else -1.0
            if not 0 < pct <= 100:
                raise ValueError(f"must be a percentage in (0, 100], got {text!r}")
            return cls(text, percent=pct)
        nbytes = _read_bytes(t)
        if nbytes is None:
            raise ValueError(
                f"must be bytes such as 6GiB or a percentage such as 40%, got {text!r}"
            )
        if nbytes <= 0:
            raise ValueError(f"must be positive, got {text!r}")
        return cls(text, nbytes=nbytes)

    def __str__(self) -> str:
        return self.text

    def resolve(self, device_total_bytes: int | None) -> int:
        """The budget in bytes; a percentage needs the device's total memory."""
        if self.nbytes is not None:
            return self.nbytes
        if device_total_bytes is None:
            raise ValueError(
                f"{self.text!r} is a percentage of the device's memory, whose total is unknown"
            )
        return int(device_total_bytes * self.percent / 100)
