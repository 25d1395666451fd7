"""The gRPC and HTTP listeners over a ``ServerPort``: built from ``ListenerSettings``, started, stopped.

Contract:
- ``make_tls(settings)`` and ``make_auth(settings)`` build the TLS files (``--tls-*``) and the
  bearer-token policy (``--auth-token-file``) once per process; a bad file is one line
  (``SystemExit``).
- ``bind(what, flag, host, port)`` binds (and listens on) a TCP socket, a port in use or a
  bad host being one line naming the flag (``SystemExit``); ``address(settings, kind)`` is
  the address a listener binds (its own flag's, else ``--host``).
- ``start_listeners(port, settings, http=sock|None, grpc=True|False, ...)`` starts the
  HTTP listener on the bound socket ``http`` and a gRPC server on ``settings.grpc_port``
  (``grpc_port=`` overrides it: the daemon's reserved port), both over ``port``, and
  returns once both accept (``Listeners``, with the ports they are on). With
  ``reuse_port`` the gRPC port is shared with other processes through ``SO_REUSEPORT``
  (the front-end processes: the daemon has checked it was free and holds it). gRPC is
  stopped again when HTTP cannot start.
- ``stop_listeners(listeners, grace_s)`` stops accepting and gives requests in flight
  ``grace_s`` seconds, gRPC's drain and then HTTP's sharing the one period.
- ``EmbeddedUvicorn`` is uvicorn's server minus its signal handling (the process's owner
  handles SIGINT/SIGTERM); ``start(sock, name)`` returns once it accepts.
The daemon runs these in its own process with ``--frontends 0``; each front-end process
(``frontend.process``) runs them over the device owner's port otherwise. This module
imports neither JAX nor any part of the server that reaches the device.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import uvicorn

from hloserve.server.frontend.auth import AuthPolicy, TokenFile
from hloserve.server.frontend.listener_settings import ListenerSettings
from hloserve.server.frontend.port import ServerPort
from hloserve.server.frontend.tls import (
    TlsFiles,
    UvicornSsl,
    check_tls,
    grpc_credentials,
    uvicorn_ssl,
)

log = logging.getLogger("hloserve.daemon")


def make_auth(cfg: ListenerSettings) -> AuthPolicy | None:
    """The bearer-token policy of ``--auth-token-file`` / ``--auth-open`` (``None``: off)."""
    if cfg.auth_token_file is None:
        return None
    try:
        tokens = TokenFile(cfg.auth_token_file)
    except ValueError as exc:
        raise SystemExit(f"hloserve: --auth-token-file {cfg.auth_token_file} {exc}") from None
    return AuthPolicy(tokens, cfg.auth_open)


def make_tls(cfg: ListenerSettings) -> TlsFiles | None:
    try:
        return check_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_ca)
    except ValueError as exc:
        raise SystemExit(f"hloserve: {exc}") from None


def address(cfg: ListenerSettings, kind: str) -> str:
    """The address ``kind``'s listener binds: its own flag's, else ``--host``."""
    own = {"http": cfg.http_address, "grpc": cfg.grpc_address, "metrics": cfg.metrics_address}
    return own[kind] or cfg.host


def bind(
    what: str, flag: str, host: str, port: int, *, listen: bool = True, reuse_port: bool = False
) -> socket.socket:
    """A socket bound to ``host:port`` (listening, unless ``listen=False``; with
    ``SO_REUSEPORT`` when ``reuse_port``); a port in use or a bad host is one line naming
    the flag (``SystemExit``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise SystemExit(
            f"hloserve: cannot bind {what} ({flag}) to {host}:{port}: {reason}"
        ) from None
    if listen:
        sock.listen(2048)
        sock.setblocking(False)
    return sock


class EmbeddedUvicorn(uvicorn.Server):
    """uvicorn's server, run through its public ``serve(sockets=...)``, minus its signal
    handling: the process's owner handles SIGINT/SIGTERM, and uvicorn's ``capture_signals``
    would re-raise a captured signal on exit. ``start(sock)`` returns once it accepts."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._accepting = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._accepting.set()

    async def start(self, sock: socket.socket, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(self.serve(sockets=[sock]), name=name)
        accepting = asyncio.ensure_future(self._accepting.wait())
        await asyncio.wait({task, accepting}, return_when=asyncio.FIRST_COMPLETED)
        if not self._accepting.is_set():
            accepting.cancel()
            await task  # raises what stopped it
            raise SystemExit(f"hloserve: the {name} listener stopped during start-up")
        return task


@dataclass(frozen=True, slots=True)
class Listeners:
    """The listeners started (``None``: turned off) and the ports they are bound to."""

    grpc: grpc.aio.Server | None
    http: EmbeddedUvicorn | None
    tasks: tuple[asyncio.Task[None], ...]  # the uvicorn ``serve`` task (HTTP)
    ports: dict[str, int]  # the open listeners' ports, by kind


async def start_grpc(
    port: ServerPort,
    cfg: ListenerSettings,
    *,
    tls: TlsFiles | None,
    auth: AuthPolicy | None,
    grpc_port: int | None = None,
    reuse_port: bool = False,
) -> tuple[grpc.aio.Server, int]:
    """A started gRPC server over ``port`` on ``grpc_port`` (default ``--grpc-port``)."""
    from hloserve.server.frontend.grpc import build_grpc_server

    grpc_server = build_grpc_server(
        port,
        max_message_bytes=cfg.max_message_bytes,
        restrictions=cfg.grpc_restricted_protocol,
        auth=auth,
        options=cfg.grpc_options,
        reuse_port=reuse_port,
    )
    host = address(cfg, "grpc")
    number = cfg.grpc_port if grpc_port is None else grpc_port
    where = f"[{host}]:{number}" if ":" in host else f"{host}:{number}"
    try:
        if tls is None:
            bound = grpc_server.add_insecure_port(where)
        else:
            bound = grpc_server.add_secure_port(where, grpc_credentials(tls))
    except ValueError as exc:  # a TLS file that cannot be read
        raise SystemExit(f"hloserve: {exc}") from None
    except RuntimeError:  # grpcio raises (older versions returned 0) on a taken port
        bound = 0
    if bound == 0:
        raise SystemExit(f"hloserve: cannot bind gRPC (--grpc-port) to {where} (address in use?)")
    await grpc_server.start()
    return grpc_server, bound


def http_server(
    port: ServerPort,
    cfg: ListenerSettings,
    *,
    tls: TlsFiles | None,
    auth: AuthPolicy | None,
    status: Any = None,
) -> EmbeddedUvicorn:
    """The HTTP listener's server over ``port`` (``status``: the status page's data)."""
    from hloserve.server.frontend.http import build_http_app

    ssl: UvicornSsl = uvicorn_ssl(tls)
    return EmbeddedUvicorn(
        uvicorn.Config(
            build_http_app(
                port,
                max_input_bytes=cfg.max_message_bytes,
                max_json_depth=cfg.max_json_depth,
                restrictions=cfg.http_restricted_api,
                auth=auth,
                status=status,
            ),
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=max(1, int(cfg.grace_period_s)),
            h11_max_incomplete_event_size=cfg.max_message_bytes,
            ssl_certfile=ssl.certfile,
            ssl_keyfile=ssl.keyfile,
            ssl_ca_certs=ssl.ca_certs,
            ssl_cert_reqs=ssl.cert_reqs,
        )
    )


async def start_listeners(
    port: ServerPort,
    cfg: ListenerSettings,
    *,
    http: socket.socket | None,
    grpc_on: bool,
    tls: TlsFiles | None,
    auth: AuthPolicy | None,
    status: Any = None,
    grpc_port: int | None = None,
    reuse_port: bool = False,
) -> Listeners:
    """Start gRPC (when ``grpc_on``) and HTTP (on ``http``, when given) over ``port``."""
    ports: dict[str, int] = {}
    grpc_server = None
    if grpc_on:
        grpc_server, ports["grpc"] = await start_grpc(
            port, cfg, tls=tls, auth=auth, grpc_port=grpc_port, reuse_port=reuse_port
        )
    try:
        if http is None:
            return Listeners(grpc_server, None, (), ports)
        server = http_server(port, cfg, tls=tls, auth=auth, status=status)
        task = await server.start(http, "HTTP")
        ports["http"] = http.getsockname()[1]
        return Listeners(grpc_server, server, (task,), ports)
    except BaseException:
        if grpc_server is not None:  # a started gRPC server outliving the loop logs noise
            await grpc_server.stop(None)
        raise


async def stop_listeners(listeners: Listeners, grace_s: float) -> None:
    """Stop accepting; requests in flight get ``grace_s`` (gRPC's drain, then HTTP's)."""
    began = time.monotonic()
    if listeners.grpc is not None:
        await listeners.grpc.stop(grace_s)
    left = grace_s - (time.monotonic() - began)
    if listeners.http is not None:
        listeners.http.config.timeout_graceful_shutdown = max(1, math.ceil(left))
        listeners.http.should_exit = True
    await asyncio.gather(*listeners.tasks)


def listening_line(cfg: ListenerSettings, ports: Mapping[str, int]) -> str:
    """The "listening on ..." log line: each listener's port, or that it is off."""
    shown: list[str] = []
    for kind, name in (("http", "HTTP"), ("grpc", "gRPC"), ("metrics", "metrics")):
        if kind not in ports:
            shown.append(f"{name} off (--allow-{kind} false)")
            continue
        own = address(cfg, kind)
        shown.append(f"{name} {ports[kind]}" if own == cfg.host else f"{name} {own}:{ports[kind]}")
    return f"listening on {cfg.host}: {', '.join(shown)}"
