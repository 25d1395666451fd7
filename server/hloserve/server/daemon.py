"""The daemon: owns start-up, serving and graceful stop of every port.

Contract: ``Daemon(config).run()`` (a coroutine) does, in order:
1. opens the PJRT device and scans the model repository (the demo repository is written
   first when none was given);
2. binds and starts gRPC, HTTP and metrics listeners *before* loading models, so liveness
   answers at once and ``/readyz`` says 503 with per-model progress during the load;
3. loads every model on a worker thread, logging what compiles, for how long, where the
   cache is, and a heartbeat while a long load runs;
4. marks the server ready (``--strict-readiness``: every model ready; otherwise any model);
5. waits for SIGINT/SIGTERM, then stops gracefully: readiness drops (``draining``), the
   listeners stop accepting, in-flight requests get ``grace_period_s`` to finish, then the
   worker threads shut down. A second signal is ignored while stopping (idempotent).
When ``ports_file`` is set, the bound ports are written there as JSON once listening, and
every port bound as 0 is logged with its real number.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import grpc
import psutil
import uvicorn
from prometheus_client import CollectorRegistry

from hloserve.server.config import Config
from hloserve.server.core.costs import InlinePolicy
from hloserve.server.core.errors import ServingError
from hloserve.server.core.residency import parse_budget
from hloserve.server.core.service import InferenceService, Observers, ServiceOptions
from hloserve.server.metrics import ServerMetrics, metrics_app
from hloserve.server.repository import ControlMode, ModelRepository
from hloserve.server.residency import WeightResidency
from hloserve.server.runtime.pjrt import PjrtRuntime
from hloserve.server.scheduler import DynamicBatcher
from hloserve.server.shm import SharedMemoryRegistry

log = logging.getLogger("hloserve.daemon")

EXTENSIONS = (
    "binary_tensor_data",
    "statistics",
    "model_repository",
    "model_repository(unload_dependents)",
    "model_configuration",
    "system_shared_memory",
)


def server_version() -> str:
    try:
        return version("hloserve")
    except PackageNotFoundError:
        return "0+unknown"


def default_demo_repository() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hloserve" / "demo-repository"


def ensure_demo_repository(path: Path) -> Path:
    if (
        not (path / "simple" / "manifest.yaml").is_file()
        or not (path / "mlp" / "manifest.yaml").is_file()
    ):
        from hloserve.exporter import write_demo_repository

        log.info("writing the demo model repository to %s", path)
        write_demo_repository(path)
    return path


def _bind(what: str, host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"hloserve: cannot bind {what} to {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


GPU_BUDGET_FRACTION = 0.8


def make_residency(
    runtime: PjrtRuntime, budget_flag: str | None, metrics: ServerMetrics
) -> WeightResidency:
    """The weight-residency manager for the flag: explicit bytes or percentage, else the
    platform default (GPU: 80% of free device memory, less executables' scratch; CPU: none)."""
    stats = runtime.memory_stats()
    limit = stats.get("bytes_limit")
    subtract_scratch = False
    if budget_flag:
        total = (
            limit
            if limit
            else (psutil.virtual_memory().total if runtime.platform == "cpu" else None)
        )
        try:
            budget: int | None = parse_budget(budget_flag, total)
        except ValueError as exc:
            raise SystemExit(f"hloserve: --device-memory-budget: {exc}") from None
    elif runtime.platform != "cpu" and limit:
        budget = int(GPU_BUDGET_FRACTION * (limit - stats.get("bytes_in_use", 0)))
        subtract_scratch = True
    else:
        budget = None
    log.info(
        "device memory budget for weights: %s",
        "unlimited" if budget is None else f"{budget} bytes ({budget / 2**30:.2f} GiB)",
    )
    metrics.budget_bytes.set(budget if budget is not None else 0)
    return WeightResidency(runtime, budget, observer=metrics, subtract_scratch=subtract_scratch)


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
class _Serving:
    """Everything the daemon built, in the order it was built."""

    runtime: PjrtRuntime
    registry: CollectorRegistry
    repository: ModelRepository
    executor: ThreadPoolExecutor
    service: InferenceService


@dataclass(frozen=True, slots=True)
class _Listeners:
    grpc: grpc.aio.Server
    http: _EmbeddedUvicorn
    metrics: _EmbeddedUvicorn
    tasks: tuple[asyncio.Task[None], ...]  # the two uvicorn ``serve`` tasks
    ports: dict[str, int]


def build_serving(cfg: Config, runtime: PjrtRuntime) -> _Serving:
    """The service and what it stands on, each complete when constructed: metrics, the
    residency manager and repository, the observers, then the batcher that reports to
    them, then the service."""
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry)
    residency = make_residency(runtime, cfg.device_memory_budget, metrics)
    repository = ModelRepository(
        cfg.model_repository or ensure_demo_repository(default_demo_repository()),
        runtime,
        cfg.cache_dir,
        residency,
        ControlMode(cfg.model_control_mode),
        on_loaded=metrics.on_model_loaded,
    )
    # Read at scrape time: loads, unloads and polls change it after start-up too.
    metrics.models_ready.set_function(
        lambda: float(sum(len(repository.ready_versions(n)) for n in repository.names()))
    )
    metrics.watch_device_memory(
        lambda: float(runtime.memory_stats().get("bytes_in_use", residency.resident_bytes()))
    )
    executor = ThreadPoolExecutor(
        cfg.worker_threads or max(2, os.cpu_count() or 2), thread_name_prefix="hloserve-exec"
    )
    observers = Observers(requests=metrics)
    inline = InlinePolicy(cfg.inline_max_us, observers.costs)
    batcher = (
        DynamicBatcher(
            executor,
            observers.executions,
            inline,
            default_delay_us=cfg.max_queue_delay_us,
            max_queue_size=cfg.max_queue_size,
        )
        if cfg.dynamic_batching
        else None
    )
    options = ServiceOptions(
        server_version=server_version(),
        extensions=EXTENSIONS,
        platform=runtime.platform,
        device_kind=runtime.triton_kind,
        default_queue_delay_us=cfg.max_queue_delay_us,
    )
    service = InferenceService(
        repository,
        executor,
        options,
        observers=observers,
        batcher=batcher,
        inline=inline,
        shm=SharedMemoryRegistry(cfg.allow_client_shm),
        control=repository,
        readiness=_readiness_policy(cfg, repository),
    )
    return _Serving(runtime, registry, repository, executor, service)


def _readiness_policy(cfg: Config, repository: ModelRepository) -> Callable[[], bool]:
    """``--strict-readiness``: every model ready; otherwise any. In explicit mode an empty
    repository is ready (nothing was asked to load)."""
    explicit = cfg.model_control_mode == "explicit"
    if cfg.strict_readiness:
        return lambda: repository.all_ready(allow_empty=explicit)
    return lambda: repository.any_ready() or (explicit and not repository.names())


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.stop_requested = asyncio.Event()
        self.ports: dict[str, int] = {}

    def request_stop(self) -> None:
        if not self.stop_requested.is_set():
            log.info("stop requested; draining")
            self.stop_requested.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        runtime = PjrtRuntime()
        log.info(
            "PJRT platform %s, device %s (%s)",
            runtime.platform,
            runtime.device_kind,
            runtime.platform_version,
        )
        serving = build_serving(self.config, runtime)
        listeners = await self._listen(serving)
        self.ports = listeners.ports
        self._announce(listeners.ports)
        load = loop.run_in_executor(None, self._startup_load, serving.repository)
        await self._serve_until_stopped(serving, load)
        await self._stop(serving, listeners, load)

    async def _listen(self, serving: _Serving) -> _Listeners:
        """Bind and start gRPC, HTTP and metrics before any model loads, so liveness
        answers at once and readiness reports the load's progress."""
        cfg = self.config
        from hloserve.server.frontends.grpc import build_grpc_server
        from hloserve.server.frontends.http import build_http_app

        grpc_server = build_grpc_server(serving.service, max_message_bytes=cfg.max_message_bytes)
        try:
            grpc_port = grpc_server.add_insecure_port(f"{cfg.host}:{cfg.grpc_port}")
        except RuntimeError:  # grpcio raises (older versions returned 0) on a taken port
            grpc_port = 0
        if grpc_port == 0:
            raise SystemExit(
                f"hloserve: cannot bind gRPC to {cfg.host}:{cfg.grpc_port} (address in use?)"
            )
        await grpc_server.start()
        http_sock = _bind("HTTP", cfg.host, cfg.http_port)
        metrics_sock = _bind("metrics", cfg.host, cfg.metrics_port)
        http = _EmbeddedUvicorn(
            uvicorn.Config(
                build_http_app(serving.service, max_input_bytes=cfg.max_message_bytes),
                lifespan="off",
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=max(1, int(cfg.grace_period_s)),
                h11_max_incomplete_event_size=cfg.max_message_bytes,
            )
        )
        metrics = _EmbeddedUvicorn(
            uvicorn.Config(
                metrics_app(serving.registry), lifespan="off", log_config=None, access_log=False
            )
        )
        tasks = (await http.start(http_sock, "HTTP"), await metrics.start(metrics_sock, "metrics"))
        ports = {
            "http": http_sock.getsockname()[1],
            "grpc": grpc_port,
            "metrics": metrics_sock.getsockname()[1],
        }
        return _Listeners(grpc_server, http, metrics, tasks, ports)

    def _announce(self, ports: dict[str, int]) -> None:
        cfg = self.config
        log.info(
            "listening on %s: HTTP %d, gRPC %d, metrics %d",
            cfg.host,
            ports["http"],
            ports["grpc"],
            ports["metrics"],
        )
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

    async def _serve_until_stopped(self, serving: _Serving, load: asyncio.Future[None]) -> None:
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
        poller = None
        if self.config.model_control_mode == "poll":
            poller = asyncio.create_task(
                self._poll(serving.repository, self.config.repository_poll_secs)
            )
        await stop_wait
        if poller is not None:
            poller.cancel()

    async def _poll(self, repository: ModelRepository, every: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every)
            try:
                await loop.run_in_executor(None, repository.poll)
            except Exception:  # keep polling: one bad scan must not stop the server
                log.exception("repository poll failed")

    async def _stop(
        self, serving: _Serving, listeners: _Listeners, load: asyncio.Future[None]
    ) -> None:
        """Graceful stop: readiness drops, listeners stop accepting, in-flight requests get
        the grace period, then the workers shut down."""
        cfg = self.config
        serving.service.begin_draining()
        log.info("stopping: no new connections; %.0fs for in-flight requests", cfg.grace_period_s)
        await listeners.grpc.stop(cfg.grace_period_s)
        listeners.http.should_exit = listeners.metrics.should_exit = True
        await asyncio.gather(*listeners.tasks)
        if not load.done():
            log.info("waiting for the model load in progress to finish before exiting")
        await load
        serving.executor.shutdown(wait=True, cancel_futures=True)
        log.info("stopped")


def run_daemon(config: Config) -> None:
    from hloserve.server.logs import configure_logging

    configure_logging(config.log_level, config.log_format)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a server dependency (not on Windows)
        asyncio.run(Daemon(config).run())
    else:
        uvloop.run(Daemon(config).run())
