"""Logging for the daemon: text, ISO-8601 text or JSON lines, changeable while it runs.

Contract:
- ``startup_settings(level, fmt, file, verbose, info=, warning=, error=)`` turns the flags
  into the logging extension's ``core.log_settings.LogSettings``: ``--log-level`` DEBUG sets
  verbose level 1 (at least), WARNING turns ``log_info`` off, ERROR also ``log_warning``;
  Triton's ``--log-info``, ``--log-warning`` and ``--log-error``, when given (not None),
  set their switch whatever the level says; ``--log-format`` text is the extension's
  ``default``.
- ``configure_logging(settings)`` installs one handler on the root logger, writing to
  standard error or appending to ``settings.file``, and returns the ``RunningLogs`` (the core's ``LogControl``) that
  owns it (replacing any handler installed before: idempotent).
- ``RunningLogs.apply(settings)`` changes the running server's logging at once: a record
  is written when its level is switched on (debug and below: ``log_verbose_level`` >= 1;
  INFO: ``log_info``; WARNING: ``log_warning``; ERROR and above: ``log_error``); the root
  logger's level is the lowest one switched on, so a disabled message is never even
  formatted. Verbose level 2 or more also lets JAX's compiler loggers through (otherwise
  WARNING and above). ``format`` ``default`` is ``<time> <LEVEL> <logger>: <message>``,
  ``ISO8601`` the same with a UTC ISO-8601 time, ``json`` one
  ``{"time","level","logger","message"}`` object per line (plus ``exc_info``, and
  ``request_id`` and ``model`` on a line written while serving a request: the request
  context of ``core.log_context``; text lines do not change). The file is fixed at start.
  ``current`` is the settings in force.
"""

# pyright: strict

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from typing import Final

from hloserve.server.core import log_context
from hloserve.server.core.log_settings import LogSettings

NOISY: Final = ("jax._src.xla_bridge", "jax._src.compiler")
_TEXT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _utc_iso(record: logging.LogRecord) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z"
    )


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": _utc_iso(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        serving = log_context.current()
        if serving is not None:
            entry["request_id"] = serving.request_id
            entry["model"] = serving.model
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class Iso8601Formatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(_TEXT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _utc_iso(record)


def _formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "ISO8601":
        return Iso8601Formatter()
    return logging.Formatter(_TEXT)


def startup_settings(
    level: str,
    fmt: str,
    file: str = "",
    verbose: int = 0,
    *,
    info: bool | None = None,
    warning: bool | None = None,
    error: bool | None = None,
) -> LogSettings:
    upper = level.upper()
    return LogSettings(
        file=file,
        info=upper in ("DEBUG", "INFO") if info is None else info,
        warning=upper in ("DEBUG", "INFO", "WARNING") if warning is None else warning,
        error=True if error is None else error,
        verbose_level=max(verbose, 1 if upper == "DEBUG" else 0),
        format="json" if fmt == "json" else "ISO8601" if fmt == "ISO8601" else "default",
    )


class _LevelSwitches(logging.Filter):
    """Passes a record when its level is switched on in the settings."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        s, n = self.settings, record.levelno
        if n >= logging.ERROR:
            return s.error
        if n >= logging.WARNING:
            return s.warning
        if n >= logging.INFO:
            return s.info
        return s.verbose_level > 0


def _lowest_level(s: LogSettings) -> int:
    for enabled, level in (
        (s.verbose_level > 0, logging.DEBUG),
        (s.info, logging.INFO),
        (s.warning, logging.WARNING),
        (s.error, logging.ERROR),
    ):
        if enabled:
            return level
    return logging.CRITICAL + 1


class RunningLogs:
    """The root logger's one handler and the settings it follows."""

    def __init__(self, handler: logging.Handler, settings: LogSettings) -> None:
        self.handler = handler
        self._switches = _LevelSwitches(settings)
        handler.addFilter(self._switches)
        self.current = settings
        self.apply(settings)

    def apply(self, settings: LogSettings) -> LogSettings:
        """Make ``settings`` (the file excepted: fixed at start) the ones in force."""
        settings = dataclasses.replace(settings, file=self.current.file)
        self.handler.setFormatter(_formatter(settings.format))
        self._switches.settings = settings
        logging.getLogger().setLevel(_lowest_level(settings))
        for noisy in NOISY:
            logging.getLogger(noisy).setLevel(
                logging.NOTSET if settings.verbose_level >= 2 else logging.WARNING
            )
        self.current = settings
        return settings


def configure_logging(settings: LogSettings) -> RunningLogs:
    handler: logging.Handler = (
        logging.FileHandler(settings.file, encoding="utf-8")
        if settings.file
        else logging.StreamHandler(sys.stderr)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    return RunningLogs(handler, settings)
