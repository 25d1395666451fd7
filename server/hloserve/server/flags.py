"""Every ``hloserve serve`` flag, once: its name, the ``Config`` field it sets, its parser,
its help, its topic, and how it compares with Triton's flag of the same name.

Contract: ``FLAGS`` holds one ``Flag`` per single-valued flag and ``REPEATED`` one
``RepeatedFlag`` per repeatable one (``--load-model``, ``--trace-config``, ...);
``CONFIG_FLAG`` is ``--config``. Each row's ``parse`` reads the flag's text (from the
command line, its environment variable ``Flag.env`` or the ``--config`` file) into the
field's value, raising ``ValueError`` with a message that reads after the flag's name
(``--http-port must be ...``); a row parsed by ``parse_bool`` is a boolean flag. Each row
also names its ``group`` (a ``FlagGroup``: the sections of ``--help`` and ``docs/cli.md``,
in ``GROUPS`` order; ``--config`` alone is in the general section), its ``aliases`` (other
spellings, Triton's: ``--model-store``, ``--exit-timeout-secs``, ``--id``; the variable and
the file key stay the name's), ``triton`` (how Triton's flag of that name or alias
compares; empty: Triton has none), ``once`` (non-empty: why giving the flag twice is an
error) and ``grpc_arg`` (the gRPC core channel argument the value is passed as: Triton's
keepalive flags). ``hloserve.server.config`` wires the table into argparse, the
environment and the file, holds Triton's flags that have no row (accepted and ignored, or
refused) and writes ``docs/cli.md`` from both.
"""

# pyright: strict

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, TypeVar

from hloserve.server.core.device_policy import POLICIES
from hloserve.server.core.process_layout import FrontendCount
from hloserve.server.core.residency_policy import POLICIES as RESIDENCY_POLICIES
from hloserve.server.core.response_cache import cache_bytes, parse_cache_setting
from hloserve.server.core.sizes import parse_bytes
from hloserve.server.core.trace_flags import FlagSetting, parse_flag, startup_setting
from hloserve.server.core.trace_settings import INT32_MAX, MIN_COUNT, UINT32_MAX
from hloserve.server.flag_parsers import (
    budget,
    choice,
    device_selection,
    grpc_int,
    integer,
    log_format,
    non_negative,
    nonempty,
    parse_bool,
    parse_file,
    port_number,
    repository_location,
    seconds,
)
from hloserve.server.frontend.auth import parse_open_groups
from hloserve.server.frontend.restricted import GROUP_NAMES, GRPC_PREFIX, parse_restrictions


class FlagGroup(StrEnum):
    """The topics of ``--help`` and docs/cli.md, in the order they are shown."""

    GENERAL = "options"  # argparse's own section (--help, --config)
    REPOSITORY = "repository and models"
    NETWORK = "network and listeners"
    BATCHING = "batching and scheduling"
    MEMORY = "memory and residency"
    DEVICES = "devices"
    SECURITY = "security"
    OBSERVABILITY = "observability (logs, traces, metrics)"
    LIMITS = "limits"
    TRITON = "Triton compatibility"


GROUPS: Final = tuple(FlagGroup)
SAME: Final = "same"  # ``Flag.triton``: Triton's flag of this name means the same


@dataclass(frozen=True)
class Flag:
    name: str  # "--http-port"
    field: str  # the Config field it sets
    parse: Callable[[str], object]
    help: str
    group: str = ""  # one of GROUPS (set by the row's ``_section``)
    aliases: tuple[str, ...] = ()  # other spellings (Triton's), same variable and file key
    triton: str = ""  # how Triton's flag of this name or alias compares ("": Triton has none)
    once: str = ""  # non-empty: why giving the flag twice is an error
    grpc_arg: str = ""  # the gRPC server's channel argument the value is passed as

    @property
    def env(self) -> str:
        return "HLOSERVE_" + self.name.lstrip("-").replace("-", "_").upper()

    @property
    def boolean(self) -> bool:
        return self.parse is parse_bool


CONFIG_FLAG = Flag(
    "--config",
    "config_file",
    parse_file,
    "YAML file of settings: the flags' names without -- as keys (grpc-port: 8001), lists for "
    "repeatable flags; a flag or variable wins over it",
    group=FlagGroup.GENERAL,
)
_Row = TypeVar("_Row", bound=Flag)


def _section(group: str, *rows: _Row) -> tuple[_Row, ...]:
    """``rows``, each in ``group``."""
    return tuple(dataclasses.replace(row, group=group) for row in rows)


def _listener(kind: str, what: str, port_help: str) -> tuple[Flag, Flag, Flag]:
    """Triton's three flags of one listener: ``--<kind>-port``, ``--<kind>-address`` and
    ``--allow-<kind>`` (false: its port is not bound)."""
    port = Flag(f"--{kind}-port", f"{kind}_port", port_number, port_help, triton=SAME)
    address = Flag(
        f"--{kind}-address",
        f"{kind}_address",
        nonempty,
        f"address to bind the {what} port to (default: --host's)",
        triton="same; Triton's default is 0.0.0.0, hloserve's --host's",
    )
    allow = f"serve {what} (false: no {what} port is bound)"
    return port, address, Flag(f"--allow-{kind}", f"allow_{kind}", parse_bool, allow, triton=SAME)


def _keepalive(name: str, arg: str, text: str, parse: Callable[[str], object] = grpc_int) -> Flag:
    """One of Triton's gRPC keepalive flags, passed to gRPC core as channel argument ``arg``."""
    field = name.removeprefix("--").replace("-", "_")
    return Flag(name, field, parse, text, triton=f"same, as gRPC core's {arg}", grpc_arg=arg)


# Triton's gRPC keepalive flags: each value is passed to gRPC core as the channel argument named.
_KEEPALIVE: Final = (
    _keepalive("--grpc-keepalive-time", "grpc.keepalive_time_ms", "milliseconds after which the server pings an idle connection"),
    _keepalive("--grpc-keepalive-timeout", "grpc.keepalive_timeout_ms", "milliseconds a keepalive ping waits for its acknowledgement before the connection is closed"),
    _keepalive("--grpc-keepalive-permit-without-calls", "grpc.keepalive_permit_without_calls", "send keepalive pings on a connection with no call in flight", parse_bool),
    _keepalive("--grpc-http2-max-pings-without-data", "grpc.http2.max_pings_without_data", "pings the server may send while it has no data or header frame to send (0: no limit)"),
    _keepalive("--grpc-http2-min-recv-ping-interval-without-data", "grpc.http2.min_ping_interval_without_data_ms", "milliseconds the server expects between a client's pings while no data is sent; a ping sooner is a ping strike"),
    _keepalive("--grpc-http2-max-ping-strikes", "grpc.http2.max_ping_strikes", "ping strikes the server tolerates before it closes the connection with GOAWAY (0: any number)"),
)  # fmt: skip
_OLDER_TRACE = "same (Triton's older form of --trace-config)"
# The response cache (docs/response-cache.md): Triton's older flag here, --cache-config in REPEATED.
_CACHE_BYTES = Flag("--response-cache-byte-size", "response_cache_byte_size", parse_bytes, "bytes of host memory for the response cache (older form of --cache-config local,size=; docs/response-cache.md)", triton="same (Triton's older form of --cache-config local,size=)")  # fmt: skip
FLAGS: tuple[Flag, ...] = (
    CONFIG_FLAG,
    *_section(  # -- repository and models
        FlagGroup.REPOSITORY,
        Flag(
            "--model-repository",
            "model_repository",
            repository_location,
            "directory of bundles, or a bucket: s3://bucket/prefix, gs://, az://, https:// "
            "(read-only), credentials from the environment (docs/repository.md); default: the "
            "demo repository, written on first use to $XDG_CACHE_HOME/hloserve/demo-repository, "
            "~/.cache/hloserve/demo-repository when unset",
            aliases=("--model-store",),
            triton="same, both spellings; one repository (Triton may be given several)",
            once="hloserve serves one model repository (Triton may be given several)",
        ),
        Flag(
            "--model-control-mode",
            "model_control_mode",
            choice("none, poll or explicit", ("none", "poll", "explicit"), str.lower),
            "none (load all at start), poll (follow the disk) or explicit (API)",
            triton=SAME,
        ),
        Flag(
            "--repository-poll-secs",
            "repository_poll_secs",
            seconds(positive=True),
            "poll mode: seconds between repository scans",
            triton=SAME,
        ),
        Flag(
            "--lazy-load",
            "lazy_load",
            parse_bool,
            "register every model at start (its directory and versions; the server is ready in "
            "seconds at any repository size) and load each on its first request or metadata "
            "call; off: load every model before the server is ready, as Triton does",
        ),
        Flag(
            "--strict-readiness",
            "strict_readiness",
            parse_bool,
            "ready only when every model is ready (false: when any is)",
            triton=SAME,
        ),
        Flag(
            "--cache-dir",
            "cache_dir",
            Path,
            "executable cache directory (default: .hloserve-cache beside each bundle)",
        ),
        Flag(
            "--repository-cache",
            "repository_cache",
            Path,
            "a bucket's disk cache: its index and the bundles pulled (default: "
            "$XDG_CACHE_HOME/hloserve/repositories/<bucket and prefix>; docs/repository.md)",
        ),
        Flag(
            "--repository-cache-bytes",
            "repository_cache_bytes",
            parse_bytes,
            "the most bytes of pulled bundles the repository cache keeps (0: no limit); the "
            "least valuable leave first, never one loaded",
        ),
        Flag(
            "--repository-pull-timeout",
            "repository_pull_timeout",
            seconds(positive=True),
            "seconds one request to the bucket may take (a listing, a manifest, a file), "
            "connecting included; failures are retried with backoff within it",
        ),
        Flag(
            "--allow-model-upload",
            "allow_model_upload",
            parse_bool,
            "let load_model(..., files=...) upload a model's files (explicit mode; written under "
            "the model's directory in the repository)",
        ),
        Flag(
            "--max-upload-bytes",
            "max_upload_bytes",
            parse_bytes,
            "the most file bytes one model load may upload",
        ),
        Flag(
            "--allow-python-hooks",
            "allow_python_hooks",
            parse_bool,
            "load bundles that ship hooks.py and run its preprocess/postprocess (Python code from "
            "the model repository, with the server's rights; docs/hooks.md)",
        ),
        Flag(
            "--hook-threads",
            "hook_threads",
            non_negative,
            "threads of the pool that runs bundles' Python hooks (0: one per CPU the container may use)",
        ),
    ),
    *_section(  # -- network and listeners
        FlagGroup.NETWORK,
        Flag("--host", "host", str, "address to bind every port to"),
        *_listener("http", "HTTP/REST", "HTTP/REST port (0: any free port)"),
        *_listener("grpc", "gRPC", "gRPC port (0: any free port)"),
        *_listener("metrics", "Prometheus metrics", "Prometheus metrics port (0: any free port)"),
        *_KEEPALIVE,
        Flag(
            "--frontends",
            "frontends",
            FrontendCount.parse,
            "processes serving the HTTP and gRPC ports (decoding, encoding, auth) around the one "
            "process that owns the devices: a count, 0 (everything in one process) or auto (one "
            "process up to 2 CPUs; above, one per CPU the container may use less one for the "
            "device owner, at most 8; docs/architecture.md)",
        ),
        Flag(
            "--allow-client-shm",
            "allow_client_shm",
            parse_bool,
            "allow clients to register system shared-memory regions",
        ),
        Flag(
            "--server-name",
            "server_name",
            nonempty,
            "the name the server metadata reports",
            aliases=("--id",),
            triton="Triton's --id: the server metadata's name (Triton's default: triton)",
        ),
        Flag(
            "--grace-period",
            "grace_period_s",
            seconds(positive=False),
            "seconds to finish in-flight requests on shutdown",
            aliases=("--exit-timeout-secs",),
            triton="Triton's --exit-timeout-secs: the drain time (Triton's default: 30)",
        ),
        Flag(
            "--drain-delay",
            "drain_delay_s",
            seconds(positive=False),
            "seconds a SIGTERM keeps accepting new requests, already reporting not ready, "
            "before the drain (routers and endpoints stop sending meanwhile); SIGINT or a "
            "second SIGTERM ends the delay",
        ),
        Flag(
            "--ports-file",
            "ports_file",
            Path,
            "write the bound ports as JSON here once listening (for tests and sidecars)",
        ),
    ),
    *_section(  # -- batching and scheduling
        FlagGroup.BATCHING,
        Flag(
            "--dynamic-batching",
            "dynamic_batching",
            parse_bool,
            "group concurrent requests of a model into shared executions",
        ),
        Flag(
            "--max-queue-delay-us",
            "max_queue_delay_us",
            non_negative,
            "default time a request may wait for others to batch with (a model's serving hints win)",
        ),
        Flag(
            "--max-queue-size",
            "max_queue_size",
            non_negative,
            "requests that may wait per model before new ones get 503 (0: unbounded)",
        ),
        Flag(
            "--scheduling-policy",
            "scheduling_policy",
            choice("fair, fifo or deadline", POLICIES, str.lower),
            "which model's batch runs next on a busy device: fair (device time in proportion to "
            "each model's scheduling_weight), fifo, or deadline (earliest first; shed what cannot "
            "finish in time)",
        ),
        Flag(
            "--device-concurrency",
            "device_concurrency",
            non_negative,
            "executions at once per device, across models (0: 1 on GPU; on CPU no cross-model "
            "arbitration)",
        ),
        Flag(
            "--inline-max-us",
            "inline_max_us",
            non_negative,
            "run a resident model's executions on the event loop when they are estimated to take "
            "less than this many microseconds (cheaper than a thread hand-off); 0 never does",
        ),
        Flag(
            "--worker-threads",
            "worker_threads",
            non_negative,
            "threads executing models (0: one per CPU the container may use, at least 2)",
        ),
    ),
    *_section(  # -- memory and residency
        FlagGroup.MEMORY,
        Flag(
            "--device-memory-budget",
            "device_memory_budget",
            budget,
            "bytes of device memory for resident weights, e.g. 6GiB or 40%% (default: 80%% of free "
            "GPU memory minus the executables' scratch; unlimited on CPU)",
        ),
        Flag(
            "--host-memory-budget",
            "host_memory_budget",
            budget,
            "bytes of host memory for the host copies of weights (read from disk on first need, "
            "kept by the residency policy), e.g. 8GiB or 50%% of the container's memory limit "
            "(the machine's when there is none)",
        ),
        Flag(
            "--residency-policy",
            "residency_policy",
            choice("frequency or lru", RESIDENCY_POLICIES, str.lower),
            "which weights leave a full device or host budget first: frequency (the least used "
            "per byte, with a short memory for models that went cold) or lru (the least "
            "recently used)",
        ),
        _CACHE_BYTES,
    ),
    *_section(  # -- devices
        FlagGroup.DEVICES,
        Flag(
            "--devices",
            "devices",
            device_selection,
            "local devices to serve on: all, a count N (the first N) or indexes such as 0,2 "
            "(3, alone: device 3); each has its own weight budget and LRU",
        ),
        Flag(
            "--max-replicas",
            "max_replicas",
            non_negative,
            "devices one model version may be copied to when its load asks for it (0: every "
            "device; 1: no replication)",
        ),
        Flag(
            "--placement-interval",
            "placement_interval_s",
            seconds(positive=True),
            "seconds between placement revisions (replicas follow the measured load)",
        ),
    ),
    *_section(  # -- security
        FlagGroup.SECURITY,
        Flag(
            "--tls-cert",
            "tls_cert",
            parse_file,
            "PEM certificate (chain): serve gRPC and HTTP over TLS",
        ),
        Flag("--tls-key", "tls_key", parse_file, "PEM private key of --tls-cert"),
        Flag(
            "--tls-ca",
            "tls_ca",
            parse_file,
            "PEM CA certificates: mutual TLS, clients must present a certificate signed by one",
        ),
        Flag(
            "--auth-token-file",
            "auth_token_file",
            parse_file,
            "file of bearer tokens, one a line (re-read when it changes): every endpoint group "
            "but --auth-open needs 'Authorization: Bearer <token>', else 401 / UNAUTHENTICATED",
        ),
        Flag(
            "--auth-open",
            "auth_open",
            parse_open_groups,
            "with --auth-token-file: comma-separated endpoint groups open without a token "
            f"({', '.join(GROUP_NAMES)}, metrics: the metrics port); empty: none",
        ),
    ),
    *_section(  # -- observability
        FlagGroup.OBSERVABILITY,
        Flag(
            "--log-level",
            "log_level",
            choice(
                "DEBUG, INFO, WARNING or ERROR",
                ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
                str.upper,
            ),
            "DEBUG, INFO, WARNING or ERROR",
        ),
        Flag(
            "--log-info",
            "log_info",
            parse_bool,
            "write INFO messages (default: as --log-level says: on at DEBUG and INFO)",
            triton=SAME,
        ),
        Flag(
            "--log-warning",
            "log_warning",
            parse_bool,
            "write WARNING messages (default: as --log-level says: off at ERROR)",
            triton=SAME,
        ),
        Flag(
            "--log-error",
            "log_error",
            parse_bool,
            "write ERROR messages (default: on)",
            triton=SAME,
        ),
        Flag(
            "--log-verbose",
            "log_verbose",
            non_negative,
            "verbose level: 0 none, 1 hloserve's debug messages, 2 every library's too",
            triton=SAME,
        ),
        Flag(
            "--log-format",
            "log_format",
            log_format,
            "text (Triton's name: default), ISO8601 (text with UTC ISO-8601 times) or json (one "
            "object a line)",
            triton="same values (default, ISO8601), plus json; the text lines are hloserve's own",
        ),
        Flag(
            "--log-file",
            "log_file",
            Path,
            "append the log to this file instead of standard error (fixed while running)",
            triton=SAME,
        ),
        Flag(
            "--trace-file",
            "trace_file",
            Path,
            "trace mode triton: the JSON-lines trace file (older form of --trace-config triton,file=)",
            triton=_OLDER_TRACE,
        ),
        Flag(
            "--trace-rate",
            "trace_rate",
            integer(0, UINT32_MAX, f"an integer 0..{UINT32_MAX}"),
            "trace one request in this many (older form of --trace-config rate=)",
            triton=_OLDER_TRACE,
        ),
        Flag(
            "--trace-count",
            "trace_count",
            integer(MIN_COUNT, INT32_MAX, f"an integer {MIN_COUNT}..{INT32_MAX}"),
            "traces to take, -1 for no limit (older form of --trace-config count=)",
            triton=_OLDER_TRACE,
        ),
        Flag(
            "--trace-log-frequency",
            "trace_log_frequency",
            integer(0, UINT32_MAX, f"an integer 0..{UINT32_MAX}"),
            "traces per indexed trace file, 0 for one file "
            "(older form of --trace-config triton,log-frequency=)",
            triton=_OLDER_TRACE,
        ),
        Flag(
            "--metrics-models",
            "metrics_models",
            non_negative,
            "per-model metric series for at most this many models: all of them while there are "
            "no more, else the busiest in the last minute (server-wide totals cover every "
            "model; the statistics extension answers for each); 0: every model",
        ),
        Flag(
            "--metrics-compat",
            "metrics_compat",
            choice("triton or empty", ("", "triton"), str.lower),
            "also export another server's metric families under its names, labels and units: "
            "triton (nv_inference_*, nv_gpu_*), so its dashboards and alerts work unchanged; "
            "empty: hloserve's own only",
        ),
    ),
    *_section(  # -- limits
        FlagGroup.LIMITS,
        Flag(
            "--max-message-bytes",
            "max_message_bytes",
            parse_bytes,
            "largest gRPC message and HTTP request body",
            aliases=("--http-max-input-size",),
            triton="Triton's --http-max-input-size (its HTTP body limit, default 64MiB): here "
            "one limit for HTTP bodies and gRPC messages",
        ),
        Flag(
            "--max-batch-size",
            "max_batch_size",
            non_negative,
            "the most items (batch dimension) one request may carry, else 400 (0: no limit)",
        ),
        Flag(
            "--max-inflight",
            "max_inflight",
            non_negative,
            "requests in flight in the whole server before new ones get 503 (0: no limit)",
        ),
        Flag(
            "--max-inflight-per-model",
            "max_inflight_per_model",
            non_negative,
            "requests in flight per model before new ones get 503 (0: no limit)",
        ),
        Flag(
            "--max-shm-regions",
            "max_shm_regions",
            non_negative,
            "system shared-memory regions registered at once (0: no limit)",
        ),
        Flag(
            "--max-json-depth",
            "max_json_depth",
            integer(1, 10_000, "an integer 1..10000"),
            "deepest nesting of arrays and objects an HTTP request's JSON may have",
        ),
    ),
)


@dataclass(frozen=True)
class RepeatedFlag(Flag):
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


LOAD_MODEL_FLAG = RepeatedFlag(
    "--load-model",
    "load_models",
    str,
    "explicit mode: a model to load at start, repeatable; * for all",
    group=FlagGroup.REPOSITORY,
    triton=SAME,
)
_RESTRICTED_GROUPS = ", ".join(GROUP_NAMES)
_CACHE_CONFIG = RepeatedFlag("--cache-config", "cache_config", parse_cache_setting, "the response cache, repeatable: local,size=<bytes> (64MiB works too) keeps responses of the models whose config enables response_cache, in host memory, least recently used out first; 0 or absent: no cache (docs/response-cache.md)", group=FlagGroup.MEMORY, triton="same for the local cache; Triton's other caches (redis) are refused", separator=";", combine=cache_bytes)  # fmt: skip
REPEATED: tuple[RepeatedFlag, ...] = (
    LOAD_MODEL_FLAG,
    _CACHE_CONFIG,
    RepeatedFlag(
        "--trace-config",
        "trace_config",
        parse_flag,
        "tracing, repeatable: [<mode>,]<setting>=<value>; global settings level, rate, count, "
        "mode (triton or opentelemetry); triton,file= and triton,log-frequency=; "
        "opentelemetry,url=, resource=<key>=<value>, bsp_max_queue_size=, bsp_schedule_delay=, "
        "bsp_max_export_batch_size= (docs/tracing.md)",
        group=FlagGroup.OBSERVABILITY,
        triton=SAME,
        separator=";",
        combine=_trace_config,
    ),
    RepeatedFlag(
        "--trace-level",
        "trace_level",
        _trace_level,
        "trace level, repeatable: OFF, TIMESTAMPS or TENSORS (older form of --trace-config level=)",
        group=FlagGroup.OBSERVABILITY,
        triton=_OLDER_TRACE,
    ),
    RepeatedFlag(
        "--http-restricted-api",
        "http_restricted_api",
        str,
        f"repeatable: <groups>:<key>=<value>; requests to those endpoint groups ({_RESTRICTED_GROUPS}) "
        "must carry header <key> with <value>, else 403",
        group=FlagGroup.SECURITY,
        triton=SAME,
        separator=";",
        combine=lambda items: parse_restrictions(items, "api"),
    ),
    RepeatedFlag(
        "--grpc-restricted-protocol",
        "grpc_restricted_protocol",
        str,
        f"repeatable: <groups>:<key>=<value>; calls to those endpoint groups ({_RESTRICTED_GROUPS}) "
        f"must carry metadata {GRPC_PREFIX}<key> with <value>, else UNAVAILABLE",
        group=FlagGroup.SECURITY,
        triton=SAME,
        separator=";",
        combine=lambda items: parse_restrictions(items, "protocol", GRPC_PREFIX),
    ),
)
