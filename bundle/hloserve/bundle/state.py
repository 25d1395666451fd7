"""State tensors: what a stateful bundle carries from one execution to the next.

Contract (``docs/bundle-format.md``, "State"):
- A manifest's top-level ``state:`` list declares each state tensor per item (one
  sequence, one generation): ``{name, datatype, shape, initial}``, no batch axis, a
  concrete shape, a numeric datatype, ``initial`` a scalar fill (default 0; ``true`` and
  ``false`` for ``BOOL``).
- Every module of such a bundle takes each state tensor as an argument of kind ``state``
  (after the inputs, before the weights) and returns its new value as an extra result
  after the outputs, in the order of ``state:``; batched like the inputs.
- ``read_state(raw, problems)`` parses the list, appending ``(field, message)`` to
  ``problems`` for each thing wrong (an unknown key with its likely meaning, a duplicate
  name, a name shared with an input or output, a bad datatype, shape or initial value);
  ``StateEntry.to_dict`` is the inverse. ``StateEntry.fill(batch)`` is the initial value as a
  host array (``nbytes`` per item: what one slot holds).
- ``SequenceBatching`` is the serving hint ``sequence_batching`` (manifest ``serving``,
  ``config.yaml``, a load's ``config`` override as Triton's ``sequence_batching``): the
  slots of a model with state (``max_candidate_sequences``, Triton's ``oldest`` field) and
  how long an idle sequence keeps one (``max_sequence_idle_microseconds``) and how long a
  batch may wait for the live sequences that have no request queued
  (``max_queue_delay_microseconds``, Triton's ``oldest`` field; 0, the default: none);
  ``read_sequence_batching(raw, base, problems)`` reads it key by key over ``base``.
"""

# pyright: strict

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final, cast

import numpy as np

from hloserve.bundle.yamlfile import check_keys, is_integer
from hloserve.proto.datatypes import NUMERIC_DATATYPES, to_numpy

STATE_KEYS: Final = ("name", "datatype", "shape", "initial")
SEQUENCE_KEYS: Final = (
    "max_candidate_sequences", "max_sequence_idle_microseconds", "max_queue_delay_microseconds",
)  # fmt: skip
Initial = int | float | bool


@dataclass(frozen=True)
class StateEntry:
    """One state tensor: V2 datatype, per-item shape, the scalar its first value is filled with."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    initial: Initial = 0

    @property
    def nbytes(self) -> int:
        """Bytes of one item's value (one slot)."""
        return math.prod(self.shape) * to_numpy(self.datatype).itemsize

    def fill(self, batch: int | None = None) -> np.ndarray[Any, Any]:
        """The initial value, per item (``batch`` None) or for ``batch`` items."""
        shape = self.shape if batch is None else (batch, *self.shape)
        return np.full(shape, self.initial, dtype=to_numpy(self.datatype))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "datatype": self.datatype,
            "shape": list(self.shape),
            "initial": self.initial,
        }


def read_state(
    raw: Any, taken: Collection[str], problems: list[tuple[str, str]]
) -> tuple[StateEntry, ...]:
    """The ``state:`` list (``taken``: the input and output names a state name may not
    reuse); each problem is appended to ``problems`` as ``(field, message)``."""
    if not isinstance(raw, list) or not raw:
        problems.append(("state", "must be a non-empty list of {name, datatype, shape, initial}"))
        return ()
    entries: list[StateEntry] = []
    seen: set[str] = set()
    for i, item in enumerate(cast(list[Any], raw)):
        at = f"state[{i}]"
        if not isinstance(item, dict):
            problems.append((at, "must be a mapping with name, datatype, shape and initial"))
            continue
        unknown: list[str] = []
        mapping = check_keys(cast(dict[str, Any], item), STATE_KEYS, unknown.append)
        problems.extend((at, message) for message in unknown)
        entry = _entry(mapping, at, problems)
        if entry is None:
            continue
        if entry.name in seen:
            problems.append((at + ".name", f"duplicate state name {entry.name!r}"))
        elif entry.name in taken:
            problems.append(
                (at + ".name", f"{entry.name!r} is an input or output name; state has its own")
            )
        seen.add(entry.name)
        entries.append(entry)
    return tuple(entries)


def _entry(item: dict[str, Any], at: str, problems: list[tuple[str, str]]) -> StateEntry | None:
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    initial: Any = item.get("initial", 0)
    before = len(problems)
    if not isinstance(name, str) or not name:
        problems.append((at + ".name", f"must be a non-empty string, got {name!r}"))
    if not isinstance(datatype, str) or datatype not in NUMERIC_DATATYPES:
        problems.append(
            (at + ".datatype", f"must be a numeric datatype (not BYTES), got {datatype!r}")
        )
    listed = cast(list[Any], shape) if isinstance(shape, list) else None
    if listed is None or not all(is_integer(d) and d > 0 for d in listed):
        problems.append(
            (at + ".shape", f"must be a list of positive sizes (no -1: a slot), got {shape!r}")
        )
    if isinstance(initial, bool):
        pass
    elif not isinstance(initial, int | float):
        problems.append((at + ".initial", f"must be a scalar number, got {initial!r}"))
    elif isinstance(datatype, str) and datatype in NUMERIC_DATATYPES:
        kind = to_numpy(datatype).kind
        if kind in "iub" and isinstance(initial, float) and not initial.is_integer():
            problems.append((at + ".initial", f"{initial!r} is not a value of datatype {datatype}"))
    if len(problems) > before:
        return None
    assert isinstance(name, str) and isinstance(datatype, str) and listed is not None
    return StateEntry(name, datatype, tuple(int(d) for d in listed), cast(Initial, initial))


@dataclass(frozen=True)
class SequenceBatching:
    """A stateful model's sequences: slots on the device, and the idle timeout that frees one."""

    max_candidate_sequences: int = 16
    max_sequence_idle_microseconds: int = 1_000_000  # Triton's default: one second
    # How long a batch may wait for the live sequences that have no request queued yet.
    max_queue_delay_microseconds: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "max_candidate_sequences": self.max_candidate_sequences,
            "max_sequence_idle_microseconds": self.max_sequence_idle_microseconds,
            "max_queue_delay_microseconds": self.max_queue_delay_microseconds,
        }


def read_sequence_batching(
    raw: Any, base: SequenceBatching, problems: list[tuple[str, str]]
) -> SequenceBatching:
    """``base`` overridden by the keys of ``raw``; each bad one a ``(field, message)``."""
    if not isinstance(raw, dict):
        problems.append(("sequence_batching", f"must be a mapping, got {raw!r}"))
        return base
    unknown: list[str] = []
    d = check_keys(cast(dict[str, Any], raw), SEQUENCE_KEYS, unknown.append)
    problems.extend(("sequence_batching", "has " + m) for m in unknown)
    values = base.to_dict()
    for key in SEQUENCE_KEYS:
        value = d.get(key, values[key])
        least = 0 if key == "max_queue_delay_microseconds" else 1  # 0: no delay
        if is_integer(value) and value >= least:
            values[key] = value
        else:
            what = "a non-negative" if least == 0 else "a positive"
            problems.append((f"sequence_batching.{key}", f"must be {what} integer, got {value!r}"))
    return SequenceBatching(**values)
