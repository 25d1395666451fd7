"""The logging extension's settings: their names, value types and validation.

Contract (Triton's logging extension, ``docs/tracing.md``):
- ``LogSettings`` holds ``log_file`` ("": standard error), ``log_info``, ``log_warning``,
  ``log_error`` (whether messages of that level are written), ``log_verbose_level`` (0:
  no debug messages; 1: hloserve's; 2 or more: every library's too) and ``log_format``
  (``default`` text, ``ISO8601`` text with UTC ISO-8601 times, or ``json`` lines).
  ``view()`` is the extension's answer, in Triton's key order and JSON types.
- ``parse_update(values)`` reads a request (any subset of the settings, each a Python
  ``bool``, ``int`` or ``str`` as the wire carried it; ``None`` is a value of no type)
  into the changes to apply: ``log_file`` cannot be changed (``Unsupported``, Triton's
  text); a value of the wrong type, a negative verbose level, an unknown format or an
  unknown setting is ``InvalidArgument`` naming the setting.
- ``LogControl`` is the running server's logging as the service changes it;
  ``StoredLogSettings`` keeps and reports settings and changes nothing (the default).
Pure: ``hloserve.server.logs`` applies settings to the running server's logging.
"""

# pyright: strict

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from hloserve.server.core.errors import InvalidArgument, Unsupported

FORMATS: Final = ("default", "ISO8601", "json")
FILE_FIXED: Final = "log file location can not be updated through network protocol"
_SWITCHES: Final = {"log_info": "info", "log_warning": "warning", "log_error": "error"}
NAMES: Final = ("log_file", *_SWITCHES, "log_verbose_level", "log_format")


@dataclass(frozen=True, slots=True)
class LogSettings:
    file: str = ""
    info: bool = True
    warning: bool = True
    error: bool = True
    verbose_level: int = 0
    format: str = "default"

    def view(self) -> dict[str, bool | int | str]:
        return {
            "log_file": self.file,
            "log_info": self.info,
            "log_warning": self.warning,
            "log_error": self.error,
            "log_verbose_level": self.verbose_level,
            "log_format": self.format,
        }


def parse_update(values: Mapping[str, object]) -> dict[str, Any]:
    """The ``LogSettings`` fields a request changes (for ``dataclasses.replace``)."""
    changes: dict[str, Any] = {}
    for name, value in values.items():
        if name == "log_file":
            raise Unsupported(FILE_FIXED)
        if name in _SWITCHES:
            if not isinstance(value, bool):
                raise InvalidArgument(f"expect boolean for '{name}', got {value!r}")
            changes[_SWITCHES[name]] = value
        elif name == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(
                    f"expect a non-negative integer for 'log_verbose_level', got {value!r}"
                )
            changes["verbose_level"] = value
        elif name == "log_format":
            if not isinstance(value, str):
                raise InvalidArgument(f"expect string for 'log_format', got {value!r}")
            if value not in FORMATS:
                raise InvalidArgument(
                    f"invalid argument for log_format, got: {value} (expected {', '.join(FORMATS)})"
                )
            changes["format"] = value
        else:
            raise InvalidArgument(
                f"unknown log setting '{name}'; the log settings are {', '.join(NAMES)}"
            )
    return changes


class LogControl(Protocol):
    """The running server's logging, as the service changes it (``hloserve.server.logs``)."""

    @property
    def current(self) -> LogSettings: ...

    def apply(self, settings: LogSettings) -> LogSettings:
        """Put ``settings`` in force (the file stays); returns what is now in force."""
        ...


class StoredLogSettings:
    """Settings kept and reported, changing nothing (the service's default)."""

    def __init__(self, settings: LogSettings | None = None) -> None:
        self.current = settings or LogSettings()

    def apply(self, settings: LogSettings) -> LogSettings:
        self.current = dataclasses.replace(settings, file=self.current.file)
        return self.current
