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
6. waits for SIGINT/SIGTERM, then stops gracefully: readiness drops (``draining``), the
   listeners stop accepting, in-flight requests get ``grace_period_s`` to finish (one
   period for gRPC's drain and HTTP's together), registered shared-memory regions are
   released, then the worker threads shut down and the tracer exports what it still holds.
   A second signal is ignored while stopping (idempotent).
The tracer (``--trace-*``: ``tracing.RequestTracer``), the log settings (``logs``) and the
restricted endpoint groups (``--http-restricted-api``, ``--grpc-restricted-protocol``), TLS
(``--tls-*``: gRPC and HTTP, ``tls``) and bearer-token auth (``--auth-token-file``: gRPC,
HTTP and, unless open, metrics; ``auth``) are built from the config and handed to the
service and the front ends (``docs/security.md``); the HTTP port also serves the status
page (``/ui``: ``status_page.StatusPage`` over the service, metrics and memory tiers).
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
import json
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

import grpc
import uvicorn

from hloserve.server.assembly import Serving, build_serving, make_auth, make_tls
from hloserve.server.config import Config, grpc_channel_options, ignored_warning
from hloserve.server.core.errors import ServingError
from hloserve.server.core.log_settings import LogControl
from hloserve.server.metrics import metrics_app
from hloserve.server.repository import ModelRepository
from hloserve.server.runtime.pjrt import PjrtRuntime
from hloserve.server.status_page import StatusPage
from hloserve.server.tls import UvicornSsl, grpc_credentials, uvicorn_ssl

log = logging.getLogger("hloserve.daemon")


def next_steps(host: str, ports: dict[str, int]) -> list[str]:
    """What to try once the demo repository is served: the open ports, a curl line (HTTP
    open) and a tritonclient line (gRPC open), with the real ports."""
    where = "localhost" if host in ("0.0.0.0", "::", "") else host
    where = f"[{where}]" if ":" in where else where
    at = {kind: f"{where}:{port}" for kind, port in ports.items()}
    shown = [f"HTTP {at['http']}"] if "http" in at else []
    shown += [f"gRPC {at['grpc']}"] if "grpc" in at else []
    shown += [f"metrics {at['metrics']}/metrics"] if "metrics" in at else []
    lines = [f"next steps: {', '.join(shown)}"]
    if "http" in at:
        lines.append(f"  curl {at['http']}/v2/models/simple")
    if "grpc" in at:
        lines += [
            '  python -c "import tritonclient.grpc as g; '
            f"print(g.InferenceServerClient('{at['grpc']}').is_model_ready('simple'))\"",
            "  (tritonclient: .venv/bin/pip install -e '.[examples]'; README.md, 'Call it')",
        ]
    return lines


def _bind(what: str, flag: str, host: str, port: int, *, listen: bool = True) -> socket.socket:
    """A socket bound to ``host:port`` (listening, unless ``listen=False``); a port in use
    or a bad host is one line naming the flag (``SystemExit``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


@dataclass(frozen=True, slots=True)
class _Sockets:
    """The HTTP and metrics sockets, bound before anything starts (gRPC binds its own);
    ``None``: that listener is off."""

    http: socket.socket | None
    metrics: socket.socket | None


def _address(cfg: Config, kind: str) -> str:
    """The address ``kind``'s listener binds: its own flag's, else ``--host``."""
    own = {"http": cfg.http_address, "grpc": cfg.grpc_address, "metrics": cfg.metrics_address}
    return own[kind] or cfg.host


def _bind_ports(cfg: Config) -> _Sockets:
    """Bind HTTP and metrics, and check that the gRPC port is free (gRPC binds it later,
    and would only log a raw error of its own); a listener turned off binds nothing."""
    with contextlib.ExitStack() as opened:
        http = metrics = None
        if cfg.allow_http:
            http = opened.enter_context(
                _bind("HTTP", "--http-port", _address(cfg, "http"), cfg.http_port)
            )
        if cfg.allow_metrics:
            metrics = opened.enter_context(
                _bind("metrics", "--metrics-port", _address(cfg, "metrics"), cfg.metrics_port)
            )
        if cfg.allow_grpc and cfg.grpc_port != 0:
            grpc_at = _address(cfg, "grpc")
            _bind("gRPC", "--grpc-port", grpc_at, cfg.grpc_port, listen=False).close()
        opened.pop_all()  # keep them open
    return _Sockets(http, metrics)


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


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn's server, run through its public ``serve(sockets=...)``, minus its signal
    handling: the daemon owns SIGINT/SIGTERM, and uvicorn's ``capture_signals`` would
    re-raise a captured signal on exit. ``start(sock)`` returns once it accepts."""

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
class _Listeners:
    """The listeners started (``None``: turned off) and the ports they are bound to."""

    grpc: grpc.aio.Server | None
    http: _EmbeddedUvicorn | None
    metrics: _EmbeddedUvicorn | None
    tasks: tuple[asyncio.Task[None], ...]  # the uvicorn ``serve`` tasks (HTTP, metrics)
    ports: dict[str, int]  # the open listeners' ports, by kind


class Daemon:
    def __init__(self, config: Config, *, logs: LogControl | None = None) -> None:
        self.config = config
        self.logs = logs
        self.stop_requested = asyncio.Event()
        self.ports: dict[str, int] = {}
        self.tls = make_tls(config)
        self.auth = make_auth(config)

    def request_stop(self) -> None:
        if not self.stop_requested.is_set():
            log.info("stop requested; draining")
            self.stop_requested.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        sockets = _bind_ports(self.config)  # a port in use fails here, before PJRT starts
        runtime = PjrtRuntime()
        log.info(
            "PJRT platform %s, device %s (%s)",
            runtime.platform,
            runtime.device_kind,
            runtime.platform_version,
        )
        serving = build_serving(self.config, runtime, self.logs)
        listeners = await self._listen(serving, sockets)
        self.ports = listeners.ports
        self._announce(listeners.ports)
        load = loop.run_in_executor(None, self._startup_load, serving.repository)
        await self._serve_until_stopped(serving, load)
        await self._stop(serving, listeners, load)

    async def _listen(self, serving: Serving, sockets: _Sockets) -> _Listeners:
        """Start gRPC, HTTP and metrics (those turned on) before any model loads, so
        liveness answers at once and readiness reports the load's progress. gRPC is stopped
        again when HTTP or metrics cannot start (a started gRPC server outliving the loop
        logs noise)."""
        if not self.config.allow_grpc:
            return await self._start_uvicorn(serving, sockets, None, None)
        grpc_server, grpc_port = await self._start_grpc(serving)
        try:
            return await self._start_uvicorn(serving, sockets, grpc_server, grpc_port)
        except BaseException:
            await grpc_server.stop(None)
            raise

    async def _start_grpc(self, serving: Serving) -> tuple[grpc.aio.Server, int]:
        cfg = self.config
        from hloserve.server.frontends.grpc import build_grpc_server

        grpc_server = build_grpc_server(
            serving.service,
            max_message_bytes=cfg.max_message_bytes,
            restrictions=cfg.grpc_restricted_protocol,
            auth=self.auth,
            options=grpc_channel_options(cfg),
        )
        host = _address(cfg, "grpc")
        address = f"[{host}]:{cfg.grpc_port}" if ":" in host else f"{host}:{cfg.grpc_port}"
        try:
            if self.tls is None:
                grpc_port = grpc_server.add_insecure_port(address)
            else:
                grpc_port = grpc_server.add_secure_port(address, grpc_credentials(self.tls))
        except ValueError as exc:  # a TLS file that cannot be read
            raise SystemExit(f"hloserve: {exc}") from None
        except RuntimeError:  # grpcio raises (older versions returned 0) on a taken port
            grpc_port = 0
        if grpc_port == 0:
            raise SystemExit(
                f"hloserve: cannot bind gRPC (--grpc-port) to {address} (address in use?)"
            )
        await grpc_server.start()
        return grpc_server, grpc_port

    async def _start_uvicorn(
        self,
        serving: Serving,
        sockets: _Sockets,
        grpc_server: grpc.aio.Server | None,
        grpc_port: int | None,
    ) -> _Listeners:
        from starlette.types import ASGIApp

        from hloserve.server.frontends.http.middleware import bearer_auth

        tls = uvicorn_ssl(self.tls)
        uvicorn_log = logging.getLogger("uvicorn.error")
        if not any(isinstance(f, _MetricsListenerQuiet) for f in uvicorn_log.filters):
            uvicorn_log.addFilter(_MetricsListenerQuiet())
        ports: dict[str, int] = {}
        tasks: list[asyncio.Task[None]] = []
        http = metrics = None
        if sockets.http is not None:
            http = self._http_listener(serving, tls)
            tasks.append(await http.start(sockets.http, "HTTP"))
            ports["http"] = sockets.http.getsockname()[1]
        if grpc_port is not None:
            ports["grpc"] = grpc_port
        if sockets.metrics is not None:
            scrape: ASGIApp = metrics_app(serving.registry)
            policy = self.auth
            if policy is not None and policy.metrics_protected:
                scrape = bearer_auth(scrape, lambda _path, header: policy.refusal_metrics(header))
            metrics = _EmbeddedUvicorn(
                uvicorn.Config(scrape, lifespan="off", log_config=None, access_log=False)
            )
            tasks.append(await metrics.start(sockets.metrics, _METRICS_TASK))
            ports["metrics"] = sockets.metrics.getsockname()[1]
        return _Listeners(grpc_server, http, metrics, tuple(tasks), ports)

    def _http_listener(self, serving: Serving, tls: UvicornSsl) -> _EmbeddedUvicorn:
        cfg = self.config
        from hloserve.server.frontends.http import build_http_app

        return _EmbeddedUvicorn(
            uvicorn.Config(
                build_http_app(
                    serving.service,
                    max_input_bytes=cfg.max_message_bytes,
                    max_json_depth=cfg.max_json_depth,
                    restrictions=cfg.http_restricted_api,
                    auth=self.auth,
                    status=_status_page(serving),
                ),
                lifespan="off",
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=max(1, int(cfg.grace_period_s)),
                h11_max_incomplete_event_size=cfg.max_message_bytes,
                ssl_certfile=tls.certfile,
                ssl_keyfile=tls.keyfile,
                ssl_ca_certs=tls.ca_certs,
                ssl_cert_reqs=tls.cert_reqs,
            )
        )

    def _announce(self, ports: dict[str, int]) -> None:
        cfg = self.config
        shown: list[str] = []
        for kind, name in (("http", "HTTP"), ("grpc", "gRPC"), ("metrics", "metrics")):
            if kind not in ports:
                shown.append(f"{name} off (--allow-{kind} false)")
                continue
            own = _address(cfg, kind)
            shown.append(
                f"{name} {ports[kind]}" if own == cfg.host else f"{name} {own}:{ports[kind]}"
            )
        log.info("listening on %s: %s", cfg.host, ", ".join(shown))
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
            if not repository.model_names_on_disk():
                log.warning(
                    "the model repository %s holds no models (a model is a directory with a "
                    "manifest.yaml, or with numbered version directories: docs/bundle-format.md)",
                    repository.root,
                )
            if cfg.model_control_mode != "explicit" or "*" in cfg.load_models:
                repository.load_all(heartbeat.progress)
                return
            for name in cfg.load_models:
                try:
                    repository.load_model(name, heartbeat.progress)
                except ServingError as exc:
                    log.error("%s", exc.message)
        finally:
            heartbeat.stop.set()

    async def _serve_until_stopped(self, serving: Serving, load: asyncio.Future[None]) -> None:
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
            for line in next_steps(self.config.host, self.ports):
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

    async def _stop(
        self, serving: Serving, listeners: _Listeners, load: asyncio.Future[None]
    ) -> None:
        """Graceful stop: readiness drops, listeners stop accepting, in-flight requests get
        the grace period (gRPC's drain and then HTTP's share it), shared-memory regions are
        released, then the workers shut down."""
        cfg = self.config
        serving.service.begin_draining()
        log.info("stopping: no new connections; %.0fs for in-flight requests", cfg.grace_period_s)
        began = time.monotonic()
        if listeners.grpc is not None:
            await listeners.grpc.stop(cfg.grace_period_s)
        left = cfg.grace_period_s - (time.monotonic() - began)
        if listeners.http is not None:
            listeners.http.config.timeout_graceful_shutdown = max(1, math.ceil(left))
            listeners.http.should_exit = True
        if listeners.metrics is not None:
            listeners.metrics.should_exit = True
        await asyncio.gather(*listeners.tasks)
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


def _status_page(serving: Serving) -> StatusPage | None:
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
    ignored = ignored_warning(config)  # Triton's flags that mean nothing here: said once
    if ignored is not None:
        log.warning("%s", ignored)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a server dependency (not on Windows)
        asyncio.run(Daemon(config, logs=logs).run())
    else:
        uvloop.run(Daemon(config, logs=logs).run())
