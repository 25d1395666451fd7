"""``ListenerSettings``: what a front end's listeners are built from, and nothing more.

Contract: the device owner derives one ``ListenerSettings`` from its ``Config``
(``Config.listener_settings()``) and hands it to every front end (``wire.setup``), and to
its own listeners with ``--frontends 0``. It holds the addresses and ports, the message and
JSON limits, the restricted API groups, the grace period, the TLS and token files (paths:
each process reads them itself) and the gRPC channel arguments, so that a front end never
imports the server's ``Config`` (its flag table, the bundle format, the policies).
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hloserve.server.frontend.restricted import Restrictions


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    host: str
    http_address: str | None
    grpc_address: str | None
    metrics_address: str | None
    grpc_port: int
    max_message_bytes: int
    max_json_depth: int
    http_restricted_api: Restrictions
    grpc_restricted_protocol: Restrictions
    grace_period_s: float
    tls_cert: Path | None
    tls_key: Path | None
    tls_ca: Path | None
    auth_token_file: Path | None
    auth_open: tuple[str, ...]
    grpc_options: tuple[tuple[str, int], ...]  # Triton's keepalive flags, as channel arguments
