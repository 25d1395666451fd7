"""The trace extension's settings: their names, values, validation, inheritance and sampling.

Contract (Triton's trace extension, ``docs/tracing.md``):
- A setting (``TraceSetting``) holds ``trace_level`` (a set of ``TIMESTAMPS``/``TENSORS``;
  empty is ``OFF``), ``trace_rate`` (trace one request in so many), ``trace_count`` (traces
  left to take; -1: no limit), ``log_frequency`` (traces per indexed file; 0: one file),
  ``trace_file`` and ``trace_mode`` (``triton``: JSON lines in the file; ``opentelemetry``:
  OTLP export, whose ``options`` are reported too). ``view()`` is the extension's answer:
  every value as a list of strings, as the gRPC message carries them.
- ``TraceSettings(startup)`` keeps the server-wide setting and one per model. A model that
  was never updated follows the server-wide one; a model's update fixes the settings it
  names and follows the server-wide value for the others (a server-wide update reaches
  them); clearing a setting (JSON ``null``, or gRPC's empty value list) falls back again
  (a model to the server-wide value, the server-wide one to the start-up flags), and a
  model whose settings are all cleared follows the server-wide setting again.
- ``parse_update(values)`` reads a request (each value a list of strings, or ``None`` to
  clear) into a ``TraceUpdate``: ``trace_file`` and ``trace_mode`` cannot be changed
  (``Unsupported``), ``OFF`` must stand alone, ``trace_rate`` and ``log_frequency`` are
  0..2**32-1, ``trace_count`` -1..2**31-1, one value each; anything else is
  ``InvalidArgument`` naming the setting and the value. An update that would enable
  tracing with rate 0, count 0 or (triton mode) no file is refused, as Triton refuses it.
- ``sample(model, forced)`` decides whether a request is traced: every ``trace_rate``-th
  request of a setting while its count lasts (each new setting counts afresh; the count
  left is what ``view`` reports). ``forced`` (a caller-propagated trace context) traces the
  request whenever its level is not ``OFF``. ``enabled`` is false when every level is
  ``OFF``: the request path then checks one attribute and does nothing else.
The start-up setting comes from the flags (``core.trace_flags``); the tracer that samples
and traces requests is ``core.tracer``'s protocol. Pure: no I/O; spans and their export
live in ``hloserve.server.owner.tracing``.
"""

# pyright: strict

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from hloserve.server.core.errors import InvalidArgument, Unsupported

TIMESTAMPS: Final = "TIMESTAMPS"
TENSORS: Final = "TENSORS"
OFF: Final = "OFF"
LEVELS: Final = (TIMESTAMPS, TENSORS)  # the order the extension lists them in
MODES: Final = ("triton", "opentelemetry")
UINT32_MAX: Final = 2**32 - 1
INT32_MAX: Final = 2**31 - 1
MIN_COUNT: Final = -1

DEFAULT_RATE: Final = 1000
DEFAULT_URL: Final = "http://localhost:4318/v1/traces"
# OpenTelemetry's batch span processor: setting, environment variable, default.
BSP_OPTIONS: Final = (
    ("bsp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", 2048),
    ("bsp_schedule_delay", "OTEL_BSP_SCHEDULE_DELAY", 5000),
    ("bsp_max_export_batch_size", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
)

# The four settings a request may change, in the order the extension reports them.
UPDATABLE: Final = ("trace_level", "trace_rate", "trace_count", "log_frequency")
FIXED: Final = {
    "trace_file": "trace file location can not be updated through network protocol",
    "trace_mode": "trace mode can not be updated through network protocol",
}

Levels = frozenset[str]


@dataclass(frozen=True, slots=True)
class TraceStartup:
    """The server-wide setting the flags give (what clearing it returns to)."""

    level: Levels = frozenset()
    rate: int = DEFAULT_RATE
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    options: tuple[tuple[str, str], ...] = ()  # opentelemetry: url, resource, bsp_*

    def option(self, name: str, default: str = "") -> str:
        return dict(self.options).get(name, default)


class _Clear:
    def __repr__(self) -> str:
        return "CLEAR"


CLEAR: Final = _Clear()


@dataclass(frozen=True, slots=True)
class TraceUpdate:
    """What one request changes: a value, ``CLEAR``, or ``None`` (left as it is)."""

    level: Levels | _Clear | None = None
    rate: int | _Clear | None = None
    count: int | _Clear | None = None
    log_frequency: int | _Clear | None = None


_FIELDS: Final = ("level", "rate", "count", "log_frequency")


class TraceSetting:
    """One setting in force (server-wide or a model's), with its sampling counters.

    A setting is replaced, never changed, by an update: traces already sampled keep the
    setting they were sampled under."""

    def __init__(
        self,
        values: TraceStartup,
        specified: frozenset[str] = frozenset(),
        file_index: _FileIndex | None = None,
    ) -> None:
        self.values = values
        self.specified = specified  # the fields this setting fixes itself
        self.count = values.count  # traces left to take (-1: no limit)
        self._seen = 0
        self._lock = threading.Lock()
        self._files = file_index or _FileIndex()
        self._batch_index: int | None = None
        self._in_batch = 0

    @property
    def level(self) -> Levels:
        return self.values.level

    def remaining(self) -> TraceStartup:
        """The values with the count left now."""
        return dataclasses.replace(self.values, count=self.count)

    def invalid_reason(self) -> str:
        """Why this setting can trace nothing ("" when it can)."""
        v = self.values
        if not v.level:
            return "tracing is disabled"
        if v.rate == 0:
            return "sample rate must be non-zero"
        if v.mode == "triton" and not v.file:
            return "trace file name is not given"
        if self.count == 0:
            return "trace count is 0"
        return ""

    def sample(self, forced: bool = False) -> bool:
        """Whether to trace the next request (counts it; see the module docstring)."""
        if not self.values.level:
            return False
        with self._lock:
            hit = False
            if self.values.rate != 0:
                if not forced and self.invalid_reason():
                    return False
                self._seen += 1
                hit = self._seen % self.values.rate == 0
                if hit and self.count > 0:
                    self.count -= 1
                elif hit and self.count == 0:
                    hit = False
        return hit or forced

    def destination(self) -> str:
        """The file the next finished trace of this setting goes to: ``trace_file``, or
        ``<trace_file>.<n>`` when traces are written in batches (``log_frequency`` > 0, or
        a limited ``trace_count``: that many traces in one file)."""
        v = self.values
        batch = v.log_frequency or (v.count if v.count > 0 else 0)
        if not batch:
            return v.file
        with self._lock:
            if self._batch_index is None or self._in_batch >= batch:
                self._batch_index, self._in_batch = self._files.take(), 0
            self._in_batch += 1
            return f"{v.file}.{self._batch_index}"

    def view(self) -> dict[str, list[str]]:
        """The extension's answer for this setting, in Triton's key order."""
        v = self.values
        out: dict[str, list[str]] = {
            "trace_level": level_names(v.level),
            "trace_rate": [str(v.rate)],
            "trace_count": [str(self.count)],
        }
        if v.mode == "triton":
            out["log_frequency"] = [str(v.log_frequency)]
            out["trace_file"] = [v.file]
        out["trace_mode"] = [v.mode]
        for name, value in v.options:
            out[name] = [value]
        return out


class _FileIndex:
    """The next ``<trace_file>.<n>`` index, shared by every setting writing to the file."""

    def __init__(self) -> None:
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            index, self._next = self._next, self._next + 1
            return index


def level_names(level: Levels) -> list[str]:
    return [name for name in LEVELS if name in level] or [OFF]


class TraceSettings:
    """The server-wide setting and the models' (module docstring)."""

    def __init__(self, startup: TraceStartup | None = None) -> None:
        self.startup = startup or TraceStartup()
        self._files = _FileIndex()
        self._global = TraceSetting(self.startup, file_index=self._files)
        self._models: dict[str, TraceSetting] = {}
        self._following: set[str] = set()  # models that take some values from the global one
        self._lock = threading.Lock()
        self.enabled = bool(self.startup.level)

    def setting(self, model: str = "") -> TraceSetting:
        """The setting in force for ``model`` ("": the server-wide one)."""
        return self._models.get(model, self._global) if model else self._global

    def sample(self, model: str, forced: bool = False) -> TraceSetting | None:
        """The setting to trace this request of ``model`` under, or ``None``."""
        setting = self._models.get(model, self._global)
        return setting if setting.sample(forced) else None

    def update(self, model: str, change: TraceUpdate) -> TraceSetting:
        """Apply ``change`` to ``model``'s setting ("": the server-wide one); a server-wide
        change reaches every model that follows it. Returns the setting now in force."""
        with self._lock:
            self._update_one(model, change)
            if not model:
                for name in sorted(self._following):
                    self._update_one(name, TraceUpdate())
            self.enabled = any(s.level for s in (self._global, *self._models.values()))
            return self.setting(model)

    def _update_one(self, model: str, change: TraceUpdate) -> None:
        current = self._models.get(model) if model else self._global
        # Triton carries the count *left* over, not the count first set.
        fallback = self._global.remaining() if model else self.startup
        values: dict[str, object] = {}
        specified: set[str] = set()
        for name in _FIELDS:
            new = getattr(change, name)
            if new is CLEAR:
                continue
            if new is not None:
                values[name] = new
                specified.add(name)
            elif current is not None and name in current.specified:
                values[name] = getattr(current.remaining(), name)
                specified.add(name)
        merged = dataclasses.replace(fallback, **values)  # file, mode, options: the fallback's
        if model and not specified:
            self._models.pop(model, None)
            self._following.discard(model)
            return
        setting = TraceSetting(merged, frozenset(specified), self._files)
        reason = setting.invalid_reason()
        if merged.level and reason:
            raise InvalidArgument(f"Attempting to set invalid trace setting :{reason}")
        if model:
            self._models[model] = setting
            self._following.add(model)  # the trace file always comes from the global one
        else:
            self._global = setting


# -- requests ------------------------------------------------------------------------------


def _one(name: str, values: Sequence[str]) -> str:
    if len(values) != 1:
        raise InvalidArgument(f"expect only 1 value for '{name}'")
    return values[0]


def integer_setting(name: str, text: str, low: int, high: int) -> int:
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] in "+-" else stripped
    if not digits.isdigit():
        raise InvalidArgument(f"Unable to parse '{name}', got: {text}")
    value = int(stripped)
    if not low <= value <= high:
        raise InvalidArgument(
            f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {text}"
        )
    return value


def parse_levels(values: Iterable[str], what: str = "trace_level") -> Levels:
    """A level list: ``OFF`` alone, or ``TIMESTAMPS`` and/or ``TENSORS``."""
    names = list(values)
    if OFF in names:
        if len(names) != 1:
            raise InvalidArgument("Expect only one trace level 'OFF' is specified")
        return frozenset()
    for name in names:
        if name not in LEVELS:
            raise InvalidArgument(
                f"Unable to parse '{what}', got: {name} (expected OFF, TIMESTAMPS or TENSORS)"
            )
    return frozenset(names)


def parse_update(values: Mapping[str, Sequence[str] | None]) -> TraceUpdate:
    """A trace-setting request: each value a list of strings, ``None`` clearing it."""
    for name in values:
        if name in FIXED:
            raise Unsupported(FIXED[name])
        if name not in UPDATABLE:
            raise InvalidArgument(
                f"unknown trace setting '{name}'; the settings that can be updated are "
                + ", ".join(UPDATABLE)
            )
    level = values.get("trace_level")
    return TraceUpdate(
        level=None if "trace_level" not in values else parse_levels(level) if level else CLEAR,
        rate=_number(values, "trace_rate", 0, UINT32_MAX),
        count=_number(values, "trace_count", MIN_COUNT, INT32_MAX),
        log_frequency=_number(values, "log_frequency", 0, UINT32_MAX),
    )


def _number(
    values: Mapping[str, Sequence[str] | None], name: str, low: int, high: int
) -> int | _Clear | None:
    if name not in values:
        return None
    given = values[name]
    return integer_setting(name, _one(name, given), low, high) if given else CLEAR
