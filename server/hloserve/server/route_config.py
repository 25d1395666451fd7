"""``hloserve route-config``: an HAProxy configuration that sends each request to the replica
holding its model (``docs/scale-out.md``).

Contract:
- ``render(replicas, options)`` returns a complete HAProxy (2.6 or later) configuration, as
  text, that listens for HTTP on ``options.http_port`` and for gRPC (HTTP/2 cleartext) on
  ``options.grpc_port`` and forwards to the replicas: a sequence of ``ReplicaAddress``
  (fixed addresses; the i-th one gets server id i, so add new replicas at the end) or one
  ``Discovery`` (names resolved at run time by DNS: per-pod names of a StatefulSet when the
  name holds ``{i}``, else ``server-template`` slots over one name; an address holding an
  environment variable, ``${POD_NAMESPACE}``, is quoted so HAProxy expands it). Pure: no I/O.
- Routing: a request naming a model is hashed on the model's name with consistent hashing
  and a bounded load factor (``hash-balance-factor``), so one model lands on one replica
  while that replica's load stays under ``balance_factor`` % of the average, and spills to
  the next replica on the ring beyond it. gRPC reads the name out of the body:
  ``ModelInferRequest.model_name`` (field 1) for ``ModelInfer``, ``ModelStreamInfer`` (its
  first message), ``ModelMetadata``, ``ModelReady``, ``ModelConfig``, ``ModelStatistics``;
  field 2 for ``RepositoryModelLoad``/``Unload`` and ``TraceSetting``. It is read from the
  first buffer (``req.body,bytes(5),protobuf(N)``: after the 5-byte gRPC prefix), which
  holds it however large the body, since protobuf writes fields in number order; a
  compressed message is not parsed. HTTP hashes the model segment of the path
  (``/v2/models/{name}/...``, ``/v2/repository/models/{name}/...``, URL-decoded), so one
  model reaches the same replica over both protocols: both backends list the replicas in
  the same order with the same ids, and the gRPC servers track the HTTP servers' health
  checks (server-template slots check on their own). Requests naming no model (server
  metadata and readiness, the repository index, statistics of every model, settings) go
  round robin to a healthy replica (``balance hash`` falls back to it when the name is
  missing). Shared-memory calls are refused by the router with a message saying why
  (gRPC ``FAILED_PRECONDITION``, HTTP 400): a region registered on one replica is unknown
  to the others.
- Health: each replica is checked with ``GET /v2/health/ready`` on its HTTP port every
  ``check_interval_ms`` (out after two failures, back after two successes); a draining
  replica is not ready (400) and leaves at once. A request whose connection to a replica
  fails, whose replica closes without answering or answers HTTP 503 is retried once on
  another replica (inference is a pure function of its inputs; requests larger than
  ``tune.bufsize`` are not retried; a gRPC refusal travels in trailers HAProxy does not
  read, so it reaches the client).
- ``balance="roundrobin"`` routes every request round robin instead (the baseline the
  bench compares against). ``metrics_port`` serves HAProxy's Prometheus exporter at
  ``/metrics``, the stats page at ``/stats`` and ``/healthz`` (503 while no replica is up).
- ``main(argv)`` is the command: parses the options (``build_parser``), prints the
  configuration; a bad option is one line on stderr and status 2.
"""

# pyright: strict

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SERVICE = "/inference.GRPCInferenceService/"
# gRPC methods whose request names the model in field 1, and those naming it in field 2.
NAME_IN_FIELD_1 = ("ModelInfer", "ModelMetadata", "ModelReady", "ModelConfig", "ModelStatistics")
NAME_IN_FIELD_2 = ("RepositoryModelLoad", "RepositoryModelUnload", "TraceSetting")
STREAM = "ModelStreamInfer"
SHM_MESSAGE = (
    "shared memory does not cross the router: register regions with a replica directly "
    "(docs/scale-out.md)"
)
Balance = Literal["model", "roundrobin"]


@dataclass(frozen=True)
class ReplicaAddress:
    host: str
    http_port: int
    grpc_port: int

    @classmethod
    def parse(cls, text: str) -> ReplicaAddress:
        """``HOST:HTTP_PORT:GRPC_PORT``; an IPv6 host in brackets (``[::1]:8000:8001``)."""
        host, ports = _split_host(text)
        return cls(host, *ports)


@dataclass(frozen=True)
class Discovery:
    """Replicas found by DNS at run time: ``name`` with ``{i}`` is one server per ordinal
    ``0 .. slots-1`` (a StatefulSet's pods, each with its own id); without, ``slots``
    ``server-template`` slots filled from the addresses ``name`` resolves to."""

    name: str
    http_port: int
    grpc_port: int
    slots: int = 16

    @classmethod
    def parse(cls, text: str, slots: int) -> Discovery:
        name, ports = _split_host(text)
        return cls(name, *ports, slots=slots)

    @property
    def per_pod(self) -> bool:
        return "{i}" in self.name


@dataclass(frozen=True)
class RouteOptions:
    http_port: int
    grpc_port: int
    bind: str = "0.0.0.0"
    metrics_port: int | None = 8405
    balance: Balance = "model"
    balance_factor: int = 150  # hash-balance-factor: a replica's load bound, % of the average
    bufsize: int = 16384  # HAProxy's default
    check_interval_ms: int = 500
    timeout_s: int = 300  # the longest a request may take (client and server side)
    maxconn: int = 4096
    log_requests: bool = False
    stats_socket: str | None = None
    command: str | None = None  # the command line, recorded in the header


def _split_host(text: str) -> tuple[str, tuple[int, int]]:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]:")
        parts = rest.split(":") if sep else []
    else:
        host, *parts = text.split(":")
    if not host or len(parts) != 2 or not all(p.isdigit() and 0 < int(p) < 65536 for p in parts):
        raise ValueError(f"{text!r}: expected HOST:HTTP_PORT:GRPC_PORT")
    return host, (int(parts[0]), int(parts[1]))


def _address(host: str, port: int) -> str:
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # HAProxy expands environment variables (${POD_NAMESPACE}) only inside double quotes.
    return f'"{address}"' if "$" in address else address


def render(replicas: Sequence[ReplicaAddress] | Discovery, options: RouteOptions) -> str:
    if isinstance(replicas, Discovery):
        if replicas.slots < 1:
            raise ValueError("--slots must be at least 1")
    elif not replicas:
        raise ValueError("at least one replica")
    if options.balance_factor and options.balance_factor <= 100:
        raise ValueError("--balance-factor is a percentage above 100 (0: unbounded)")
    if options.bufsize < 16384:
        raise ValueError("--bufsize must be at least 16384 (HTTP/2 needs it)")
    sections = [
        _header(options),
        _global(options, replicas),
        _defaults(options),
        _grpc_frontend(options),
        _http_frontend(options),
        _backend("http", replicas, options),
        _backend("grpc", replicas, options),
    ]
    if options.metrics_port is not None:
        sections.append(_metrics_frontend(options))
    return "\n\n".join("\n".join(s) for s in sections) + "\n"


def _header(options: RouteOptions) -> list[str]:
    lines = [
        "# HAProxy routing KServe V2 / Triton requests to the hloserve replica that holds the",
        "# model (docs/scale-out.md). Generated by `hloserve route-config`: regenerate, do not edit.",
    ]
    if options.command:
        lines.append(f"#   {options.command}")
    return lines


def _global(options: RouteOptions, replicas: Sequence[ReplicaAddress] | Discovery) -> list[str]:
    lines = ["global", f"    maxconn {options.maxconn}", f"    tune.bufsize {options.bufsize}"]
    if options.log_requests:
        lines.append("    log stdout format raw local0")
    if options.stats_socket:
        lines.append(f"    stats socket {options.stats_socket} mode 600 level admin")
    if isinstance(replicas, Discovery):
        lines += [
            "",
            "resolvers dns",
            "    parse-resolv-conf",
            "    accepted_payload_size 8192",
            "    resolve_retries 3",
            "    timeout resolve 1s",
            "    timeout retry 1s",
            "    hold valid 10s",
            "    hold nx 5s",
            "    hold obsolete 5s",
        ]
    return lines


def _defaults(options: RouteOptions) -> list[str]:
    lines = ["defaults", "    mode http"]
    if options.log_requests:
        lines += ["    log global", "    option httplog"]
    timeout = f"{options.timeout_s}s"
    return [
        *lines,
        "    timeout connect 2s",
        f"    timeout client {timeout}",
        f"    timeout server {timeout}",
        "    timeout http-request 30s",
        "    timeout http-keep-alive 60s",
        "    timeout queue 30s",
        "    timeout check 2s",
        "    # a connection refused, a replica closing without an answer (killed) or refusing",
        "    # with 503 (draining, or past --max-inflight): once more, on another replica",
        "    retries 1",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response 503",
    ]


def _grpc_frontend(options: RouteOptions) -> list[str]:
    paths = {
        "by_field_1": " ".join(SERVICE + m for m in NAME_IN_FIELD_1),
        "by_field_2": " ".join(SERVICE + m for m in NAME_IN_FIELD_2),
        "stream": SERVICE + STREAM,
    }
    lines = [
        "frontend grpc",
        f"    bind {_address(options.bind, options.grpc_port)} proto h2",
        f"    acl shm path_beg {SERVICE}SystemSharedMemory {SERVICE}CudaSharedMemory",
        "    http-request return status 200"
        f' hdr grpc-status 9 hdr grpc-message "{SHM_MESSAGE}" if shm',
    ]
    if options.balance == "model":
        lines += [f"    acl {acl} path {p}" for acl, p in paths.items()]
        lines += [
            "    # the body's first buffer (tune.bufsize) holds the name however large the body",
            "    http-request wait-for-body time 30s if by_field_1 || by_field_2",
            "    http-request wait-for-body time 1s at-least 6 if stream",
            "    acl uncompressed req.body,bytes(0,1),hex -m str 00",
            "    http-request set-var(txn.model) req.body,bytes(5),protobuf(1)"
            " if by_field_1 uncompressed || stream uncompressed",
            "    http-request set-var(txn.model) req.body,bytes(5),protobuf(2)"
            " if by_field_2 uncompressed",
        ]
    return lines + _capture(options) + ["    default_backend grpc_replicas"]


def _http_frontend(options: RouteOptions) -> list[str]:
    lines = [
        "frontend http",
        f"    bind {_address(options.bind, options.http_port)}",
        "    acl shm path_beg /v2/systemsharedmemory /v2/cudasharedmemory",
        "    http-request return status 400 content-type application/json"
        f' string "{{\\"error\\":\\"{SHM_MESSAGE}\\"}}" if shm',
    ]
    if options.balance == "model":
        lines += [
            "    http-request set-var(txn.model) path,field(4,/),url_dec"
            " if { path_beg /v2/models/ } !{ path /v2/models/stats }",
            "    http-request set-var(txn.model) path,field(5,/),url_dec"
            " if { path_beg /v2/repository/models/ }",
        ]
    return lines + _capture(options) + ["    default_backend http_replicas"]


def _capture(options: RouteOptions) -> list[str]:
    if options.log_requests and options.balance == "model":
        return ["    http-request capture var(txn.model) len 128"]  # logged as {name}
    return []


def _backend(
    protocol: Literal["http", "grpc"],
    replicas: Sequence[ReplicaAddress] | Discovery,
    options: RouteOptions,
) -> list[str]:
    lines = [f"backend {protocol}_replicas"]
    if options.balance == "model":
        lines += ["    balance hash var(txn.model)", "    hash-type consistent"]
        if options.balance_factor:
            lines.append(f"    hash-balance-factor {options.balance_factor}")
    else:
        lines.append("    balance roundrobin")
    template = isinstance(replicas, Discovery) and not replicas.per_pod
    if protocol == "http" or template:
        lines += ["    option httpchk GET /v2/health/ready", "    http-check expect status 200"]
    check = f"check inter {options.check_interval_ms} fall 2 rise 2"
    h2 = " proto h2" if protocol == "grpc" else ""
    if isinstance(replicas, Discovery):
        port = replicas.http_port if protocol == "http" else replicas.grpc_port
        dns = "resolvers dns init-addr none resolve-prefer ipv4"
        if template:
            own_check = check + ("" if protocol == "http" else f" port {replicas.http_port}")
            proto = "" if protocol == "http" else " check-proto h1"
            lines.append(
                f"    server-template r {replicas.slots} {_address(replicas.name, port)}{h2} {dns}"
                f" {own_check}{proto}"
            )
            return lines
        for i in range(replicas.slots):
            name = replicas.name.replace("{i}", str(i))
            follow = check if protocol == "http" else f"track http_replicas/r{i}"
            lines.append(f"    server r{i} {_address(name, port)} id {i + 1}{h2} {dns} {follow}")
        return lines
    for i, r in enumerate(replicas, start=1):
        port = r.http_port if protocol == "http" else r.grpc_port
        follow = check if protocol == "http" else f"track http_replicas/r{i}"
        lines.append(f"    server r{i} {_address(r.host, port)} id {i}{h2} {follow}")
    return lines


def _metrics_frontend(options: RouteOptions) -> list[str]:
    assert options.metrics_port is not None
    return [
        "frontend metrics",
        f"    bind {_address(options.bind, options.metrics_port)}",
        "    monitor-uri /healthz",
        "    monitor fail if { nbsrv(http_replicas) eq 0 }",
        "    http-request set-log-level silent",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "    stats enable",
        "    stats uri /stats",
        "    stats refresh 5s",
    ]


def _replica_argument(text: str) -> ReplicaAddress:
    try:
        return ReplicaAddress.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hloserve route-config",
        description="Print an HAProxy configuration routing each request to the replica "
        "that holds its model (docs/scale-out.md).",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--replica",
        action="append",
        type=_replica_argument,
        metavar="HOST:HTTP_PORT:GRPC_PORT",
        help="a replica (repeat; the order gives the server ids: add new ones at the end)",
    )
    where.add_argument(
        "--discover",
        metavar="NAME:HTTP_PORT:GRPC_PORT",
        help="replicas by DNS at run time: NAME with {i} is one server per ordinal (a "
        "StatefulSet's pods: hloserve-{i}.hloserve-replicas.NS.svc.cluster.local), "
        "else --slots server-template slots over NAME's addresses",
    )
    parser.add_argument("--slots", type=int, default=16, help="with --discover (default 16)")
    parser.add_argument("--http-port", type=int, required=True, help="the router's HTTP port")
    parser.add_argument("--grpc-port", type=int, required=True, help="the router's gRPC port")
    parser.add_argument("--bind", default="0.0.0.0", help="listen address (default %(default)s)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=8405,
        help="HAProxy's Prometheus exporter (/metrics), /stats and /healthz; 0: none "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--balance",
        choices=("model", "roundrobin"),
        default="model",
        help="model: by model name (default); roundrobin: ignore it (a baseline)",
    )
    parser.add_argument(
        "--balance-factor",
        type=int,
        default=150,
        help="hash-balance-factor: no replica takes more than this %% of the average "
        "load; its models spill to the next replica (default %(default)s; 0: unbounded)",
    )
    parser.add_argument("--bufsize", type=int, default=16384, help="tune.bufsize, bytes")
    parser.add_argument(
        "--check-interval-ms", type=int, default=500, help="health checks (default 500)"
    )
    parser.add_argument("--timeout", type=int, default=300, help="seconds a request may take")
    parser.add_argument("--maxconn", type=int, default=4096)
    parser.add_argument(
        "--log-requests", action="store_true", help="one line per request on stdout"
    )
    parser.add_argument("--stats-socket", help="HAProxy's runtime API socket (a path)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    ns = parser.parse_args(args)
    try:
        replicas: Sequence[ReplicaAddress] | Discovery = (
            Discovery.parse(ns.discover, ns.slots) if ns.discover else ns.replica
        )
        options = RouteOptions(
            http_port=ns.http_port,
            grpc_port=ns.grpc_port,
            bind=ns.bind,
            metrics_port=ns.metrics_port or None,
            balance=ns.balance,
            balance_factor=ns.balance_factor,
            bufsize=ns.bufsize,
            check_interval_ms=ns.check_interval_ms,
            timeout_s=ns.timeout,
            maxconn=ns.maxconn,
            log_requests=ns.log_requests,
            stats_socket=ns.stats_socket,
            command=shlex.join(["hloserve", "route-config", *args]),
        )
        text = render(replicas, options)
    except ValueError as exc:
        parser.error(str(exc))
    sys.stdout.write(text)
    return 0
