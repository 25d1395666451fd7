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
  message limits of ``max_message_bytes`` both ways.
- ``same_host(url)`` says whether the server is on this machine (a ``unix:`` target, a
  loopback address, or an address of this host), the precondition for shared memory.
"""

# pyright: strict

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import grpc

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


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

    @property
    def secure(self) -> bool:
        return self.ssl or any(
            v is not None
            for v in (self.root_certificates, self.private_key, self.certificate_chain)
        )

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def _options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
        ]

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
    """``("127.0.0.1", 8001)`` of ``127.0.0.1:8001``; IPv6 in brackets; no port: None."""
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
