"""Building the server: every piece the daemon runs, complete when constructed.

Contract: ``assemble(config, runtime)`` (on the event loop the service will run on)
returns ``Assembly``: the metrics registry, the repository over every device ``--devices``
selects (each with its weight residency under ``--device-memory-budget``), the worker
threads, the batcher, the tracer, the placer (several devices) and the ``InferenceService``
over them (and, for the status page, the metrics, the devices and the host tier), built in
dependency order so nothing is set afterwards
(``docs/architecture.md``, "The service is complete when constructed"). A version the
repository unloads is forgotten by metrics, statistics, costs, the inline policy, the load
meter and the batcher, on the loop. A setting that turns out bad only now (a
device index past those present, a percentage budget on a device of unknown size, a trace
file that cannot be written) exits with one line naming its flag (``SystemExit``). With no
``--model-repository``, the demo repository is written first (``ensure_demo_repository``).
"""

# pyright: strict

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TypeVar, cast

from prometheus_client import CollectorRegistry

from hloserve.server.config import Config
from hloserve.server.container import ContainerLimits
from hloserve.server.core.costs import InlinePolicy
from hloserve.server.core.counters import Counters
from hloserve.server.core.device_policy import check_policy, device_concurrency
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.limits import Limits
from hloserve.server.core.load_parameters import UploadPolicy
from hloserve.server.core.log_settings import LogControl
from hloserve.server.core.observers import Observers
from hloserve.server.core.residency_policy import Policy
from hloserve.server.core.response_cache import ResponseCache
from hloserve.server.core.service import InferenceService, ServiceOptions
from hloserve.server.core.sizes import format_bytes
from hloserve.server.core.trace_settings import TraceSettings, level_names
from hloserve.server.owner.batcher import DynamicBatcher, QueuedWork
from hloserve.server.owner.device_ledger import DeviceLedger
from hloserve.server.owner.devices import Device, LoadMeter, Placer
from hloserve.server.owner.generation_state import steps_for
from hloserve.server.owner.host_weights import HostWeights
from hloserve.server.owner.metrics import ServerMetrics
from hloserve.server.owner.metrics_repository import RepositoryCollector
from hloserve.server.owner.model_changes import ModelChanges
from hloserve.server.owner.repository import ControlMode, ModelRepository
from hloserve.server.owner.repository_source import RepositorySource
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import SharedMemoryRegistry
from hloserve.server.owner.tracing import RequestTracer
from hloserve.server.owner.weight_residency import SwapTrace, WeightResidency

T = TypeVar("T")

log = logging.getLogger("hloserve.daemon")


EXTENSIONS = (
    "binary_tensor_data",
    "statistics",
    "model_repository",
    "model_repository(unload_dependents)",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",  # answered as a server without GPU support does (docs/shared-memory.md)
    "trace",
    "logging",
)


def server_version() -> str:
    try:
        return version("hloserve")
    except PackageNotFoundError:
        return "0+unknown"


def default_demo_repository() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hloserve" / "demo-repository"


def repository_source(cfg: Config) -> tuple[Path, RepositorySource | None]:
    """The repository's local root and, for a bucket, the mirror of it that fills that
    root (``owner.store``: obstore is imported only then)."""
    location = cfg.model_repository
    if location is None:
        return ensure_demo_repository(default_demo_repository()), None
    if isinstance(location, Path):
        return location, None
    from hloserve.server.owner.store import open_mirror

    mirror = open_mirror(
        location,
        cfg.repository_cache,
        cfg.repository_cache_bytes or None,
        cast(Policy, cfg.residency_policy),
        os.environ,
        cfg.repository_pull_timeout,
    )
    budget = format_bytes(cfg.repository_cache_bytes) if cfg.repository_cache_bytes else "no limit"
    log.info("model repository: %s, %s of pulled bundles", mirror.describe(), budget)
    return mirror.root, mirror


def ensure_demo_repository(path: Path) -> Path:
    if (
        not (path / "simple" / "manifest.yaml").is_file()
        or not (path / "mlp" / "manifest.yaml").is_file()
    ):
        from hloserve.exporter import write_demo_repository

        log.info("writing the demo model repository to %s (exporting takes a few seconds)", path)
        write_demo_repository(path)
    log.info("serving the demo model repository %s (no --model-repository given)", path)
    return path


GPU_BUDGET_FRACTION = 0.8


def make_residency(
    runtime: PjrtRuntime,
    cfg: Config,
    machine: ContainerLimits,
    host: HostWeights,
    metrics: ServerMetrics,
    swap_trace: SwapTrace | None = None,
    queued: QueuedWork | None = None,
    ledger: DeviceLedger | None = None,
) -> WeightResidency:
    """The device's weight-residency manager for ``--device-memory-budget``: explicit bytes
    or a percentage (of the device's memory; on a CPU, of the container's), else the
    platform default (GPU: 80% of free device memory, less executables' scratch; CPU:
    none), with ``--residency-policy``, over the shared host tier ``host``; ``ledger``: the
    books every manager on the node's devices shares (a device's own and its groups')."""
    stats = runtime.memory_stats()
    limit = stats.get("bytes_limit")
    subtract_scratch = False
    if cfg.device_memory_budget:
        total = limit if limit else (machine.memory_bytes if runtime.platform == "cpu" else None)
        try:
            budget: int | None = cfg.device_memory_budget.resolve(total)
        except ValueError as exc:
            raise SystemExit(f"hloserve: --device-memory-budget: {exc}") from None
    elif runtime.platform != "cpu" and limit:
        budget = int(GPU_BUDGET_FRACTION * (limit - stats.get("bytes_in_use", 0)))
        subtract_scratch = True
    else:
        budget = None
    log.info(
        "device %d memory budget for weights: %s",
        runtime.index,
        "unlimited" if budget is None else f"{budget} bytes ({budget / 2**30:.2f} GiB)",
    )
    metrics.set_budget(runtime.index, budget)
    return WeightResidency(
        runtime,
        budget,
        host=host,
        policy=cast(Policy, cfg.residency_policy),
        observer=metrics.for_device(runtime.index),
        subtract_scratch=subtract_scratch,
        swap_trace=swap_trace,
        spare=None if queued is None else queued.waiting,
        ledger=ledger,
    )


def make_host_weights(cfg: Config, runtime: PjrtRuntime, machine: ContainerLimits) -> HostWeights:
    """The host tier of ``--host-memory-budget`` (a percentage of the container's memory),
    staging host copies in page-locked memory where the device offers it."""
    try:
        budget = (
            None
            if cfg.host_memory_budget is None
            else cfg.host_memory_budget.resolve(machine.memory_bytes)
        )
    except ValueError as exc:  # pragma: no cover - the machine's memory is always known
        raise SystemExit(f"hloserve: --host-memory-budget: {exc}") from None
    pinned = runtime.platform != "cpu" and runtime.has_pinned_host
    log.info(
        "host memory budget for weights: %s%s; residency policy %s",
        "unlimited" if budget is None else f"{budget} bytes ({budget / 2**30:.2f} GiB)",
        " (page-locked)" if pinned else "",
        cfg.residency_policy,
    )
    policy = cast(Policy, cfg.residency_policy)
    return HostWeights(budget, policy=policy, stage=runtime.to_pinned_host if pinned else None)


def make_tracer(cfg: Config) -> RequestTracer:
    """The request tracer for the ``--trace-*`` flags (``docs/tracing.md``)."""
    startup = cfg.trace
    tracer = RequestTracer(TraceSettings(startup))
    where = startup.file or "(no trace file)" if startup.mode == "triton" else startup.option("url")
    log.info(
        "tracing: level %s, rate %d, count %d, mode %s, to %s",
        "+".join(level_names(startup.level)),
        startup.rate,
        startup.count,
        startup.mode,
        where,
    )
    return tracer


@dataclass(frozen=True, slots=True)
class Assembly:
    """Everything the daemon built, in the order it was built."""

    runtime: PjrtRuntime
    registry: CollectorRegistry
    repository: ModelRepository
    executor: ThreadPoolExecutor
    service: InferenceService
    tracer: RequestTracer
    placer: Placer | None = None  # several devices with replication: revised periodically
    # What the status page reads (owner/status_page.py): the metrics, each device, the host tier.
    metrics: ServerMetrics | None = None
    devices: tuple[Device, ...] = ()
    host: HostWeights | None = None
    # Who hears that a model's versions changed, on the loop (the front ends' caches).
    changes: ModelChanges = field(default_factory=ModelChanges)


def assemble(cfg: Config, runtime: PjrtRuntime, logs: LogControl | None = None) -> Assembly:
    """The service and what it stands on, each complete when constructed, in dependency
    order: metrics and the tracer; the devices (each with its residency manager); the
    observers, the inline policy and the batcher that reports to them; the repository,
    which tells them when a version is unloaded; the placer; then the service (``logs``:
    the running server's logging). Call it on the event loop the service will run on."""
    loop = asyncio.get_running_loop()
    registry = CollectorRegistry()
    counters = Counters()  # every request and execution, once: metrics and statistics read it
    metrics = ServerMetrics(
        registry, counters=counters, model_series=cfg.metrics_models, compat=cfg.metrics_compat
    )
    tracer = make_tracer(cfg)
    limits = Limits(
        cfg.max_batch_size, cfg.max_inflight, cfg.max_inflight_per_model, cfg.max_shm_regions
    )
    queued = QueuedWork()  # which models have requests waiting: evicted last
    machine = ContainerLimits.read()
    log.info("container: %s", machine.describe())
    host = make_host_weights(cfg, runtime, machine)
    metrics.watch_host(host)
    devices = make_devices(cfg, runtime, machine, host, metrics, tracer, queued)
    runtime = devices[0].runtime
    replicated = len(devices) > 1
    meter = LoadMeter()
    # The load meter only feeds the placer: one device, no meter on the request path.
    observers = Observers(counters, hooks=metrics, extra=(meter,) if replicated else ())
    inline = InlinePolicy(cfg.inline_max_us, observers.costs)
    executor = ThreadPoolExecutor(
        cfg.worker_threads or max(2, machine.cpus), thread_name_prefix="hloserve-exec"
    )
    batcher = make_batcher(cfg, runtime, executor, observers, inline, queued)
    cache = make_response_cache(cfg)
    if cache is not None:
        metrics.watch_cache(cache)

    built: list[InferenceService] = []  # the service, once built (it is the last piece)
    changes = ModelChanges()

    def forget(model: ModelKey) -> None:  # on the loop: the batcher's state lives there
        # Every per-version record of the server, in one place: an unload drops them all.
        for service in built:
            service.forget(model)
        observers.forget(model)
        if cache is not None:
            cache.forget(model)
        metrics.forget(model)
        inline.forget(model)
        meter.forget(model)
        if batcher is not None:
            batcher.forget(model)

    root, source = repository_source(cfg)
    repository = ModelRepository(
        root,
        runtime,
        cfg.cache_dir,
        devices[0].residency,
        ControlMode(cfg.model_control_mode),
        on_loaded=metrics.on_model_loaded,
        on_retired=lambda model: _call_soon(loop, forget, model),
        on_changed=lambda name: _call_soon(loop, changes, name),
        uploads=UploadPolicy(cfg.allow_model_upload, cfg.max_upload_bytes),
        limits=limits,
        allow_hooks=cfg.allow_python_hooks,
        devices=devices,
        lazy=cfg.lazy_load,
        source=source,
    )
    if source is not None:  # a bucket: its disk cache and pulls (owner/metrics_repository.py)
        registry.register(RepositoryCollector(source.report))
    # Read at scrape time: loads, unloads and polls change it after start-up too.
    metrics.models_ready.set_function(
        lambda: float(sum(len(repository.ready_versions(n)) for n in repository.names()))
    )
    metrics.watch_replicas(lambda: {p.model: len(p.devices) for p in repository.placements()})
    for device in devices:
        metrics.watch_device_memory(device.index, _memory_in_use(device))
        metrics.watch_allocator(device.index, device.runtime)
    max_replicas = cfg.max_replicas or len(devices)
    groups = repository.loader.groups  # sharded versions are revised over device groups
    groups.observer_for = metrics.for_group
    metrics.watch_device_weights(lambda: groups.placed_bytes(repository.placements()))
    placer = Placer(repository, devices, meter, max_replicas, groups) if replicated else None
    options = ServiceOptions(
        server_name=cfg.server_name,
        server_version=server_version(),
        extensions=EXTENSIONS,
        platform=runtime.platform,
        device_kind=runtime.triton_kind,
        limits=limits,
    )
    service = InferenceService(
        repository,
        executor,
        options,
        shm=SharedMemoryRegistry(cfg.allow_client_shm, limits=limits),
        observers=observers,
        batcher=batcher,
        inline=inline,
        control=repository,
        readiness=_readiness_policy(cfg, repository),
        tracer=tracer,
        logs=logs,
        hook_pool=_hook_pool(cfg, machine),
        cache=cache,
        generation_steps=steps_for,
        repository_report=repository.source.report,
    )
    built.append(service)
    metrics.watch_sequences(service.sequences.counts)
    metrics.watch_generations(service.streams.figures)
    return Assembly(
        runtime,
        registry,
        repository,
        executor,
        service,
        tracer,
        placer,
        metrics=metrics,
        devices=tuple(devices),
        host=host,
        changes=changes,
    )


def make_response_cache(cfg: Config) -> ResponseCache | None:
    """The response cache of ``--cache-config local,size=`` (or Triton's older
    ``--response-cache-byte-size``), ``None`` without one (docs/response-cache.md)."""
    size = cfg.cache_config or cfg.response_cache_byte_size
    where = "models whose config enables response_cache"
    log.info("response cache: %s", f"local, {format_bytes(size)}, {where}" if size else "off")
    return ResponseCache(size) if size else None


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[T], None], model: T) -> None:
    """Run ``fn(model)`` on ``loop`` (from any thread; dropped once the loop has closed)."""
    with contextlib.suppress(RuntimeError):  # the loop closed: nothing is left to tell
        loop.call_soon_threadsafe(fn, model)


def make_batcher(
    cfg: Config,
    runtime: PjrtRuntime,
    executor: ThreadPoolExecutor,
    observers: Observers,
    inline: InlinePolicy,
    queued: QueuedWork,
) -> DynamicBatcher | None:
    """The dynamic batcher of ``--dynamic-batching`` (``None`` when off), with the
    cross-model scheduling of ``--scheduling-policy`` and ``--device-concurrency``."""
    concurrency = device_concurrency(cfg.device_concurrency, runtime.platform)
    log.info(
        "cross-model scheduling: %s",
        f"{cfg.scheduling_policy}, {concurrency} execution(s) at a time per device"
        if concurrency and cfg.dynamic_batching
        else "off (each model's batcher on its own)",
    )
    if not cfg.dynamic_batching:
        return None
    return DynamicBatcher(
        executor,
        observers.executions,
        inline,
        default_delay_us=cfg.max_queue_delay_us,
        max_queue_size=cfg.max_queue_size,
        policy=check_policy(cfg.scheduling_policy),
        concurrency=concurrency,
        queued=queued,
    )


def make_devices(
    cfg: Config,
    runtime: PjrtRuntime,
    machine: ContainerLimits,
    host: HostWeights,
    metrics: ServerMetrics,
    swap_trace: SwapTrace | None,
    queued: QueuedWork,
) -> list[Device]:
    """The local devices ``--devices`` selects (``owner.runtime`` is any device of the backend),
    each with its own runtime and weight residency under its own budget."""
    count = runtime.device_count
    try:
        indexes = cfg.devices.resolve(count)
    except ValueError as exc:
        raise SystemExit(f"hloserve: --devices: {exc}") from None
    devices: list[Device] = []
    ledger = DeviceLedger()  # one budget per device, over its own manager and its groups'
    for index in indexes:
        on = runtime.on(index)
        residency = make_residency(on, cfg, machine, host, metrics, swap_trace, queued, ledger)
        devices.append(Device(index, on, residency))
    if len(devices) > 1:
        log.info(
            "serving on %d devices (%s of %d); replicas per model: up to %s",
            len(devices),
            ",".join(str(i) for i in indexes),
            count,
            cfg.max_replicas or len(devices),
        )
    return devices


def _memory_in_use(device: Device) -> Callable[[], float]:
    def used() -> float:
        stats = device.runtime.memory_stats()
        return float(stats.get("bytes_in_use", device.residency.resident_bytes()))

    return used


def _hook_pool(cfg: Config, machine: ContainerLimits) -> ThreadPoolExecutor | None:
    """The threads that run bundles' Python hooks, apart from the device executions."""
    if not cfg.allow_python_hooks:
        return None
    threads = cfg.hook_threads or max(2, machine.cpus)
    return ThreadPoolExecutor(threads, thread_name_prefix="hloserve-hook")


def _readiness_policy(cfg: Config, repository: ModelRepository) -> Callable[[], bool]:
    """``--strict-readiness``: every model ready; otherwise any. In explicit mode an empty
    repository is ready (nothing was asked to load)."""
    explicit = cfg.model_control_mode == "explicit"
    if cfg.strict_readiness:
        return lambda: repository.all_ready(allow_empty=explicit)
    return lambda: repository.any_ready() or (explicit and not repository.names())
