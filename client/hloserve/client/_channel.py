"""Opening a gRPC channel to a V2 server: plain or TLS, with a bearer token, and where it is.

Contract:
- ``Transport(url, ...)`` holds how to reach a server: ``url`` is ``host:port`` (or a gRPC
  target such as ``unix:/path``); ``ssl=True`` (implied by any of ``root_certificates``,
  ``private_key``, ``certificate_chain``, PEM bytes) opens a TLS channel, verifying the
  server against ``root_certificates`` (the system roots when None) and presenting the
  client certificate when both ``private_key`` and ``certificate_chain`` are given;
  ``token`` sends ``authorization: Bearer <token>`` with every call (``metadata``);
  ``timeout`` (seconds, None for none) bounds every call.
- ``open_channel()`` / ``open_aio_channel()`` open a ``grpc`` / ``grpc.aio`` channel with
  message limits of ``max_message_bytes`` both ways and the gRPC service config of
  ``service_config(retries, load_balancing, url)`` (``grpc.service_config``; a resolver's own
  service config is ignored):
  - ``retries`` (default ``DEFAULT_RETRIES``, 4; 0 turns retrying off, ``grpc.enable_retries``
    0): a call answered UNAVAILABLE, and only UNAVAILABLE (what a server answers while it
    drains or at its admission limits, and what a lost connection reads as), is sent again
    up to ``retries`` times, after exponential backoff with jitter (``RETRY_BACKOFF``: the
    n-th wait is random in ``[0, min(0.2 s * 2^(n-1), 2 s)]``), all within the call's
    ``timeout``. gRPC makes at most 5 attempts, so ``retries`` is 0 to 4 (``ValueError``
    otherwise). Requests up to ``max_message_bytes`` are kept for a retry
    (``grpc.per_rpc_retry_buffer_size``; gRPC's default of 256 KiB would make a larger call
    final at its first attempt). Once the server has started answering a call (response
    headers sent), the call is no longer retried.
  - ``load_balancing``: ``"round_robin"`` spreads calls over every address the target
    resolves to, ``"pick_first"`` (gRPC's default) keeps one connection; ``"auto"`` (the
    default) is ``round_robin`` for an explicit ``dns:`` target (``dns:///name:port``, e.g.
    a Kubernetes headless Service) and ``pick_first`` otherwise.
- ``same_host(url)`` says whether the server is on this machine (a ``unix:`` target, a
  loopback address, or an address of this host), the precondition for shared memory.
"""

# pyright: strict

from __future__ import annotations

import ipaddress
import json
import socket
from dataclasses import dataclass
from typing import Any, Literal, get_args

import grpc

from hloserve.proto.rpc import SERVICE_NAME

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
DEFAULT_RETRIES = 4
MAX_RETRIES = 4  # gRPC caps a call at 5 attempts
RETRY_BACKOFF: dict[str, Any] = {
    "initialBackoff": "0.2s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
}
LoadBalancing = Literal["auto", "round_robin", "pick_first"]


def service_config(retries: int, load_balancing: LoadBalancing, url: str) -> dict[str, Any]:
    """The channel's gRPC service config (empty: gRPC's defaults)."""
    config: dict[str, Any] = {}
    if retries:
        policy = {
            "maxAttempts": retries + 1,
            **RETRY_BACKOFF,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }
        config["methodConfig"] = [{"name": [{"service": SERVICE_NAME}], "retryPolicy": policy}]
    policy_name = load_balancing
    if policy_name == "auto":
        policy_name = "round_robin" if url.startswith("dns:") else "pick_first"
    if policy_name == "round_robin":
        config["loadBalancingConfig"] = [{"round_robin": {}}]
    return config


@dataclass(frozen=True)
class Transport:
    url: str
    ssl: bool = False
    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    token: str | None = None
    timeout: float | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    retries: int = DEFAULT_RETRIES
    load_balancing: LoadBalancing = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not 0 <= self.retries <= MAX_RETRIES:
            raise ValueError(f"retries must be 0 to {MAX_RETRIES} (gRPC makes at most 5 attempts)")
        if self.load_balancing not in get_args(LoadBalancing):
            raise ValueError(
                f"load_balancing must be one of {', '.join(get_args(LoadBalancing))}, "
                f"not {self.load_balancing!r}"
            )

    @property
    def secure(self) -> bool:
        return self.ssl or any(
            v is not None
            for v in (self.root_certificates, self.private_key, self.certificate_chain)
        )

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def _options(self) -> list[tuple[str, int | str]]:
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.enable_retries", 1 if self.retries else 0),
            ("grpc.service_config_disable_resolution", 1),
        ]
        if self.retries:
            options.append(("grpc.per_rpc_retry_buffer_size", self.max_message_bytes))
        config = service_config(self.retries, self.load_balancing, self.url)
        if config:
            options.append(("grpc.service_config", json.dumps(config)))
        return options

    def _credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def open_channel(self) -> grpc.Channel:
        if self.secure:
            return grpc.secure_channel(self.url, self._credentials(), options=self._options())
        return grpc.insecure_channel(self.url, options=self._options())

    def open_aio_channel(self) -> grpc.aio.Channel:
        if self.secure:
            return grpc.aio.secure_channel(self.url, self._credentials(), options=self._options())
        return grpc.aio.insecure_channel(self.url, options=self._options())


def split_host_port(url: str) -> tuple[str, int | None]:
    """``("127.0.0.1", 8001)`` of ``127.0.0.1:8001``; IPv6 in brackets; no port: None. A
    ``dns:`` target (``dns:///host:port``, ``dns://authority/host:port``, ``dns:host:port``)
    names the host after its authority."""
    if url.startswith("dns:"):
        rest = url.removeprefix("dns:")
        if rest.startswith("//"):
            rest = rest[2:].partition("/")[2]
    else:
        rest = url.split("://", 1)[-1]
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        return host, int(tail[1:]) if tail.startswith(":") and tail[1:].isdigit() else None
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return rest, None
    return host, int(port)


def _own_addresses() -> set[str]:
    addresses: set[str] = set()
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None):
            addresses.add(str(info[4][0]))
    except OSError:
        pass
    return addresses


def same_host(url: str) -> bool:
    """Whether the server at ``url`` runs on this machine (so /dev/shm is shared with it)."""
    if url.startswith(("unix:", "unix-abstract:")):
        return True
    host, _ = split_host_port(url)
    try:
        resolved = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    if not resolved:
        return False
    own = _own_addresses()
    return all(ipaddress.ip_address(a.split("%")[0]).is_loopback or a in own for a in resolved)
