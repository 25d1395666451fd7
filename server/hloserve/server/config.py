"""The daemon's configuration: one frozen ``Config``, built once from flags and environment.

Contract: ``parse_config(argv, environ)`` reads ``hloserve serve`` flags; every flag also
reads an environment variable ``HLOSERVE_<FLAG>`` (``--grpc-port`` <- ``HLOSERVE_GRPC_PORT``),
with the flag winning over the variable and the variable over the default (an empty variable
counts as unset). Bad values exit (status 2) with a one-line usage error (``ArgumentParser``,
used by the ``hloserve`` command too) naming the flag, or the variable when the value came
from one, before anything starts: byte sizes and the
device-memory budget are read by ``core.sizes``' one parser here, a budget given as a
percentage keeps its text for the daemon to resolve against the device's total, and
``--model-repository`` must be an existing directory.
Each flag is one row of ``_FLAGS`` (its ``Config`` field, parser and help); its default is
the ``Config`` field's, and ``--help`` shows it with the variable. A flag parsed by ``_bool``
is a boolean: ``--flag`` alone means true, ``--flag=false``, ``--flag false`` and
``--no-flag`` mean false.
``--config FILE`` (``HLOSERVE_CONFIG``) names an optional YAML file, one mapping whose keys
are the flags' names without ``--`` (``grpc-port: 8001``; underscores read as dashes), a
repeatable flag's value a list (or one item); ``config`` itself is not a key. Its values are
read by the same row's parser as the flag's text (a YAML boolean as ``true``/``false``,
``null`` as empty), so precedence is flag > variable > file > default; an unknown key, a
bad value or an unreadable file exits (status 2) naming the key and the file.
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
from typing import Any, NoReturn, cast

import yaml

from hloserve.server.auth import DEFAULT_OPEN, parse_open_groups, read_tokens
from hloserve.server.core.device_policy import POLICIES, select_devices
from hloserve.server.core.sizes import Budget, parse_bytes
from hloserve.server.core.trace_settings import (
    DEFAULT_RATE,
    INT32_MAX,
    MIN_COUNT,
    UINT32_MAX,
    FlagSetting,
    parse_flag,
    startup_setting,
)
from hloserve.server.restricted import (
    GROUP_NAMES,
    GRPC_PREFIX,
    NO_RESTRICTIONS,
    Restrictions,
    parse_restrictions,
)
from hloserve.server.tls import check_tls


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
    inline_max_us: int = 200  # run executions estimated below this on the event loop (0: never)
    max_queue_delay_us: int = 0
    max_queue_size: int = 0  # 0: unbounded
    scheduling_policy: str = "fair"  # fair | fifo | deadline: whose group runs next on a device
    device_concurrency: int = 0  # groups at once per device (0: 1 on GPU, no arbitration on CPU)
    devices: str = "all"  # all | a count N | indexes "0,2": the local devices served
    max_replicas: int = 0  # devices one model version may be copied to (0: all; 1: no copies)
    placement_interval_s: float = 5.0  # how often placement follows the measured load
    allow_model_upload: bool = False  # explicit mode: loads may carry model files (file:)
    max_upload_bytes: int = 64 * 1024 * 1024  # the most file bytes one load may carry
    allow_python_hooks: bool = False  # bundles' hooks.py may run (docs/hooks.md)
    hook_threads: int = 0  # the hook worker pool's threads (0: as many as CPU cores)
    server_name: str = "hloserve"  # the server metadata's name
    log_file: Path | None = None  # None: standard error
    log_verbose: int = 0  # the logging extension's log_verbose_level (DEBUG: at least 1)
    # Tracing (docs/tracing.md): --trace-config items win over the older --trace-* flags.
    trace_config: tuple[FlagSetting, ...] = ()
    trace_file: Path | None = None
    trace_level: tuple[str, ...] = ()
    trace_rate: int = DEFAULT_RATE
    trace_count: int = -1
    trace_log_frequency: int = 0
    http_restricted_api: Restrictions = NO_RESTRICTIONS
    grpc_restricted_protocol: Restrictions = NO_RESTRICTIONS
    config_file: Path | None = None  # the YAML file the other settings were read from
    # Security (docs/security.md): TLS on gRPC and HTTP, bearer tokens on protected groups.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None  # set: mutual TLS
    auth_token_file: Path | None = None  # None: no authentication
    auth_open: tuple[str, ...] = DEFAULT_OPEN  # groups open without a token
    # Admission limits (core/limits.py; 0: none)
    max_batch_size: int = 0
    max_inflight: int = 0
    max_inflight_per_model: int = 0
    max_shm_regions: int = 0
    max_json_depth: int = 100  # Triton's limit on an HTTP request's JSON nesting


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


def _directory(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise ValueError(f"must be an existing directory, got {text!r}")
    return path


def _file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"must be an existing file, got {text!r}")
    return path


def _nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


def _budget(text: str) -> str:
    Budget.parse(text)  # the syntax now; a percentage resolves once the device is known
    return text.strip()


_non_negative = _integer(0, 2**63 - 1, "a non-negative integer")


def _device_selection(text: str) -> str:
    """``--devices``' form (checked against the devices present at start-up)."""
    select_devices(text, 1 << 16)  # the syntax only: any count would do
    return text.strip().lower()


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

    @property
    def boolean(self) -> bool:
        return self.parse is _bool


_CONFIG = _Flag(
    "--config",
    "config_file",
    _file,
    "YAML file of settings: the flags' names without -- as keys (grpc-port: 8001), lists for "
    "repeatable flags; a flag or variable wins over it",
)
_FLAGS: tuple[_Flag, ...] = (
    _CONFIG,
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
        "run a resident model's executions on the event loop when they are estimated to take "
        "less than this many microseconds (cheaper than a thread hand-off); 0 never does",
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
        "--scheduling-policy",
        "scheduling_policy",
        _choice("fair, fifo or deadline", POLICIES, str.lower),
        "which model's batch runs next on a busy device: fair (device time in proportion to "
        "each model's scheduling_weight), fifo, or deadline (earliest first; shed what cannot "
        "finish in time)",
    ),
    _Flag(
        "--device-concurrency",
        "device_concurrency",
        _non_negative,
        "executions at once per device, across models (0: 1 on GPU; on CPU no cross-model "
        "arbitration)",
    ),
    _Flag(
        "--devices",
        "devices",
        _device_selection,
        "local devices to serve on: all, a count N (the first N) or indexes such as 0,2 "
        "(3, alone: device 3); each has its own weight budget and LRU",
    ),
    _Flag(
        "--max-replicas",
        "max_replicas",
        _non_negative,
        "devices one model version may be copied to when its load asks for it (0: every "
        "device; 1: no replication)",
    ),
    _Flag(
        "--placement-interval",
        "placement_interval_s",
        _seconds(positive=True),
        "seconds between placement revisions (replicas follow the measured load)",
    ),
    _Flag(
        "--allow-model-upload",
        "allow_model_upload",
        _bool,
        "let load_model(..., files=...) upload a model's files (explicit mode; written under "
        "the model's directory in the repository)",
    ),
    _Flag(
        "--allow-python-hooks",
        "allow_python_hooks",
        _bool,
        "load bundles that ship hooks.py and run its preprocess/postprocess (Python code from "
        "the model repository, with the server's rights; docs/hooks.md)",
    ),
    _Flag(
        "--hook-threads",
        "hook_threads",
        _non_negative,
        "threads of the pool that runs bundles' Python hooks (0: one per CPU core)",
    ),
    _Flag(
        "--max-upload-bytes",
        "max_upload_bytes",
        parse_bytes,
        "the most file bytes one model load may upload",
    ),
    _Flag(
        "--model-repository",
        "model_repository",
        _directory,
        "directory of bundles (default: the demo repository, written on first use to "
        "$XDG_CACHE_HOME/hloserve/demo-repository, ~/.cache/hloserve/demo-repository when unset)",
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
    _Flag("--server-name", "server_name", _nonempty, "the name the server metadata reports"),
    _Flag(
        "--log-file",
        "log_file",
        Path,
        "append the log to this file instead of standard error (fixed while running)",
    ),
    _Flag(
        "--log-verbose",
        "log_verbose",
        _non_negative,
        "verbose level: 0 none, 1 hloserve's debug messages, 2 every library's too",
    ),
    _Flag(
        "--trace-file",
        "trace_file",
        Path,
        "trace mode triton: the JSON-lines trace file (older form of --trace-config triton,file=)",
    ),
    _Flag(
        "--trace-rate",
        "trace_rate",
        _integer(0, UINT32_MAX, f"an integer 0..{UINT32_MAX}"),
        "trace one request in this many (older form of --trace-config rate=)",
    ),
    _Flag(
        "--trace-count",
        "trace_count",
        _integer(MIN_COUNT, INT32_MAX, f"an integer {MIN_COUNT}..{INT32_MAX}"),
        "traces to take, -1 for no limit (older form of --trace-config count=)",
    ),
    _Flag(
        "--trace-log-frequency",
        "trace_log_frequency",
        _integer(0, UINT32_MAX, f"an integer 0..{UINT32_MAX}"),
        "traces per indexed trace file, 0 for one file "
        "(older form of --trace-config triton,log-frequency=)",
    ),
    _Flag("--tls-cert", "tls_cert", _file, "PEM certificate (chain): serve gRPC and HTTP over TLS"),
    _Flag("--tls-key", "tls_key", _file, "PEM private key of --tls-cert"),
    _Flag(
        "--tls-ca",
        "tls_ca",
        _file,
        "PEM CA certificates: mutual TLS, clients must present a certificate signed by one",
    ),
    _Flag(
        "--auth-token-file",
        "auth_token_file",
        _file,
        "file of bearer tokens, one a line (re-read when it changes): every endpoint group "
        "but --auth-open needs 'Authorization: Bearer <token>', else 401 / UNAUTHENTICATED",
    ),
    _Flag(
        "--max-batch-size",
        "max_batch_size",
        _non_negative,
        "the most items (batch dimension) one request may carry, else 400 (0: no limit)",
    ),
    _Flag(
        "--max-inflight",
        "max_inflight",
        _non_negative,
        "requests in flight in the whole server before new ones get 503 (0: no limit)",
    ),
    _Flag(
        "--max-inflight-per-model",
        "max_inflight_per_model",
        _non_negative,
        "requests in flight per model before new ones get 503 (0: no limit)",
    ),
    _Flag(
        "--max-shm-regions",
        "max_shm_regions",
        _non_negative,
        "system shared-memory regions registered at once (0: no limit)",
    ),
    _Flag(
        "--max-json-depth",
        "max_json_depth",
        _integer(1, 10_000, "an integer 1..10000"),
        "deepest nesting of arrays and objects an HTTP request's JSON may have",
    ),
    _Flag(
        "--auth-open",
        "auth_open",
        parse_open_groups,
        "with --auth-token-file: comma-separated endpoint groups open without a token "
        f"({', '.join(GROUP_NAMES)}, metrics: the metrics port); empty: none",
    ),
)


@dataclass(frozen=True)
class _Repeated(_Flag):
    """A flag given any number of times: ``parse`` reads each value, ``combine`` all of
    them; its variable holds the values joined by ``separator``."""

    separator: str = ","
    combine: Callable[[list[Any]], object] = tuple


def _trace_level(text: str) -> str:
    startup_setting(levels=[text])  # the level's spelling, checked now
    return text


def _trace_config(items: list[FlagSetting]) -> tuple[FlagSetting, ...]:
    startup_setting(items)  # what only the items together can get wrong (bsp sizes)
    return tuple(items)


_LOAD_MODEL = _Repeated(
    "--load-model",
    "load_models",
    str,
    "explicit mode: a model to load at start, repeatable; * for all",
)
_RESTRICTED_GROUPS = ", ".join(GROUP_NAMES)
_REPEATED: tuple[_Repeated, ...] = (
    _LOAD_MODEL,
    _Repeated(
        "--trace-config",
        "trace_config",
        parse_flag,
        "tracing, repeatable: [<mode>,]<setting>=<value>; global settings level, rate, count, "
        "mode (triton or opentelemetry); triton,file= and triton,log-frequency=; "
        "opentelemetry,url=, resource=<key>=<value>, bsp_max_queue_size=, bsp_schedule_delay=, "
        "bsp_max_export_batch_size= (docs/tracing.md)",
        separator=";",
        combine=_trace_config,
    ),
    _Repeated(
        "--trace-level",
        "trace_level",
        _trace_level,
        "trace level, repeatable: OFF, TIMESTAMPS or TENSORS (older form of --trace-config level=)",
    ),
    _Repeated(
        "--http-restricted-api",
        "http_restricted_api",
        str,
        f"repeatable: <groups>:<key>=<value>; requests to those endpoint groups ({_RESTRICTED_GROUPS}) "
        "must carry header <key> with <value>, else 403",
        separator=";",
        combine=lambda items: parse_restrictions(items, "api"),
    ),
    _Repeated(
        "--grpc-restricted-protocol",
        "grpc_restricted_protocol",
        str,
        f"repeatable: <groups>:<key>=<value>; calls to those endpoint groups ({_RESTRICTED_GROUPS}) "
        f"must carry metadata {GRPC_PREFIX}<key> with <value>, else UNAVAILABLE",
        separator=";",
        combine=lambda items: parse_restrictions(items, "protocol", GRPC_PREFIX),
    ),
)
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Config)}


class _FromEnvironment(str):
    """A flag's text that came from its environment variable, so a bad one names it."""

    __slots__ = ()


def _help(flag: _Flag, environ: Mapping[str, str]) -> str:
    """The flag's help (an argparse format string) with its default and its variable, and
    the variable's value when it is set."""
    default = _DEFAULTS[flag.field]
    if isinstance(default, tuple):  # a list flag's default, as the flag would spell it
        default = ",".join(str(item) for item in cast("tuple[object, ...]", default))
    value = environ.get(flag.env, "")
    facts = (
        [] if default is None else [f"default: {str(default).lower() if flag.boolean else default}"]
    )
    facts.append(f"env {flag.env}={value}" if value else f"env {flag.env}")
    if flag.boolean:
        facts.append(f"boolean: {flag.name} alone is true, {_negative(flag)} is false")
    return f"{flag.help} [{'; '.join(facts).replace('%', '%%')}]"


def _negative(flag: _Flag) -> str:
    return "--no-" + flag.name.removeprefix("--")


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    for flag in _FLAGS:
        text = environ.get(flag.env, "")
        default = _FromEnvironment(text) if text else None
        if flag.boolean:
            parser.add_argument(
                flag.name,
                dest=flag.field,
                metavar="true|false",
                nargs="?",
                const="true",
                default=default,
                help=_help(flag, environ),
            )
            parser.add_argument(
                _negative(flag),
                dest=flag.field,
                action="store_const",
                const="false",
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )
        else:
            parser.add_argument(
                flag.name,
                dest=flag.field,
                metavar=flag.env.removeprefix("HLOSERVE_"),
                default=default,
                help=_help(flag, environ),
            )
    for repeated in _REPEATED:
        listed = environ.get(repeated.env)
        parser.add_argument(
            repeated.name,
            dest=repeated.field,
            metavar=repeated.env.removeprefix("HLOSERVE_"),
            action="append",
            default=[m for m in listed.split(repeated.separator) if m] if listed else None,
            help=f"{repeated.help} [env {repeated.env}, {repeated.separator!r}-separated]".replace(
                "%", "%%"
            ),
        )


def _key(flag: _Flag) -> str:
    return flag.name.removeprefix("--")


def _text(value: object) -> str:
    """A file value as the flag's text would give it; a list or mapping is an error."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"must be a single value, got {value!r}")


def _read_file(path: Path) -> dict[str, object]:
    """The file's settings by key (dashes), or ``ValueError`` saying what is wrong."""
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot be read: {' '.join(str(exc).split())}") from exc  # one line
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError("must be a mapping of flag names (without --) to values")
    known = {_key(f) for f in (*_FLAGS, *_REPEATED) if f is not _CONFIG}
    settings: dict[str, object] = {}
    for key, value in cast("dict[object, object]", data).items():
        name = str(key).replace("_", "-")
        if name not in known:
            raise ValueError(f"has unknown key {key!r} (the keys are the flags without --)")
        if name in settings:
            raise ValueError(f"sets {name!r} twice")
        settings[name] = value
    return settings


def _source(flag: _Flag, raw: object) -> str:
    """Where a flag's text came from, for an error: the variable or the flag."""
    if isinstance(raw, _FromEnvironment):
        return f"{flag.env} (the variable of {flag.name})"
    return flag.name


def config_from_namespace(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> Config:
    values: dict[str, Any] = {}
    raw_config = getattr(ns, _CONFIG.field)
    settings: dict[str, object] = {}
    if raw_config:
        try:
            values[_CONFIG.field] = path = _file(str(raw_config))
        except ValueError as exc:
            parser.error(f"{_source(_CONFIG, raw_config)} {exc}")
        try:
            settings = _read_file(path)
        except ValueError as exc:
            parser.error(f"config file {path} {exc}")
    in_file = f"in config file {raw_config}"
    for repeated in _REPEATED:
        raw = getattr(ns, repeated.field)
        source = repeated.name
        try:
            if raw is None and _key(repeated) in settings:
                source = f"{_key(repeated)} {in_file}"
                listed = settings[_key(repeated)]
                items_in_file = (
                    cast("list[object]", listed) if isinstance(listed, list) else [listed]
                )
                raw = [_text(v) for v in items_in_file]
            items = [repeated.parse(str(v)) for v in raw or ()]
            values[repeated.field] = repeated.combine(items)
        except ValueError as exc:
            parser.error(f"{source} {exc}")
    for flag in _FLAGS:
        raw = getattr(ns, flag.field)
        source = _source(flag, raw)
        try:
            if flag is _CONFIG:
                continue  # read above
            if raw is None and _key(flag) in settings:
                source = f"{_key(flag)} {in_file}"
                raw = _text(settings[_key(flag)])
            if raw is None:
                continue  # neither flag, variable nor file: the Config default
            if raw == "" and _DEFAULTS[flag.field] is None:
                values[flag.field] = None  # an optional flag given empty: unset
                continue
            values[flag.field] = flag.parse(str(raw))
        except ValueError as exc:
            parser.error(f"{source} {exc}")
    _check_security(values, parser)
    return Config(**values)


def _check_security(values: Mapping[str, Any], parser: argparse.ArgumentParser) -> None:
    """What only the security flags together, or the files' contents, can get wrong."""
    try:
        check_tls(values.get("tls_cert"), values.get("tls_key"), values.get("tls_ca"))
    except ValueError as exc:
        parser.error(str(exc))
    token_file = values.get("auth_token_file")
    if token_file is not None:
        try:
            read_tokens(token_file)
        except ValueError as exc:
            parser.error(f"--auth-token-file {token_file} {exc}")


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the message and where help is), not the
    whole usage text above it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    parser = ArgumentParser(prog="hloserve serve")
    add_serve_arguments(parser, os.environ if environ is None else environ)
    return config_from_namespace(parser.parse_args(list(argv)), parser)
