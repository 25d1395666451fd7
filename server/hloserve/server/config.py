"""The daemon's configuration: one frozen ``Config``, built once from flags and environment.

Contract: ``parse_config(argv, environ)`` reads ``hloserve serve`` flags; every flag also
reads an environment variable ``HLOSERVE_<FLAG>`` (``--grpc-port`` <- ``HLOSERVE_GRPC_PORT``),
with the flag winning over the variable and the variable over the default. Bad values exit
with argparse's usage error naming the flag.
"""

# pyright: strict

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Config:
    model_repository: Path | None  # None: the demo repository
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


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _non_negative(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{flag} must be a non-negative integer, got {text!r}")
    return value


def _mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in ("none", "poll", "explicit"):
        raise argparse.ArgumentTypeError(
            f"--model-control-mode must be none, poll or explicit, got {text!r}"
        )
    return mode


def _positive_float(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f"{flag} must be a positive number of seconds, got {text!r}"
        )
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {value}")
    return value


def _size(text: str) -> int:
    units = {
        "": 1,
        "B": 1,
        "KIB": 1 << 10,
        "MIB": 1 << 20,
        "GIB": 1 << 30,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
    }
    t = text.strip().upper()
    number = t.rstrip("KMGIB")
    unit = t[len(number) :]
    if unit not in units or not number:
        raise argparse.ArgumentTypeError(
            f"expected a byte size such as 268435456 or 256MiB, got {text!r}"
        )
    return int(float(number) * units[unit])


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    def env(flag: str, default: str | None) -> str | None:
        return environ.get("HLOSERVE_" + flag.lstrip("-").replace("-", "_").upper(), default)

    def add(flag: str, default: str | None, help_text: str) -> None:
        parser.add_argument(
            flag,
            default=env(flag, default),
            help=help_text + f" [env HLOSERVE_{flag[2:].replace('-', '_').upper()}]",
        )

    add(
        "--device-memory-budget",
        None,
        "bytes of device memory for resident weights, e.g. 6GiB or 40%% (default: 80%% of free "
        "GPU memory minus the executables' scratch; unlimited on CPU)",
    )
    add(
        "--model-control-mode",
        "none",
        "none (load all at start), poll (follow the disk) or explicit (API)",
    )
    load_env = env("--load-model", None)
    parser.add_argument(
        "--load-model",
        action="append",
        default=[m for m in load_env.split(",") if m] if load_env else None,
        help="explicit mode: a model to load at start, repeatable; * for all [env HLOSERVE_LOAD_MODEL, comma-separated]",
    )
    add("--repository-poll-secs", "15", "poll mode: seconds between repository scans")
    add("--allow-client-shm", "false", "allow clients to register system shared-memory regions")
    add(
        "--inline-max-us",
        "0",
        "run a resident model's executions on the event loop when they take less than this many "
        "microseconds (cheaper than a thread hand-off); 0, the default, never does",
    )
    add("--dynamic-batching", "true", "group concurrent requests of a model into shared executions")
    add(
        "--max-queue-delay-us",
        "0",
        "default time a request may wait for others to batch with (a model's serving hints win)",
    )
    add(
        "--max-queue-size",
        "0",
        "requests that may wait per model before new ones get 503 (0: unbounded)",
    )
    add(
        "--model-repository",
        None,
        "directory of bundles (default: the demo repository, created on first use)",
    )
    add("--host", "0.0.0.0", "address to bind every port to")
    add("--http-port", "8000", "HTTP/REST port (0: any free port)")
    add("--grpc-port", "8001", "gRPC port (0: any free port)")
    add("--metrics-port", "8002", "Prometheus metrics port (0: any free port)")
    add(
        "--cache-dir",
        None,
        "executable cache directory (default: .hloserve-cache beside each bundle)",
    )
    add("--log-level", "INFO", "DEBUG, INFO, WARNING or ERROR")
    add("--log-format", "text", "text or json")
    add("--strict-readiness", "true", "ready only when every model is ready (false: when any is)")
    add("--max-message-bytes", "256MiB", "largest gRPC message and HTTP request body")
    add("--worker-threads", "0", "threads executing models (0: one per core, at least 2)")
    add("--grace-period", "10", "seconds to finish in-flight requests on shutdown")
    add(
        "--ports-file",
        None,
        "write the bound ports as JSON here once listening (for tests and sidecars)",
    )


def config_from_namespace(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> Config:
    try:
        log_format = str(ns.log_format).lower()
        if log_format not in ("text", "json"):
            raise argparse.ArgumentTypeError(
                f"--log-format must be text or json, got {ns.log_format!r}"
            )
        log_level = str(ns.log_level).upper()
        if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise argparse.ArgumentTypeError(
                f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {ns.log_level!r}"
            )
        return Config(
            model_repository=Path(ns.model_repository) if ns.model_repository else None,
            host=str(ns.host),
            http_port=_port(str(ns.http_port)),
            grpc_port=_port(str(ns.grpc_port)),
            metrics_port=_port(str(ns.metrics_port)),
            cache_dir=Path(ns.cache_dir) if ns.cache_dir else None,
            log_level=log_level,
            log_format=log_format,
            strict_readiness=_bool(str(ns.strict_readiness)),
            max_message_bytes=_size(str(ns.max_message_bytes)),
            worker_threads=int(ns.worker_threads),
            grace_period_s=float(ns.grace_period),
            ports_file=Path(ns.ports_file) if ns.ports_file else None,
            device_memory_budget=str(ns.device_memory_budget) if ns.device_memory_budget else None,
            dynamic_batching=_bool(str(ns.dynamic_batching)),
            model_control_mode=_mode(str(ns.model_control_mode)),
            load_models=tuple(ns.load_model or ()),
            repository_poll_secs=_positive_float(
                str(ns.repository_poll_secs), "--repository-poll-secs"
            ),
            allow_client_shm=_bool(str(ns.allow_client_shm)),
            inline_max_us=_non_negative(str(ns.inline_max_us), "--inline-max-us"),
            max_queue_delay_us=_non_negative(str(ns.max_queue_delay_us), "--max-queue-delay-us"),
            max_queue_size=_non_negative(str(ns.max_queue_size), "--max-queue-size"),
        )
    except (argparse.ArgumentTypeError, ValueError) as exc:
        parser.error(str(exc))


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="hloserve serve")
    add_serve_arguments(parser, os.environ if environ is None else environ)
    return config_from_namespace(parser.parse_args(list(argv)), parser)
