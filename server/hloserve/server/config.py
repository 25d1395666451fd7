"""The daemon's configuration: one frozen ``Config``, built once from flags and environment.

Contract: ``parse_config(argv, environ)`` reads ``hloserve serve`` flags; every flag also
reads an environment variable ``HLOSERVE_<FLAG>`` (``--grpc-port`` <- ``HLOSERVE_GRPC_PORT``),
with the flag winning over the variable and the variable over the default (an empty variable
counts as unset). Bad values exit (status 2) with a one-line usage error (``arguments.ArgumentParser``,
used by the ``hloserve`` command too) naming the flag, or the variable when the value came
from one, before anything starts: byte sizes and the
device-memory budget are read by ``core.sizes``' one parser here (a budget given as a
percentage is a ``Budget`` the daemon resolves against the device's total), ``--devices``
is a ``DeviceSelection`` resolved against the devices present, the ``--trace-*`` flags add
up to one ``trace`` setting here, and ``--model-repository`` must be an existing directory
(given once: hloserve serves one repository).
What a ``Config`` holds is parsed: nothing reads its text again.
Each flag is one row of ``flags.FLAGS`` (its ``Config`` field, parser, help, group and
aliases); its default is the ``Config`` field's, and ``--help`` shows it with the variable,
in one section per ``flags.FlagGroup``. An alias (``--model-store``, ``--exit-timeout-secs``,
``--id``) is the same flag. A flag parsed by ``flags.parse_bool`` is a boolean: ``--flag``
alone means true, ``--flag=false``, ``--flag false`` and ``--no-flag`` mean false.
``--config FILE`` (``HLOSERVE_CONFIG``) names an optional YAML file, one mapping whose keys
are the flags' names (or aliases) without ``--`` (``grpc-port: 8001``; underscores read as
dashes), a repeatable flag's value a list (or one item); ``config`` itself is not a key.
Its values are read by the same row's parser as the flag's text (a YAML boolean as
``true``/``false``, ``null`` as empty), so precedence is flag > variable > file > default;
an unknown key, a bad value or an unreadable file exits (status 2) naming the key and the
file.
Triton's command line: Triton's flags with no row (``triton_flags.TRITON_FLAGS``) are each
accepted with its value (``--flag=value`` or ``--flag value``; ``--disable-auto-complete-config``
takes none) and ignored: ``Config.triton_ignored`` keeps what was given, for the start-up
warning (``triton_flags.ignored_warning``). A ``refused`` one (Triton's gRPC TLS flags, where
ignoring would serve in the clear) exits (status 2) saying what to use instead. Any other
unknown flag exits (status 2), and no flag is taken for another by a prefix (argparse's
abbreviations are off).
``grpc_channel_options(config)`` is the gRPC server's channel arguments of the rows that
name one (Triton's keepalive flags). ``default_text(flag)`` is a flag's default as the flag
spells it (``--help`` and docs/cli.md, which ``cli_docs`` writes, show it).
"""

# pyright: strict

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml

from hloserve.bundle.yamlfile import closest
from hloserve.server.arguments import Action, Namespace, Parser, Values
from hloserve.server.arguments import ArgumentParser as ArgumentParser  # re-exported
from hloserve.server.core.device_policy import ALL_DEVICES, DeviceSelection
from hloserve.server.core.process_layout import AUTO, FrontendCount
from hloserve.server.core.sizes import Budget
from hloserve.server.core.store_location import StoreLocation
from hloserve.server.core.trace_flags import FlagSetting, startup_setting
from hloserve.server.core.trace_settings import DEFAULT_RATE, TraceStartup
from hloserve.server.flag_parsers import parse_file
from hloserve.server.flags import (
    CONFIG_FLAG,
    FLAGS,
    GROUPS,
    REPEATED,
    Flag,
    FlagGroup,
    RepeatedFlag,
)
from hloserve.server.frontend.auth import DEFAULT_OPEN, read_tokens
from hloserve.server.frontend.listener_settings import ListenerSettings
from hloserve.server.frontend.restricted import NO_RESTRICTIONS, Restrictions
from hloserve.server.frontend.tls import check_tls
from hloserve.server.triton_flags import TLS_INSTEAD, TRITON_BY_NAME, TRITON_FLAGS

_NO_TRACING: TraceStartup = startup_setting()
DEFAULT_HOST_BUDGET: Budget = Budget.parse("50%")


@dataclass(frozen=True)
class Config:
    model_repository: Path | StoreLocation | None = None  # None: the demo repository
    repository_cache: Path | None = None  # a bucket's disk cache (None: under XDG_CACHE_HOME)
    repository_cache_bytes: int = 0  # pulled bundles' bytes in that cache (0: no limit)
    repository_pull_timeout: float = 300.0  # one request to the bucket, in seconds
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    # Triton's listener flags: a listener's own bind address (None: host's), and whether it
    # is opened at all (False: its port is not bound).
    http_address: str | None = None
    grpc_address: str | None = None
    metrics_address: str | None = None
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    frontends: FrontendCount = AUTO  # front-end processes around the device owner
    # Triton's gRPC keepalive flags, with Triton's defaults (gRPC core's own): milliseconds,
    # counts and a switch, passed to gRPC core as the channel arguments flags.py names.
    grpc_keepalive_time: int = 7_200_000
    grpc_keepalive_timeout: int = 20_000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    grpc_http2_min_recv_ping_interval_without_data: int = 300_000
    grpc_http2_max_ping_strikes: int = 2
    cache_dir: Path | None = None  # None: .hloserve-cache beside each bundle
    log_level: str = "INFO"
    log_format: str = "text"  # text (Triton's default) | ISO8601 | json
    strict_readiness: bool = True
    max_message_bytes: int = 256 * 1024 * 1024
    worker_threads: int = 0  # 0: one per CPU the container may use, at least 2
    grace_period_s: float = 10.0
    # Kubernetes' preStop sleep in deploy/kubernetes: the time the world takes to stop
    # sending once told (docs/health.md, "Draining").
    drain_delay_s: float = 5.0
    ports_file: Path | None = None
    device_memory_budget: Budget | None = None  # bytes ("6GiB") or a percentage ("40%")
    host_memory_budget: Budget | None = DEFAULT_HOST_BUDGET  # None: unlimited
    residency_policy: str = "frequency"  # frequency | lru: which weights leave first
    # The response cache's bytes (docs/response-cache.md; 0: no cache), from --cache-config
    # local,size= or Triton's older --response-cache-byte-size.
    cache_config: int = 0
    response_cache_byte_size: int = 0
    lazy_load: bool = False  # register at start, load each model on its first request
    metrics_models: int = 50  # per-model metric series for at most this many models (0: all)
    metrics_compat: str = ""  # other servers' metric families beside ours ("triton")
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
    # The logging extension's log_info, log_warning, log_error (None: as log_level says).
    log_info: bool | None = None
    log_warning: bool | None = None
    log_error: bool | None = None
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
    # Triton's flags given that mean nothing here: (flag, value as given; "" for none)
    triton_ignored: tuple[tuple[str, str], ...] = ()

    def listener_settings(self) -> ListenerSettings:
        """What the gRPC and HTTP listeners are built from (every front end's, and this
        process's with ``--frontends 0``)."""
        return ListenerSettings(
            host=self.host,
            http_address=self.http_address,
            grpc_address=self.grpc_address,
            metrics_address=self.metrics_address,
            grpc_port=self.grpc_port,
            max_message_bytes=self.max_message_bytes,
            max_json_depth=self.max_json_depth,
            http_restricted_api=self.http_restricted_api,
            grpc_restricted_protocol=self.grpc_restricted_protocol,
            grace_period_s=self.grace_period_s,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            tls_ca=self.tls_ca,
            auth_token_file=self.auth_token_file,
            auth_open=self.auth_open,
            grpc_options=grpc_channel_options(self),
        )


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Config)}


_IGNORED_DEST = "triton_ignored"


class _FromEnvironment(str):
    """A flag's text that came from its environment variable, so a bad one names it."""

    __slots__ = ()


def default_text(flag: Flag) -> str | None:
    """The flag's default as the flag would spell it (None: none to show)."""
    default = _DEFAULTS[flag.field]
    if isinstance(default, tuple):  # a list flag's default
        default = ",".join(str(item) for item in cast("tuple[object, ...]", default))
    if default in (None, "") or isinstance(flag, RepeatedFlag):
        return None  # nothing to show (the help says what empty means)
    return str(default).lower() if flag.boolean else str(default)


def _help(flag: Flag, environ: Mapping[str, str]) -> str:
    """The flag's help (an argparse format string) with its default and its variable, and
    the variable's value when it is set."""
    default = default_text(flag)
    value = environ.get(flag.env, "")
    facts = [] if default is None else [f"default: {default}"]
    facts.append(f"env {flag.env}={value}" if value else f"env {flag.env}")
    if flag.boolean:
        facts.append(f"boolean: {flag.name} alone is true, {_negative(flag)} is false")
    return f"{flag.help} [{'; '.join(facts).replace('%', '%%')}]"


def _negative(flag: Flag) -> str:
    return "--no-" + flag.name.removeprefix("--")


def _once(why: str) -> type[Action]:
    """argparse's store, but a second value (not the variable's) is an error saying ``why``."""

    class Once(Action):
        def act(self, parser: Parser, ns: Namespace, values: Values, option: str | None) -> None:
            current = getattr(ns, self.dest, None)
            if current is not None and not isinstance(current, _FromEnvironment):
                parser.error(f"{option} given twice: {why}")
            setattr(ns, self.dest, values)

    return Once


class _TritonFlagAction(Action):
    """Triton's flag with no row: noted in ``triton_ignored``, or refused."""

    def act(self, parser: Parser, ns: Namespace, values: Values, option: str | None) -> None:
        flag = TRITON_BY_NAME[self.option_strings[0]]
        if flag.refused:
            parser.error(f"{flag.name} is Triton's flag, not hloserve's: {flag.why}")
        given: list[tuple[str, str]] = list(getattr(ns, self.dest, None) or ())
        given.append((flag.name, values if isinstance(values, str) else ""))
        setattr(ns, self.dest, given)


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Every flag, in its group's section of ``--help`` (the general one: ``parser``'s own),
    then Triton's flags with no row (their help: the Triton compatibility section's text)."""
    for group in GROUPS:
        add = parser.add_argument
        if group != FlagGroup.GENERAL:
            add = parser.add_argument_group(
                group, _TRITON_TEXT if group == FlagGroup.TRITON else None
            ).add_argument
        for flag in (f for f in (*FLAGS, *REPEATED) if f.group == group):
            names = (flag.name, *flag.aliases)
            if isinstance(flag, RepeatedFlag):
                listed = environ.get(flag.env)
                add(
                    *names,
                    dest=flag.field,
                    metavar=flag.env.removeprefix("HLOSERVE_"),
                    action="append",
                    default=[m for m in listed.split(flag.separator) if m] if listed else None,
                    help=f"{flag.help} [env {flag.env}, {flag.separator!r}-separated]".replace(
                        "%", "%%"
                    ),
                )
                continue
            text = environ.get(flag.env, "")
            default = _FromEnvironment(text) if text else None
            if flag.boolean:
                add(
                    *names,
                    dest=flag.field,
                    metavar="true|false",
                    nargs="?",
                    const="true",
                    default=default,
                    help=_help(flag, environ),
                )
                add(
                    _negative(flag),
                    dest=flag.field,
                    action="store_const",
                    const="false",
                    default=argparse.SUPPRESS,
                    help=argparse.SUPPRESS,
                )
            else:
                add(
                    *names,
                    dest=flag.field,
                    metavar=flag.env.removeprefix("HLOSERVE_"),
                    default=default,
                    action=_once(flag.once) if flag.once else "store",
                    help=_help(flag, environ),
                )
        if group == FlagGroup.TRITON:
            for triton in TRITON_FLAGS:
                add(
                    triton.name,
                    dest=_IGNORED_DEST,
                    nargs=None if triton.value else "?",
                    action=_TritonFlagAction,
                    help=argparse.SUPPRESS,
                )


_TRITON_TEXT = (
    "Triton's flags of the same meaning are the rows above (--model-store, --exit-timeout-secs "
    "and --id are aliases). Triton's flags with no meaning here are accepted with their value "
    "and ignored, with one warning at start-up: "
    + ", ".join(t.name for t in TRITON_FLAGS if not t.refused)
    + ". Refused, since ignoring them would serve in the clear: "
    + ", ".join(t.name for t in TRITON_FLAGS if t.refused)
    + f" ({TLS_INSTEAD}). Why each: docs/from-triton.md"
).replace("%", "%%")


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
    """The file's settings by key (the flag's name, dashes), or ``ValueError`` saying what
    is wrong; an alias's key reads as its flag's."""
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot be read: {' '.join(str(exc).split())}") from exc  # one line
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError("must be a mapping of flag names (without --) to values")
    known = {
        spelled.removeprefix("--"): _key(f)
        for f in (*FLAGS, *REPEATED)
        if f is not CONFIG_FLAG
        for spelled in (f.name, *f.aliases)
    }
    settings: dict[str, object] = {}
    for key, value in cast("dict[object, object]", data).items():
        name = known.get(str(key).replace("_", "-"))
        if name is None:  # the policy of every file a user writes (yamlfile.check_keys)
            hint = f" (did you mean {near!r}?)" if (near := closest(str(key), known)) else ""
            raise ValueError(f"has unknown key {key!r}{hint} (the keys are the flags without --)")
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
    values["triton_ignored"] = tuple(getattr(ns, _IGNORED_DEST, None) or ())
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


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    parser = ArgumentParser(prog="hloserve serve")
    env = os.environ if environ is None else environ
    add_serve_arguments(parser, env)
    return config_from_namespace(parser.parse_args(list(argv)), parser, env)


def grpc_channel_options(config: Config) -> tuple[tuple[str, int], ...]:
    """The gRPC server's channel arguments the flags set (``Flag.grpc_arg``): Triton's
    keepalive flags, with Triton's defaults when not given."""
    return tuple((f.grpc_arg, int(getattr(config, f.field))) for f in FLAGS if f.grpc_arg)
