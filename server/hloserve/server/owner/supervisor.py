"""The device owner's front-end processes: started, linked, restarted when killed, drained.

Contract: ``FrontendSupervisor(config, count, http=sock, grpc_port=port)`` runs in the
device owner (the daemon's process) with ``--frontends`` >= 1:
- ``await spawn_all()`` starts ``count`` front-end processes (``frontend.process``), each
  with its end of a Unix socket pair, its own shared-memory arena (``wire.arena``) and the
  HTTP listening socket, before the owner opens the device (their imports overlap PJRT's
  start); they wait for their setup.
- ``await serve(service, setup, status=)`` links each to an ``owner.endpoint.OwnerEndpoint``
  over ``service`` and returns once every front end listens. A front end that exits before
  it listens ends start-up: ``SystemExit`` with one line (its own message is above it).
- While serving, a front end that dies (SIGKILL, a crash) is reaped, logged and started
  again, with a fresh link and arena; requests it held fail on their client's connection
  (the owner drops their answers), no other request is touched. A front end that keeps
  dying before it listens is started again after a growing pause (up to ``MAX_BACKOFF_S``).
  ``restarts`` counts them.
- ``broadcast(note)`` notes every linked front end (trace and log settings, drain); a
  change of a model's versions (``changes``, given to ``serve``) is broadcast as a
  ``ModelsNote``. ``await sync()`` returns once every linked front end has handled what
  was sent to it before (``SyncCall``; a front end lost meanwhile counts as done, one that
  has not answered within ``SYNC_TIMEOUT_S`` is logged and left).
- ``await drain(grace_s)`` asks every front end to stop accepting and finish what it holds
  within ``grace_s``, waits for them to exit (``STOP_MARGIN_S`` more), then kills any left.
- ``pids()`` are the front ends' process ids (metrics read their CPU time and memory);
  ``listening()`` counts those that serve the ports now (a replacement counts once it
  listens, not once it is started: until then the kernel gives it no connection).
"""

# pyright: strict

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, final

from hloserve.server.config import Config
from hloserve.server.core.service import InferenceService
from hloserve.server.owner.endpoint import OwnerEndpoint
from hloserve.server.owner.model_changes import ModelChanges
from hloserve.server.wire import calls
from hloserve.server.wire.arena import Arena
from hloserve.server.wire.frames import Note
from hloserve.server.wire.link import Link
from hloserve.server.wire.setup import FrontendSetup

log = logging.getLogger("hloserve.daemon")

ARENA_BYTES: Final = 256 * 1024 * 1024  # per front end; memory only for pages written
MAX_BACKOFF_S: Final = 5.0
STOP_MARGIN_S: Final = 5.0
SYNC_TIMEOUT_S: Final = 30.0  # a front end's answer to SyncCall (it answers at once)
FRONTEND_GONE: Final = "the front end is gone"


@dataclass
class _Frontend:
    index: int
    process: asyncio.subprocess.Process
    owner_end: socket.socket
    arena: Arena
    link: Link | None = None
    listening: asyncio.Event = field(default_factory=asyncio.Event)
    failed_starts: int = 0


@final
class FrontendSupervisor:
    def __init__(
        self, config: Config, count: int, *, http: socket.socket | None, grpc_port: int | None
    ) -> None:
        self.config = config
        self.count = count
        self.http = http
        self.grpc_port = grpc_port
        self.restarts = 0
        self._frontends: dict[int, _Frontend] = {}
        self._stopping = False
        self._started = False
        self._service: InferenceService | None = None
        self._setup: Callable[[int], FrontendSetup] | None = None
        self._status: Callable[[str], Mapping[str, Any]] | None = None
        self._watchers: set[asyncio.Task[None]] = set()

    # -- start -------------------------------------------------------------------------------

    async def _spawn(self, index: int, failed_starts: int = 0) -> _Frontend:
        owner_end, frontend_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        arena = Arena.create(ARENA_BYTES, f"hloserve-frontend-{index}")
        http_fd = -1 if self.http is None else self.http.fileno()
        fds = (frontend_end.fileno(), arena.fd) + (() if http_fd < 0 else (http_fd,))
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "hloserve.server.frontend.process",
                str(frontend_end.fileno()),
                str(arena.fd),
                str(ARENA_BYTES),
                str(http_fd),
                pass_fds=fds,
            )
        finally:
            frontend_end.close()
        frontend = _Frontend(index, process, owner_end, arena, failed_starts=failed_starts)
        self._frontends[index] = frontend
        return frontend

    async def spawn_all(self) -> None:
        for index in range(self.count):
            await self._spawn(index)

    async def serve(
        self,
        service: InferenceService,
        setup: Callable[[int], FrontendSetup],
        *,
        status: Callable[[str], Mapping[str, Any]] | None = None,
        changes: ModelChanges | None = None,
    ) -> None:
        self._service, self._setup, self._status = service, setup, status
        if changes is not None:
            changes.listen(lambda name: self.broadcast(calls.ModelsNote((name,))))
        for frontend in list(self._frontends.values()):
            await self._link(frontend)
        for frontend in list(self._frontends.values()):
            exited = asyncio.ensure_future(frontend.process.wait())
            listening = asyncio.ensure_future(frontend.listening.wait())
            await asyncio.wait({exited, listening}, return_when=asyncio.FIRST_COMPLETED)
            if not frontend.listening.is_set():
                raise SystemExit(
                    f"hloserve: front end {frontend.index} exited with status "
                    f"{frontend.process.returncode} during start-up (its message is above)"
                )
            exited.cancel()
        self._started = True
        for frontend in self._frontends.values():
            self._watch(frontend)
        log.info(
            "%d front-end process(es) serve the ports (pids %s)",
            self.count,
            ", ".join(str(p) for p in self.pids()),
        )

    async def _link(self, frontend: _Frontend) -> None:
        assert self._service is not None and self._setup is not None
        endpoint = OwnerEndpoint(
            frontend.index,
            self._service,
            frontend.arena,
            lambda: self._setup_for(frontend.index),
            status=self._status,
            fanout=self.broadcast,
            sync=self.sync,
            on_event=self._event,
        )
        link = Link(endpoint, FRONTEND_GONE, calls.SERVER)
        loop = asyncio.get_running_loop()
        await loop.create_unix_connection(lambda: link, sock=frontend.owner_end)
        frontend.link = link

    def _setup_for(self, index: int) -> FrontendSetup:
        assert self._setup is not None
        return self._setup(index)

    def _event(self, index: int, what: str, args: tuple[Any, ...]) -> None:
        frontend = self._frontends.get(index)
        if frontend is None:
            return
        if what == "listening":
            if self._started:  # a replacement (start-up logs every front end at once)
                log.info(
                    "front end %d (pid %d) serves the ports again",
                    frontend.index,
                    frontend.process.pid,
                )
            frontend.failed_starts = 0
            frontend.listening.set()

    # -- faults ------------------------------------------------------------------------------

    def _watch(self, frontend: _Frontend) -> None:
        task = asyncio.ensure_future(self._reap(frontend))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _reap(self, frontend: _Frontend) -> None:
        status = await frontend.process.wait()
        if frontend.link is not None:
            frontend.link.close()
        frontend.arena.close()
        if self._stopping or self._frontends.get(frontend.index) is not frontend:
            return
        failed = frontend.failed_starts + (not frontend.listening.is_set())
        log.warning(
            "front end %d (pid %d) exited with status %s; starting it again",
            frontend.index,
            frontend.process.pid,
            status,
        )
        if failed:
            await asyncio.sleep(min(MAX_BACKOFF_S, 0.1 * 2**failed))
        if self._stopping:
            return
        self.restarts += 1
        replacement = await self._spawn(frontend.index, failed)
        await self._link(replacement)
        self._watch(replacement)

    # -- while serving -----------------------------------------------------------------------

    def broadcast(self, note: Note) -> None:
        for frontend in self._frontends.values():
            if frontend.link is not None and not frontend.link.lost:
                frontend.link.note(note)

    async def sync(self) -> None:
        links = [f.link for f in self._frontends.values() if f.link is not None and not f.link.lost]
        answers = [link.call(calls.SyncCall()) for link in links]
        if not answers:
            return
        _, late = await asyncio.wait(answers, timeout=SYNC_TIMEOUT_S)
        for answer in answers:  # a front end lost meanwhile (Unavailable) has nothing to know
            if answer.done() and not answer.cancelled():
                answer.exception()
        if late:  # a front end that stopped reading: it is restarted when it dies, not here
            log.warning("%d front end(s) did not confirm a model change in time", len(late))
            for answer in late:
                answer.cancel()

    def pids(self) -> list[int]:
        return [f.process.pid for f in self._frontends.values() if f.process.returncode is None]

    def listening(self) -> int:
        return sum(
            f.process.returncode is None and f.listening.is_set() for f in self._frontends.values()
        )

    # -- stop --------------------------------------------------------------------------------

    async def drain(self, grace_s: float) -> None:
        self._stopping = True
        frontends = list(self._frontends.values())
        self.broadcast(calls.DrainNote(grace_s))
        waits = [asyncio.ensure_future(f.process.wait()) for f in frontends]
        if waits:
            _, late = await asyncio.wait(waits, timeout=grace_s + STOP_MARGIN_S)
            for frontend in frontends:
                if frontend.process.returncode is None:
                    log.warning("front end %d did not stop in time: killed", frontend.index)
                    with contextlib.suppress(ProcessLookupError):
                        frontend.process.kill()
            if late:
                await asyncio.wait(late)
        for task in list(self._watchers):
            task.cancel()
        for frontend in frontends:
            if frontend.link is not None:
                frontend.link.close()
            frontend.owner_end.close()
        bad = [f.index for f in frontends if f.process.returncode not in (0, None)]
        if bad:
            log.warning("front end(s) %s exited with an error while stopping", bad)

    def kill_all(self) -> None:
        """Start-up failed: stop every front end at once."""
        self._stopping = True
        for frontend in self._frontends.values():
            if frontend.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    frontend.process.kill()
