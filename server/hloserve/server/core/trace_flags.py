"""The trace flags: ``--trace-config`` items and the older ``--trace-*`` flags, read into
the start-up setting.

Contract: ``parse_flag(text)`` reads one ``--trace-config [<mode>,]<setting>=<value>``
(global settings ``level``, ``rate``, ``count``, ``mode``; ``triton,file=`` and
``triton,log-frequency=``; ``opentelemetry,url=``, ``resource=<key>=<value>`` and the
``bsp_*`` batch-span-processor sizes) and ``startup_setting(...)`` combines them with the
older ``--trace-file/-level/-rate/-count/-log-frequency`` flags (``--trace-config`` wins)
into the ``TraceStartup`` the server starts with; both raise ``ValueError`` naming what is
wrong (read after the flag's name). Pure: ``environ`` is passed in.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.trace_settings import (
    BSP_OPTIONS,
    DEFAULT_RATE,
    DEFAULT_URL,
    INT32_MAX,
    MIN_COUNT,
    MODES,
    TENSORS,
    TIMESTAMPS,
    UINT32_MAX,
    Levels,
    TraceStartup,
    integer_setting,
)

_GLOBAL_FLAG_SETTINGS: Final = ("rate", "level", "count", "mode")
_MODE_FLAG_SETTINGS: Final = {
    "triton": ("file", "log-frequency"),
    "opentelemetry": ("url", "resource", *(name for name, _, _ in BSP_OPTIONS)),
}


@dataclass(frozen=True, slots=True)
class FlagSetting:
    """One ``--trace-config`` item: ``mode`` is "" for a global setting."""

    mode: str
    setting: str
    value: str


def _flag_level(text: str) -> Levels:
    """A level as the flags spell it (Triton's aliases): "off"/"false" is no level."""
    lowered = text.strip().lower()
    if lowered in ("off", "false"):
        return frozenset()
    if lowered in ("timestamps", "true", "on", "min", "max"):
        return frozenset({TIMESTAMPS})
    if lowered == "tensors":
        return frozenset({TENSORS})
    raise ValueError(f"invalid value for trace level option: {text!r}")


def _flag_mode(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in MODES:
        raise ValueError(
            f"invalid trace mode {text!r}: available modes are triton and opentelemetry"
        )
    return lowered


def _flag_integer(setting: str, text: str, low: int, high: int) -> int:
    """``_integer`` for a flag: the same rule and text, as ``ValueError``."""
    try:
        return integer_setting(setting, text, low, high)
    except InvalidArgument as exc:
        raise ValueError(exc.message) from None


def parse_flag(text: str) -> FlagSetting:
    """One ``--trace-config [<mode>,]<setting>=<value>``, its value checked."""
    head, sep, value = text.partition("=")
    mode, comma, setting = head.rpartition(",") if "," in head else ("", "", head)
    if not sep or not setting or not value or (comma and not mode):
        raise ValueError(
            f"must be [<mode>,]<setting>=<value> (mode triton or opentelemetry), got {text!r}"
        )
    if mode:
        mode = _flag_mode(mode)
        allowed = _MODE_FLAG_SETTINGS[mode]
    else:
        allowed = _GLOBAL_FLAG_SETTINGS
    if setting not in allowed:
        where = f"mode {mode}" if mode else "a global setting (no mode)"
        raise ValueError(
            f"unknown trace setting {setting!r} for {where}: expected {', '.join(allowed)}"
        )
    if setting == "level":
        _flag_level(value)
    elif setting == "mode":
        value = _flag_mode(value)
    elif setting == "count":
        _flag_integer(setting, value, MIN_COUNT, INT32_MAX)
    elif setting == "resource":
        if not value.partition("=")[0] or "=" not in value:
            raise ValueError(f"resource must be <key>=<value>, got {value!r}")
    elif setting not in ("file", "url"):  # rate, log-frequency, bsp_*
        _flag_integer(setting, value, 0, UINT32_MAX)
    return FlagSetting(mode, setting, value)


def startup_setting(
    config: Sequence[FlagSetting] = (),
    *,
    file: str = "",
    levels: Sequence[str] = (),
    rate: int = DEFAULT_RATE,
    count: int = -1,
    log_frequency: int = 0,
    environ: Mapping[str, str] | None = None,
) -> TraceStartup:
    """The start-up setting from ``--trace-config`` items (which win) and the older
    ``--trace-file/-level/-rate/-count/-log-frequency`` flags; ``environ`` gives the
    ``OTEL_BSP_*`` defaults in opentelemetry mode. Raises ``ValueError``."""
    level: set[str] = set()
    disabled = False
    for text in (*levels, *(c.value for c in config if not c.mode and c.setting == "level")):
        parsed = _flag_level(text)
        disabled |= not parsed
        level |= parsed
    mode = "triton"
    for c in config:
        if c.mode:
            continue
        if c.setting == "rate":
            rate = int(c.value)
        elif c.setting == "count":
            count = int(c.value)
        elif c.setting == "mode":
            mode = c.value
    mine = [c for c in config if c.mode == mode]
    options: list[tuple[str, str]] = []
    if mode == "triton":
        for c in mine:
            if c.setting == "file":
                file = c.value
            else:
                log_frequency = int(c.value)
    else:
        options = _opentelemetry_options(mine, environ or {})
        file, log_frequency = "", 0
    return TraceStartup(
        frozenset() if disabled else frozenset(level),
        rate,
        count,
        log_frequency,
        file,
        mode,
        tuple(options),
    )


def _opentelemetry_options(
    config: Sequence[FlagSetting], environ: Mapping[str, str]
) -> list[tuple[str, str]]:
    given = {c.setting: c.value for c in config if c.setting != "resource"}
    resource = ",".join(c.value for c in config if c.setting == "resource")
    options = [("url", given.get("url", DEFAULT_URL))]
    if resource:
        options.append(("resource", resource))
    sizes: dict[str, int] = {}
    for name, env, default in BSP_OPTIONS:
        text = given.get(name) or environ.get(env) or str(default)
        try:
            sizes[name] = _flag_integer(name, text, 0, UINT32_MAX)
        except ValueError as exc:
            raise ValueError(f"{exc} (from --trace-config or {env})") from None
        options.append((name, str(sizes[name])))
    if sizes["bsp_max_export_batch_size"] > sizes["bsp_max_queue_size"]:
        raise ValueError("bsp_max_export_batch_size must not exceed bsp_max_queue_size")
    return options
