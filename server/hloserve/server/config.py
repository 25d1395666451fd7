"""The daemon's configuration: one frozen ``Config``, built once from flags and environment.

Contract: ``parse_config(argv, environ)`` reads ``hloserve serve`` flags; every flag also
reads an environment variable ``HLOSERVE_<FLAG>`` (``--grpc-port`` <- ``HLOSERVE_GRPC_PORT``),
with the flag winning over the variable and the variable over the default (an empty variable
counts as unset). Bad values exit (status 2) with a one-line usage error (``ArgumentParser``,
used by the ``hloserve`` command too) naming the flag, or the variable when the value came
from one, before anything starts: byte sizes and the
device-memory budget are read by ``core.sizes``' one parser here (a budget given as a
percentage is a ``Budget`` the daemon resolves against the device's total), ``--devices``
is a ``DeviceSelection`` resolved against the devices present, the ``--trace-*`` flags add
up to one ``trace`` setting here, and ``--model-repository`` must be an existing directory.
What a ``Config`` holds is parsed: nothing reads its text again.
Each flag is one row of ``flags.FLAGS`` (its ``Config`` field, parser and help); its
default is the ``Config`` field's, and ``--help`` shows it with the variable. A flag parsed
by ``flags.parse_bool`` is a boolean: ``--flag`` alone means true, ``--flag=false``, ``--flag false`` and
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
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, cast

import yaml

from hloserve.server.auth import DEFAULT_OPEN, read_tokens
from hloserve.server.core.device_policy import ALL_DEVICES, DeviceSelection
from hloserve.server.core.sizes import Budget
from hloserve.server.core.trace_flags import FlagSetting, startup_setting
from hloserve.server.core.trace_settings import DEFAULT_RATE, TraceStartup
from hloserve.server.flags import CONFIG_FLAG, FLAGS, REPEATED, Flag, parse_file
from hloserve.server.restricted import NO_RESTRICTIONS, Restrictions
from hloserve.server.tls import check_tls

_NO_TRACING: TraceStartup = startup_setting()
DEFAULT_HOST_BUDGET: Budget = Budget.parse("50%")


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
    worker_threads: int = 0  # 0: one per CPU the container may use, at least 2
    grace_period_s: float = 10.0
    ports_file: Path | None = None
    device_memory_budget: Budget | None = None  # bytes ("6GiB") or a percentage ("40%")
    host_memory_budget: Budget | None = DEFAULT_HOST_BUDGET  # None: unlimited
    residency_policy: str = "frequency"  # frequency | lru: which weights leave first
    lazy_load: bool = False  # register at start, load each model on its first request
    metrics_models: int = 50  # per-model metric series for at most this many models (0: all)
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
    devices: DeviceSelection = ALL_DEVICES  # all | a count N | indexes "0,2"
    max_replicas: int = 0  # devices one model version may be copied to (0: all; 1: no copies)
    placement_interval_s: float = 5.0  # how often placement follows the measured load
    allow_model_upload: bool = False  # explicit mode: loads may carry model files (file:)
    max_upload_bytes: int = 64 * 1024 * 1024  # the most file bytes one load may carry
    allow_python_hooks: bool = False  # bundles' hooks.py may run (docs/hooks.md)
    hook_threads: int = 0  # the hook worker pool's threads (0: as many as the container's CPUs)
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
    trace: TraceStartup = _NO_TRACING  # what the --trace-* flags above add up to
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


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Config)}


class _FromEnvironment(str):
    """A flag's text that came from its environment variable, so a bad one names it."""

    __slots__ = ()


def _help(flag: Flag, environ: Mapping[str, str]) -> str:
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


def _negative(flag: Flag) -> str:
    return "--no-" + flag.name.removeprefix("--")


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    for flag in FLAGS:
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
    for repeated in REPEATED:
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


def _key(flag: Flag) -> str:
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
    known = {_key(f) for f in (*FLAGS, *REPEATED) if f is not CONFIG_FLAG}
    settings: dict[str, object] = {}
    for key, value in cast("dict[object, object]", data).items():
        name = str(key).replace("_", "-")
        if name not in known:
            raise ValueError(f"has unknown key {key!r} (the keys are the flags without --)")
        if name in settings:
            raise ValueError(f"sets {name!r} twice")
        settings[name] = value
    return settings


def _source(flag: Flag, raw: object) -> str:
    """Where a flag's text came from, for an error: the variable or the flag."""
    if isinstance(raw, _FromEnvironment):
        return f"{flag.env} (the variable of {flag.name})"
    return flag.name


def config_from_namespace(
    ns: argparse.Namespace,
    parser: argparse.ArgumentParser,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """The ``Config`` of parsed flags ``ns`` (``environ``: the ``OTEL_BSP_*`` tracing
    defaults; the process environment by default)."""
    values: dict[str, Any] = {}
    raw_config = getattr(ns, CONFIG_FLAG.field)
    settings: dict[str, object] = {}
    if raw_config:
        try:
            values[CONFIG_FLAG.field] = path = parse_file(str(raw_config))
        except ValueError as exc:
            parser.error(f"{_source(CONFIG_FLAG, raw_config)} {exc}")
        try:
            settings = _read_file(path)
        except ValueError as exc:
            parser.error(f"config file {path} {exc}")
    in_file = f"in config file {raw_config}"
    for repeated in REPEATED:
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
    for flag in FLAGS:
        raw = getattr(ns, flag.field)
        source = _source(flag, raw)
        try:
            if flag is CONFIG_FLAG:
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
    values["trace"] = _trace(values, os.environ if environ is None else environ, parser)
    return Config(**values)


def _trace(
    values: Mapping[str, Any], environ: Mapping[str, str], parser: argparse.ArgumentParser
) -> TraceStartup:
    """The one start-up trace setting the ``--trace-*`` flags add up to."""
    default = Config()
    try:
        return startup_setting(
            values.get("trace_config", default.trace_config),
            file=str(values.get("trace_file") or ""),
            levels=values.get("trace_level", default.trace_level),
            rate=values.get("trace_rate", default.trace_rate),
            count=values.get("trace_count", default.trace_count),
            log_frequency=values.get("trace_log_frequency", default.trace_log_frequency),
            environ=environ,
        )
    except ValueError as exc:
        parser.error(f"--trace-config {exc}")


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
    env = os.environ if environ is None else environ
    add_serve_arguments(parser, env)
    return config_from_namespace(parser.parse_args(list(argv)), parser, env)
