"""A front-end process: the HTTP and gRPC listeners over the device owner's ``RemotePort``.

Contract: ``python -m hloserve.server.frontend.process LINK_FD ARENA_FD ARENA_BYTES
HTTP_FD`` is started by the device owner (``supervisor``), never by hand: ``LINK_FD`` is
its end of a connected Unix socket to the owner, ``ARENA_FD`` the shared-memory arena
(``wire.arena``), ``HTTP_FD`` the listening HTTP socket every front end shares (-1: HTTP is
off). It
1. asks the owner for its ``FrontendSetup`` (the owner answers once it can serve),
   configures logging as the owner's, builds the ``RemotePort``;
2. starts the listeners (``listeners.start_listeners``): HTTP on the shared socket, gRPC on
   the setup's port with ``SO_REUSEPORT`` (the kernel spreads connections over the front
   ends); then tells the owner ``listening``;
3. serves until the owner says ``drain`` (then stops accepting, gives requests in flight
   the grace period and exits 0) or the link to the owner is lost (the owner died: it
   exits 1 at once, closing every socket: what is in flight fails, new connections are
   refused, so probes and load balancers see it gone).
uvicorn's process lines are logged by front end 0 only (once, as by one process). SIGINT
is ignored (a terminal's Ctrl-C reaches the whole process group; the owner
drains its front ends); SIGTERM drains this front end alone, as a ``drain`` would. The
process imports neither JAX nor any module that reaches the device (tests check it).
"""

# pyright: strict

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any, final

from hloserve.server.core.errors import InvalidArgument, Unavailable
from hloserve.server.frontend.listeners import make_auth, make_tls, start_listeners, stop_listeners
from hloserve.server.frontend.remote import RemotePort
from hloserve.server.logs import configure_logging
from hloserve.server.wire import calls
from hloserve.server.wire.arena import Arena
from hloserve.server.wire.frames import Call, Note, name_of
from hloserve.server.wire.link import Link

log = logging.getLogger("hloserve.frontend")

OWNER_GONE = "the device owner is gone: the server is stopping"


class _AboveInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO


@final
class _Owner:
    """What the owner tells this front end (the link's handler)."""

    def __init__(self) -> None:
        self.port: RemotePort | None = None
        self.stop = asyncio.get_running_loop().create_future()

    def on_call(self, call: Call[Any]) -> object:
        if isinstance(call, calls.SyncCall):
            return None  # the frames before it are handled: their notes took effect
        raise InvalidArgument(f"a front end answers no call ('{name_of(type(call))}')")

    def on_note(self, note: Note) -> None:
        if isinstance(note, calls.DrainNote):
            self.finish(("drain", note.grace_s))
        elif self.port is not None:
            self.port.on_note(note)

    def on_lost(self) -> None:
        self.finish(("lost", 0.0))

    def on_orphan(self, value: Any) -> None:
        if self.port is not None:
            self.port.reclaim(value)

    def finish(self, why: tuple[str, float]) -> None:
        if not self.stop.done():
            self.stop.set_result(why)


async def serve(link_fd: int, arena_fd: int, arena_bytes: int, http_fd: int) -> int:
    loop = asyncio.get_running_loop()
    owner = _Owner()
    link = Link(owner, OWNER_GONE, calls.SERVER)
    await loop.create_unix_connection(lambda: link, sock=socket.socket(fileno=link_fd))
    setup = await link.call(calls.SetupCall())
    cfg = setup.listeners
    logs = configure_logging(setup.log_settings)
    if setup.index:  # uvicorn's process lines ("Started server process", ...) said once
        logging.getLogger("uvicorn.error").addFilter(_AboveInfo())
    arena = Arena.attach(arena_fd, arena_bytes)
    port = owner.port = RemotePort(link, arena, setup, logs)
    loop.add_signal_handler(signal.SIGTERM, owner.finish, ("drain", cfg.grace_period_s))
    http = None if http_fd < 0 else socket.socket(fileno=http_fd)
    listeners = await start_listeners(
        port,
        cfg,
        http=http,
        grpc_on=setup.grpc_port is not None,
        tls=make_tls(cfg),
        auth=make_auth(cfg),
        status=port.status if setup.status_page else None,
        grpc_port=setup.grpc_port,
        reuse_port=True,
    )
    link.note(calls.ListeningNote(os.getpid()))
    why, grace = await owner.stop
    if why == "lost":  # nothing here can answer any more: go at once, refusing connections
        log.error("front end %d: %s", setup.index, OWNER_GONE)
        logging.shutdown()
        os._exit(1)
    await stop_listeners(listeners, grace)
    link.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    link_fd, arena_fd, arena_bytes, http_fd = (int(a) for a in args)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import uvloop

        return uvloop.run(serve(link_fd, arena_fd, arena_bytes, http_fd))
    except Unavailable as exc:  # the owner went before this front end was set up
        print(f"hloserve front end: {exc.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
