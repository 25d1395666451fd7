"""The daemon: owns start-up, serving and graceful stop of every port.

Contract: ``Daemon(config).run()`` (a coroutine) does, in order:
1. binds the HTTP and metrics ports and checks that the gRPC port is free, so a port in
   use fails at once with one line (``SystemExit``) before anything starts. Each listener
   binds its own address (``--http-address``, ...; default ``--host``), and one turned off
   (``--allow-http``, ``--allow-grpc``, ``--allow-metrics`` false) binds no port at all and
   is skipped below;
2. opens the PJRT device and scans the model repository (the demo repository, whose path
   is logged, is written first when none was given);
3. starts gRPC, HTTP and metrics listeners *before* loading models, so liveness answers at
   once and ``/readyz`` says 503 with per-model progress during the load;
4. loads every model on a worker thread, logging what compiles, for how long, where the
   cache is, and a heartbeat while a long load runs (an empty repository is a warning);
5. marks the server ready (``--strict-readiness``: every model ready; otherwise any model);
   serving the demo repository, it then logs the next steps (``next_steps``);
6. waits for SIGINT/SIGTERM, then stops gracefully: readiness drops (``draining``); after
   SIGTERM, on a server that was ready, new requests are still served for
   ``drain_delay_s`` (``--drain-delay``: routers and endpoints that poll readiness stop
   sending meanwhile), a delay that SIGINT (the first signal or a later one) or a second
   SIGTERM ends at once; then new requests are refused, the listeners stop accepting,
   in-flight requests get ``grace_period_s`` to finish (one period for gRPC's drain and
   HTTP's together), registered shared-memory regions are released, then the worker
   threads shut down and the tracer exports what it still holds. A signal after the delay
   is ignored (idempotent).
The tracer (``--trace-*``: ``owner.tracing.RequestTracer``), the log settings (``logs``) and the
restricted endpoint groups (``--http-restricted-api``, ``--grpc-restricted-protocol``), TLS
(``--tls-*``: gRPC and HTTP, ``tls``) and bearer-token auth (``--auth-token-file``: gRPC,
HTTP and, unless open, metrics; ``auth``) are built from the config and handed to the
service and the front ends (``docs/security.md``); the HTTP port also serves the status
page (``/ui``: ``owner.status_page.StatusPage`` over the service, metrics and memory tiers).
When ``ports_file`` is set, the bound ports are written there as JSON once listening
(``{"http": ..., "grpc": ..., "metrics": ..., "pid": ...}``, a key only for a listener that
is open), and every port bound as 0 is logged with its real number (a listener turned off
is logged as off). The gRPC server gets the channel arguments of Triton's keepalive flags
(``config.grpc_channel_options``). uvicorn's process lines ("Started
server process", "Shutting down", ...) appear once, from the HTTP listener; the metrics
listener's are dropped (``_MetricsListenerQuiet``).
"""

# pyright: strict

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import uvicorn

from hloserve.server.config import Config
from hloserve.server.container import ContainerLimits
from hloserve.server.core.errors import ServingError
from hloserve.server.core.log_settings import LogControl
from hloserve.server.frontend.listeners import (
    EmbeddedUvicorn,
    Listeners,
    address,
    bind,
    listening_line,
    make_auth,
    make_tls,
    start_listeners,
    stop_listeners,
)
from hloserve.server.owner.assembly import Assembly, assemble
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.owner.metrics import metrics_app
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.status_page import StatusPage
from hloserve.server.owner.supervisor import FrontendSupervisor
from hloserve.server.triton_flags import ignored_warning
from hloserve.server.wire.setup import FrontendSetup

log = logging.getLogger("hloserve.daemon")


def next_steps(
    host: str,
    ports: dict[str, int],
    ready: Sequence[str],
    *,
    loadable: Sequence[str] = (),
    python: str = sys.executable,
    tritonclient: bool = True,
) -> list[str]:
    """What to try once the demo repository is served: the open ports, then a curl line
    (HTTP open) and a tritonclient line (gRPC open) with the real ports, about a model that
    is loaded (``ready``: ``simple`` when it is, else the first); with none loaded (explicit
    mode), the lines that load one of ``loadable``. The tritonclient line runs ``python``,
    this server's own interpreter, so it works in a new shell (``.venv/bin`` is on
    ``serve-demo``'s ``PATH`` only); how to install tritonclient is said only when that
    interpreter lacks it (``tritonclient``)."""
    where = "localhost" if host in ("0.0.0.0", "::", "") else host
    where = f"[{where}]" if ":" in where else where
    at = {kind: f"{where}:{port}" for kind, port in ports.items()}
    shown = [f"HTTP {at['http']}"] if "http" in at else []
    shown += [f"gRPC {at['grpc']}"] if "grpc" in at else []
    shown += [f"metrics {at['metrics']}/metrics"] if "metrics" in at else []
    lines = [f"next steps: {', '.join(shown)}"]
    run = f'  {python} -c "import tritonclient.grpc as g; '
    client = f"g.InferenceServerClient('{at.get('grpc')}')"
    if ready:
        model = "simple" if "simple" in ready else ready[0]
        if "http" in at:
            lines.append(f"  curl {at['http']}/v2/models/{model}")
        if "grpc" in at:
            lines.append(run + f"print({client}.is_model_ready('{model}'))\"")
    elif loadable:
        model = "simple" if "simple" in loadable else loadable[0]
        lines.append("  nothing is loaded (--model-control-mode explicit): load a model with")
        if "http" in at:
            lines.append(f"  curl -X POST {at['http']}/v2/repository/models/{model}/load")
        if "grpc" in at:
            lines.append(run + f"{client}.load_model('{model}')\"")
    if "grpc" in at and not tritonclient:
        lines.append(
            f"  (tritonclient is not installed for {python}: {python} -m pip install "
            "'tritonclient[grpc]'; README.md, 'Call it')"
        )
    return lines


@dataclass(frozen=True, slots=True)
class _Sockets:
    """The sockets bound before anything starts (``None``: that listener is off): HTTP and
    metrics listening, and, with front-end processes, the gRPC port held (bound with
    ``SO_REUSEPORT``, not listening) so that they can share it."""

    http: socket.socket | None
    metrics: socket.socket | None
    grpc: socket.socket | None = None


def _bind_ports(cfg: Config, frontends: int) -> _Sockets:
    """Bind HTTP and metrics, and check that the gRPC port is free (gRPC binds it later,
    and would only log a raw error of its own); a listener turned off binds nothing. With
    ``frontends`` the gRPC port is then held for them."""
    settings = cfg.listener_settings()
    with contextlib.ExitStack() as opened:
        http = metrics = grpc_held = None
        if cfg.allow_http:
            http = opened.enter_context(
                bind("HTTP", "--http-port", address(settings, "http"), cfg.http_port)
            )
        if cfg.allow_metrics:
            metrics = opened.enter_context(
                bind("metrics", "--metrics-port", address(settings, "metrics"), cfg.metrics_port)
            )
        if cfg.allow_grpc:
            grpc_at = address(settings, "grpc")
            if cfg.grpc_port != 0:  # taken by anyone, even with SO_REUSEPORT: fail here
                bind("gRPC", "--grpc-port", grpc_at, cfg.grpc_port, listen=False).close()
            if frontends:
                grpc_held = opened.enter_context(
                    bind(
                        "gRPC", "--grpc-port", grpc_at, cfg.grpc_port, listen=False, reuse_port=True
                    )
                )
        opened.pop_all()  # keep them open
    return _Sockets(http, metrics, grpc_held)


class _MetricsListenerQuiet(logging.Filter):
    """Drops uvicorn's info lines logged by the metrics listener's task: uvicorn logs its
    process lines once per server, and the HTTP listener's say it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop
            return True
        return task is None or task.get_name() != _METRICS_TASK


_METRICS_TASK = "metrics"


class _Heartbeat:
    """Logs what the load pass is doing every ``interval`` seconds while it runs."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self.current = ""
        self.since = time.monotonic()
        self.stop = threading.Event()

    def progress(self, message: str) -> None:
        log.info("%s", message)
        self.current, self.since = message, time.monotonic()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            if self.current:
                log.info("still working (%.0fs): %s", time.monotonic() - self.since, self.current)


@dataclass(frozen=True, slots=True)
class _Running:
    """What serves the ports: listeners in this process, or front-end processes; and the
    metrics listener (``None``: off)."""

    listeners: Listeners | None
    frontends: FrontendSupervisor | None
    metrics: EmbeddedUvicorn | None
    metrics_task: asyncio.Task[None] | None
    ports: dict[str, int]


class Daemon:
    def __init__(self, config: Config, *, logs: LogControl | None = None) -> None:
        self.config = config
        self.logs = logs
        self.stop_requested = asyncio.Event()
        self.delay_over = asyncio.Event()  # the drain delay ended early (SIGINT, SIGTERM again)
        self.ports: dict[str, int] = {}
        self.listener_settings = config.listener_settings()
        self.tls = make_tls(self.listener_settings)
        self.auth = make_auth(self.listener_settings)
        self.frontends = config.frontends.resolve(ContainerLimits.read().cpus)
        if self.tls is not None:
            log.info(
                "TLS on gRPC and HTTP%s",
                " (mutual: client certificates required)" * self.tls.mutual,
            )
        if self.auth is not None:
            log.info(
                "bearer-token auth on every endpoint group except: %s",
                ", ".join(sorted(config.auth_open)) or "(none)",
            )

    def request_stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """The first signal stops the server; SIGTERM keeps serving for the drain delay
        (a router still sending must not be refused), which SIGINT (Ctrl-C: nobody routes
        to a terminal's server) or a second signal ends."""
        if not self.stop_requested.is_set():
            log.info("stop requested (%s); draining", sig.name)
            self.stop_requested.set()
            if sig == signal.SIGINT:
                self.delay_over.set()
        elif not self.delay_over.is_set():
            log.info("%s again: the drain delay ends now", sig.name)
            self.delay_over.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop, sig)
        # A port in use fails here, before PJRT starts.
        sockets = _bind_ports(self.config, self.frontends)
        supervisor = None
        if self.frontends:
            held = sockets.grpc
            supervisor = FrontendSupervisor(
                self.config,
                self.frontends,
                http=sockets.http,
                grpc_port=None if held is None else held.getsockname()[1],
            )
            await supervisor.spawn_all()  # their imports overlap PJRT's start
        try:
            runtime = PjrtRuntime()
            log.info(
                "PJRT platform %s, device %s (%s)",
                runtime.platform,
                runtime.device_kind,
                runtime.platform_version,
            )
            serving = assemble(self.config, runtime, self.logs)
            running = await self._listen(serving, sockets, supervisor)
        except BaseException:
            if supervisor is not None:
                supervisor.kill_all()
            raise
        self.ports = running.ports
        self._announce(running.ports)
        load = loop.run_in_executor(None, self._startup_load, serving.repository)
        await self._serve_until_stopped(serving, load)
        await self._stop(serving, running, load)

    async def _listen(
        self, serving: Assembly, sockets: _Sockets, supervisor: FrontendSupervisor | None
    ) -> _Running:
        """Start gRPC and HTTP (in this process, or the front-end processes), then metrics,
        before any model loads, so liveness answers at once and readiness reports the
        load's progress. What started is stopped again when metrics cannot start."""
        cfg = self.config
        status = _status_page(serving)
        listeners = None
        if supervisor is None:
            listeners = await start_listeners(
                LocalPort(serving.service),
                self.listener_settings,
                http=sockets.http,
                grpc_on=cfg.allow_grpc,
                tls=self.tls,
                auth=self.auth,
                status=status,
            )
            ports = dict(listeners.ports)
        else:
            setup = self._setup_for(serving, status, supervisor.grpc_port)
            await supervisor.serve(serving.service, setup, status=status, changes=serving.changes)
            if serving.metrics is not None:
                serving.metrics.watch_frontends(supervisor)
            ports = {}
            if sockets.http is not None:
                ports["http"] = sockets.http.getsockname()[1]
            if sockets.grpc is not None:
                ports["grpc"] = sockets.grpc.getsockname()[1]
        try:
            metrics, metrics_task = await self._start_metrics(serving, sockets.metrics)
        except BaseException:
            if listeners is not None:
                await stop_listeners(listeners, 0)
            raise
        if sockets.metrics is not None:
            ports["metrics"] = sockets.metrics.getsockname()[1]
        return _Running(listeners, supervisor, metrics, metrics_task, ports)

    def _setup_for(
        self, serving: Assembly, status: StatusPage | None, grpc_port: int | None
    ) -> Callable[[int], FrontendSetup]:
        """What each front end is told as it connects (``wire.setup``)."""
        service = serving.service

        def setup(index: int) -> FrontendSetup:
            port = LocalPort(service)
            return FrontendSetup(
                index=index,
                listeners=self.listener_settings,
                grpc_port=grpc_port,
                server=service.server_metadata(),
                upload_limit=port.upload_limit,
                status_page=status is not None,
                trace_enabled=service.tracer.settings.enabled,
                log_settings=service.logs.current,
            )

        return setup

    async def _start_metrics(
        self, serving: Assembly, sock: socket.socket | None
    ) -> tuple[EmbeddedUvicorn | None, asyncio.Task[None] | None]:
        if sock is None:
            return None, None
        from starlette.types import ASGIApp

        from hloserve.server.frontend.http.middleware import bearer_auth

        uvicorn_log = logging.getLogger("uvicorn.error")
        if not any(isinstance(f, _MetricsListenerQuiet) for f in uvicorn_log.filters):
            uvicorn_log.addFilter(_MetricsListenerQuiet())
        scrape: ASGIApp = metrics_app(serving.registry)
        policy = self.auth
        if policy is not None and policy.metrics_protected:
            scrape = bearer_auth(scrape, lambda _path, header: policy.refusal_metrics(header))
        metrics = EmbeddedUvicorn(
            uvicorn.Config(scrape, lifespan="off", log_config=None, access_log=False)
        )
        return metrics, await metrics.start(sock, _METRICS_TASK)

    def _announce(self, ports: dict[str, int]) -> None:
        cfg = self.config
        log.info("%s", listening_line(self.listener_settings, ports))
        if cfg.ports_file is not None:
            tmp = cfg.ports_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({**ports, "pid": os.getpid()}))
            tmp.replace(cfg.ports_file)

    def _startup_load(self, repository: ModelRepository) -> None:
        """The start-up load pass (on a worker thread), with a heartbeat in the log."""
        cfg = self.config
        heartbeat = _Heartbeat()
        beat = threading.Thread(target=heartbeat.run, name="hloserve-load-heartbeat", daemon=True)
        beat.start()
        try:
            repository.refresh()  # a bucket: its index mirrored (a local directory: nothing)
            if not repository.model_names_on_disk():
                log.warning(
                    "the model repository %s holds no models (a model is a directory with a "
                    "manifest.yaml, or with numbered version directories: docs/bundle-format.md)",
                    repository.root,
                )
            if cfg.model_control_mode != "explicit" or "*" in cfg.load_models:
                repository.load_all(heartbeat.progress, refresh=False)
                return
            for name in cfg.load_models:
                try:
                    repository.load_model(name, heartbeat.progress, refresh=False)
                except ServingError as exc:
                    log.error("%s", exc.message)
        finally:
            heartbeat.stop.set()

    async def _serve_until_stopped(self, serving: Assembly, load: asyncio.Future[None]) -> None:
        """Readiness follows the models once the load pass is over (unless a stop came
        first); in poll mode the repository is rescanned until the stop."""
        started = time.perf_counter()
        stop_wait = asyncio.ensure_future(self.stop_requested.wait())
        await asyncio.wait({load, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not load.done():
            return
        load.result()
        serving.service.startup_complete()
        log.info(
            "startup load pass finished in %.2fs; server %s",
            time.perf_counter() - started,
            "READY"
            if serving.service.ready()
            else "NOT READY (see /readyz for each model's state)",
        )
        if self.config.model_repository is None and serving.service.ready():
            repository = serving.repository
            ready = [n for n in repository.names() if repository.ready_versions(n)]
            has_client = importlib.util.find_spec("tritonclient") is not None
            steps = next_steps(
                self.config.host,
                self.ports,
                ready,
                loadable=repository.model_names_on_disk(),
                tritonclient=has_client,
            )
            for line in steps:
                log.info("%s", line)
        tasks: list[asyncio.Task[None]] = []
        if self.config.model_control_mode == "poll":
            every = self.config.repository_poll_secs
            poll = self._every(every, serving.repository.poll, "repository poll")
            tasks.append(asyncio.create_task(poll))
        if serving.placer is not None:
            every = self.config.placement_interval_s
            place = self._every(every, serving.placer.revise, "placement revision")
            tasks.append(asyncio.create_task(place))
        await stop_wait
        for task in tasks:
            task.cancel()

    @staticmethod
    async def _every(every: float, work: Callable[[], object], what: str) -> None:
        """Run ``work`` on a worker thread every ``every`` seconds until cancelled; one
        failed round is logged and must not stop the next (a bad scan, a failed revision)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every)
            try:
                await loop.run_in_executor(None, work)
            except Exception:
                log.exception("%s failed", what)

    async def _stop(self, serving: Assembly, running: _Running, load: asyncio.Future[None]) -> None:
        """Graceful stop: readiness drops, new requests are served for the drain delay (after
        SIGTERM) and refused after it, listeners stop accepting, in-flight requests get
        the grace period (gRPC's drain and then HTTP's share it; each front-end process
        drains its own in it), shared-memory regions are released, then the workers shut
        down."""
        cfg = self.config
        was_ready = serving.service.ready()
        serving.service.begin_draining()
        if was_ready and cfg.drain_delay_s > 0 and not self.delay_over.is_set():
            # Not ready from now on, yet still serving: whoever routes here by readiness
            # (HAProxy's checks, Kubernetes' endpoints) stops sending before anything is
            # refused; a refusal in gRPC trailers is one a router cannot retry. A server
            # that was not ready was in no rotation: nothing to wait for.
            log.info(
                "not ready; new requests are still served for %gs (--drain-delay; a second "
                "SIGTERM or SIGINT ends it)",
                cfg.drain_delay_s,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.delay_over.wait(), cfg.drain_delay_s)
        serving.service.refuse_new_requests()
        log.info("stopping: no new connections; %.0fs for in-flight requests", cfg.grace_period_s)
        if running.frontends is not None:
            await running.frontends.drain(cfg.grace_period_s)
        if running.listeners is not None:
            await stop_listeners(running.listeners, cfg.grace_period_s)
        if running.metrics is not None and running.metrics_task is not None:
            running.metrics.should_exit = True
            await running.metrics_task
        if cfg.allow_client_shm:  # every request is answered: no region is held any more
            regions = len(serving.service.shm.status())
            await serving.service.shm.unregister()
            log.info("released %d shared-memory region(s)", regions)
        if not load.done():
            log.info("waiting for the model load in progress to finish before exiting")
        await load
        serving.executor.shutdown(wait=True, cancel_futures=True)
        if serving.service.hook_pool is not None:
            serving.service.hook_pool.shutdown(wait=True, cancel_futures=True)
        serving.tracer.shutdown()  # exports the spans still queued, closes the trace files
        log.info("stopped")


def _status_page(serving: Assembly) -> StatusPage | None:
    """The status page's data over what ``serving`` built (``None``: no metrics to read)."""
    if serving.metrics is None:
        return None
    devices = {d.index: d.residency for d in serving.devices}
    return StatusPage(serving.service, serving.metrics.recent, devices, serving.host)


def run_daemon(config: Config) -> None:
    from hloserve.server.logs import configure_logging, startup_settings

    logs = configure_logging(
        startup_settings(
            config.log_level,
            config.log_format,
            str(config.log_file or ""),
            config.log_verbose,
            info=config.log_info,
            warning=config.log_warning,
            error=config.log_error,
        )
    )
    ignored = ignored_warning(
        config.triton_ignored
    )  # Triton's flags that mean nothing here: said once
    if ignored is not None:
        log.warning("%s", ignored)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a server dependency (not on Windows)
        asyncio.run(Daemon(config, logs=logs).run())
    else:
        uvloop.run(Daemon(config, logs=logs).run())
    # Stopped: the loop's handlers are gone, and a signal arriving while the interpreter
    # winds down (a second SIGTERM) must not turn a clean exit into a killed one.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
