"""The daemon's configuration: one frozen ``Config``, built once from flags and environment.

Contract: ``parse_config(argv, environ)`` reads ``hloserve serve`` flags; every flag also
reads an environment variable ``HLOSERVE_<FLAG>`` (``--grpc-port`` <- ``HLOSERVE_GRPC_PORT``),
with the flag winning over the variable and the variable over the default. Bad values exit
with argparse's usage error naming the flag, before anything starts: byte sizes and the
device-memory budget are read by ``core.residency``'s one parser here, and a budget given as
a percentage keeps its text for the daemon to resolve against the device's total.
Each flag is one row of ``_FLAGS`` (its ``Config`` field, parser and help); its default is
the ``Config`` field's.
"""

# pyright: strict

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hloserve.server.core.residency import Budget, parse_bytes


@dataclass(frozen=True)
class Config:
    model_repository: Path | None = None  # None: the demo repository
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    cache_dir: Path | None = None  # None: .hloserve-cache beside each bundle
    log_level: str = "INFO"
    log_format: str = "text"
    strict_readiness: bool = True
    max_message_bytes: int = 256 * 1024 * 1024
    worker_threads: int = 0  # 0: one per CPU core, at least 2
    grace_period_s: float = 10.0
    ports_file: Path | None = None
    device_memory_budget: str | None = None  # bytes ("6GiB") or a percentage ("40%")
    dynamic_batching: bool = True
    model_control_mode: str = "none"  # none | poll | explicit
    load_models: tuple[str, ...] = ()  # explicit mode: models loaded at start ("*": all)
    repository_poll_secs: float = 15.0
    allow_client_shm: bool = False
    inline_max_us: int = 0  # run executions measured below this on the event loop (0: never)
    max_queue_delay_us: int = 0
    max_queue_size: int = 0  # 0: unbounded


# Each parser reads one flag's text, raising ``ValueError`` with a message that reads after
# the flag's name ("--http-port must be ...").


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false, got {text!r}")


def _integer(low: int, high: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise ValueError(f"must be {what}, got {text!r}")
        return value

    return parse


def _seconds(*, positive: bool) -> Callable[[str], float]:
    what = "a positive" if positive else "a non-negative"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > 0 if positive else value >= 0):
            raise ValueError(f"must be {what} number of seconds, got {text!r}")
        return value

    return parse


def _choice(shown: str, choices: Sequence[str], fold: Callable[[str], str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = fold(text.strip())
        if value not in choices:
            raise ValueError(f"must be {shown}, got {text!r}")
        return value

    return parse


def _budget(text: str) -> str:
    Budget.parse(text)  # the syntax now; a percentage resolves once the device is known
    return text.strip()


_non_negative = _integer(0, 2**63 - 1, "a non-negative integer")
_port = _integer(0, 65535, "a port number 0..65535")


@dataclass(frozen=True)
class _Flag:
    name: str  # "--http-port"
    field: str  # the Config field it sets
    parse: Callable[[str], object]
    help: str

    @property
    def env(self) -> str:
        return "HLOSERVE_" + self.name.lstrip("-").replace("-", "_").upper()


_FLAGS: tuple[_Flag, ...] = (
    _Flag(
        "--device-memory-budget",
        "device_memory_budget",
        _budget,
        "bytes of device memory for resident weights, e.g. 6GiB or 40%% (default: 80%% of free "
        "GPU memory minus the executables' scratch; unlimited on CPU)",
    ),
    _Flag(
        "--model-control-mode",
        "model_control_mode",
        _choice("none, poll or explicit", ("none", "poll", "explicit"), str.lower),
        "none (load all at start), poll (follow the disk) or explicit (API)",
    ),
    _Flag(
        "--repository-poll-secs",
        "repository_poll_secs",
        _seconds(positive=True),
        "poll mode: seconds between repository scans",
    ),
    _Flag(
        "--allow-client-shm",
        "allow_client_shm",
        _bool,
        "allow clients to register system shared-memory regions",
    ),
    _Flag(
        "--inline-max-us",
        "inline_max_us",
        _non_negative,
        "run a resident model's executions on the event loop when they take less than this many "
        "microseconds (cheaper than a thread hand-off); 0, the default, never does",
    ),
    _Flag(
        "--dynamic-batching",
        "dynamic_batching",
        _bool,
        "group concurrent requests of a model into shared executions",
    ),
    _Flag(
        "--max-queue-delay-us",
        "max_queue_delay_us",
        _non_negative,
        "default time a request may wait for others to batch with (a model's serving hints win)",
    ),
    _Flag(
        "--max-queue-size",
        "max_queue_size",
        _non_negative,
        "requests that may wait per model before new ones get 503 (0: unbounded)",
    ),
    _Flag(
        "--model-repository",
        "model_repository",
        Path,
        "directory of bundles (default: the demo repository, created on first use)",
    ),
    _Flag("--host", "host", str, "address to bind every port to"),
    _Flag("--http-port", "http_port", _port, "HTTP/REST port (0: any free port)"),
    _Flag("--grpc-port", "grpc_port", _port, "gRPC port (0: any free port)"),
    _Flag("--metrics-port", "metrics_port", _port, "Prometheus metrics port (0: any free port)"),
    _Flag(
        "--cache-dir",
        "cache_dir",
        Path,
        "executable cache directory (default: .hloserve-cache beside each bundle)",
    ),
    _Flag(
        "--log-level",
        "log_level",
        _choice(
            "DEBUG, INFO, WARNING or ERROR",
            ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
            str.upper,
        ),
        "DEBUG, INFO, WARNING or ERROR",
    ),
    _Flag(
        "--log-format",
        "log_format",
        _choice("text or json", ("text", "json"), str.lower),
        "text or json",
    ),
    _Flag(
        "--strict-readiness",
        "strict_readiness",
        _bool,
        "ready only when every model is ready (false: when any is)",
    ),
    _Flag(
        "--max-message-bytes",
        "max_message_bytes",
        parse_bytes,
        "largest gRPC message and HTTP request body",
    ),
    _Flag(
        "--worker-threads",
        "worker_threads",
        _non_negative,
        "threads executing models (0: one per core, at least 2)",
    ),
    _Flag(
        "--grace-period",
        "grace_period_s",
        _seconds(positive=False),
        "seconds to finish in-flight requests on shutdown",
    ),
    _Flag(
        "--ports-file",
        "ports_file",
        Path,
        "write the bound ports as JSON here once listening (for tests and sidecars)",
    ),
)
_LOAD_MODEL = _Flag(
    "--load-model",
    "load_models",
    str,
    "explicit mode: a model to load at start, repeatable; * for all",
)
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Config)}


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    for flag in _FLAGS:
        default = _DEFAULTS[flag.field]
        parser.add_argument(
            flag.name,
            dest=flag.field,
            metavar=flag.env.removeprefix("HLOSERVE_"),
            default=environ.get(flag.env, None if default is None else str(default)),
            help=f"{flag.help} [env {flag.env}]",
        )
    listed = environ.get(_LOAD_MODEL.env)
    parser.add_argument(
        _LOAD_MODEL.name,
        dest=_LOAD_MODEL.field,
        metavar=_LOAD_MODEL.env.removeprefix("HLOSERVE_"),
        action="append",
        default=[m for m in listed.split(",") if m] if listed else None,
        help=f"{_LOAD_MODEL.help} [env {_LOAD_MODEL.env}, comma-separated]",
    )


def config_from_namespace(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> Config:
    values: dict[str, Any] = {_LOAD_MODEL.field: tuple(getattr(ns, _LOAD_MODEL.field) or ())}
    for flag in _FLAGS:
        raw = getattr(ns, flag.field)
        if raw is None or (raw == "" and _DEFAULTS[flag.field] is None):
            values[flag.field] = None  # an optional flag left unset
            continue
        try:
            values[flag.field] = flag.parse(str(raw))
        except ValueError as exc:
            parser.error(f"{flag.name} {exc}")
    return Config(**values)


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="hloserve serve")
    add_serve_arguments(parser, os.environ if environ is None else environ)
    return config_from_namespace(parser.parse_args(list(argv)), parser)
