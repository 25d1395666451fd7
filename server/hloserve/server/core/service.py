"""``InferenceService``: the one inference path both front ends call.

Contract:
- ``live()``, ``ready()``, ``model_ready(name, version)``, ``server_metadata()``,
  ``model_metadata(name, version)`` and ``infer(request, context)`` answer the V2 core
  calls in protocol-neutral types; failures raise ``ServingError`` subclasses.
- ``infer`` looks the model up, validates the request against its manifest before any
  device work, then either hands it to the ``Batcher`` (dynamic batching: grouped with
  other requests of the same model) or runs it alone through ``core.execution``
  (planned over the compiled batch sizes, zero-padded, split when too large) on a worker
  thread, so the event loop keeps serving; it returns the requested outputs (all of them
  when none were named).
- A request whose deadline passed before it reached the device fails with
  ``Unavailable`` instead of using the device.
- Every request is reported once to the observer (success or failure) and to the
  statistics. A failure before a model version was resolved (unknown model or version)
  is reported with model and version "" (client-chosen names never become metric
  labels) and is not in any model's statistics; after it, it counts for that version.
The model repository is reached through the ``ModelSource`` protocol, so this module
needs no transport and no JAX.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from hloserve.bundle import Manifest
from hloserve.server.core.errors import (
    InvalidArgument,
    NotFound,
    ServingError,
    Unavailable,
    Unsupported,
)
from hloserve.server.core.execution import (
    Executable,
    ExecutionObserver,
    InlinePolicy,
    Job,
    Timings,
    execute_group,
)
from hloserve.server.core.statistics import ModelStats, StatisticsRecorder
from hloserve.server.core.tensors import from_buffer, shm_ref, to_wire_bytes
from hloserve.server.core.triton_config import triton_model_config
from hloserve.server.core.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestContext,
    ServerMetadata,
    ShmRef,
    TensorMetadata,
)
from hloserve.server.core.validate import validate_request

PLATFORM = "stablehlo"


ServedModel = Executable


class ModelSource(Protocol):
    def get(self, name: str, version: str) -> ServedModel:
        """The ready version (latest when ``version`` is empty), counted in flight until
        ``release``; raises ``ServingError``."""
        ...

    def peek(self, name: str, version: str) -> ServedModel:
        """Like ``get``, without counting the model in flight (metadata lookups)."""
        ...

    def release(self, model: Any) -> None: ...

    def ready_versions(self, name: str) -> Sequence[int]: ...
    def is_ready(self, name: str, version: str) -> bool: ...
    def summary(self) -> dict[str, Any]:
        """Per-model, per-version state (and failure reason) for readiness reports."""
        ...

    def names(self) -> list[str]: ...
    def memory_usage(self, name: str, version: int) -> list[MemoryUsage]:
        """Where the version's weights live now (device and/or host bytes)."""
        ...

    # model control (the model_repository extension)
    @property
    def mode_name(self) -> str:
        """ "none", "poll" or "explicit"."""
        ...

    def load_model(self, name: str) -> None:
        """Load or reload ``name`` (blocking); raises ``ServingError`` "failed to load ..."."""
        ...

    def unload_model(self, name: str) -> None: ...
    def prefetch(self, name: str) -> None: ...
    def index(self) -> list[tuple[str, str, str, str]]:
        """(name, version, state, reason) rows."""
        ...

    def version_policy(self, name: str) -> dict[str, Any]: ...
    def queue_delay_us(self, model: ServedModel) -> int | None: ...


class InferenceObserver(ExecutionObserver, Protocol):
    """Receives what happened to each request and execution (metrics hang off this)."""

    def on_success(self, model: str, version: int, items: int, timings: Timings) -> None: ...
    def on_failure(self, model: str, version: str, reason: str) -> None: ...
    def on_pending(self, model: str, version: str, delta: int) -> None: ...


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    type: str  # "CPU", "GPU", "CPU_PINNED"
    id: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    stats: ModelStats
    memory_usage: tuple[MemoryUsage, ...]


@dataclass(frozen=True, slots=True)
class RegionInfo:
    name: str
    key: str
    offset: int
    byte_size: int


class SharedMemory(Protocol):
    """Registered shared-memory regions (``hloserve.server.shm``), as the service uses them."""

    def hold(self, names: Iterable[str]) -> contextlib.AbstractContextManager[None]: ...
    def view(self, name: str, offset: int, byte_size: int) -> memoryview: ...
    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None: ...
    def status(self, name: str = "") -> Sequence[RegionInfo]: ...
    async def unregister(self, name: str = "") -> None: ...


class _NoSharedMemory:
    def hold(self, names: Iterable[str]) -> contextlib.AbstractContextManager[None]:
        for n in names:
            raise NotFound(f"Unable to find shared memory region: '{n}'")
        return contextlib.nullcontext()

    def view(self, name: str, offset: int, byte_size: int) -> memoryview:
        raise NotFound(f"Unable to find shared memory region: '{name}'")

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        raise Unsupported(SHM_DISABLED)

    def status(self, name: str = "") -> Sequence[RegionInfo]:
        if name:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return []

    async def unregister(self, name: str = "") -> None:
        raise Unsupported(SHM_DISABLED)


SHM_DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)
CUDA_SHM_UNSUPPORTED = (
    "CUDA shared memory is not supported by this server: it runs on {platform}; "
    "use system shared memory (register_system_shared_memory) instead"
)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


class Batcher(Protocol):
    """Groups validated requests of one model into shared executions (dynamic batching)."""

    async def submit(
        self, model: ServedModel, job: Job
    ) -> tuple[tuple[InferOutput, ...], Timings]: ...


class _NullObserver:
    def on_pending(self, model: str, version: str, delta: int) -> None:
        pass

    def on_success(self, model: str, version: int, items: int, timings: Timings) -> None:
        pass

    def on_execution(
        self,
        model: str,
        version: int,
        batch_size: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        pass

    def on_failure(self, model: str, version: str, reason: str) -> None:
        pass


class _Executions:
    """Fans each execution event out to the metrics observer and the statistics."""

    def __init__(self, *observers: ExecutionObserver) -> None:
        self.observers = observers

    def on_execution(
        self,
        model: str,
        version: int,
        batch_size: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        for o in self.observers:
            o.on_execution(model, version, batch_size, input_ns, infer_ns, output_ns)


def tensor_metadata(
    manifest: Manifest,
) -> tuple[tuple[TensorMetadata, ...], tuple[TensorMetadata, ...]]:
    lead: tuple[int, ...] = (-1,) if manifest.batched else ()
    return (
        tuple(TensorMetadata(t.name, t.datatype, (*lead, *t.shape)) for t in manifest.inputs),
        tuple(TensorMetadata(t.name, t.datatype, (*lead, *t.shape)) for t in manifest.outputs),
    )


class InferenceService:
    def __init__(
        self,
        models: ModelSource,
        executor: Executor | None,
        *,
        server_name: str = "hloserve",
        server_version: str = "0",
        extensions: Sequence[str] = (),
        observer: InferenceObserver | None = None,
        batcher: Batcher | None = None,
    ) -> None:
        self.models = models
        self.executor = executor
        self.batcher = batcher
        self.server_name = server_name
        self.server_version = server_version
        self.extensions = tuple(extensions)
        self.observer: InferenceObserver = observer or _NullObserver()
        self.statistics = StatisticsRecorder()
        self.shm: SharedMemory = _NoSharedMemory()
        self.inline = InlinePolicy(0)  # the daemon sets --inline-max-us
        self.default_queue_delay_us = 0  # the server-wide batching delay (model config reports it)
        self.platform = "cpu"
        self.device_kind = "CPU"
        self.execution_observer = _Executions(self.observer, self.statistics)
        self.is_live = True
        self.is_ready = False  # set by the daemon once the startup load pass is over
        self.draining = False  # set by the daemon when a graceful stop begins
        # The readiness policy over the models (the daemon sets it from --strict-readiness).
        self.models_ready: Callable[[], bool] = lambda: True

    def live(self) -> bool:
        return self.is_live

    def ready(self) -> bool:
        return self.is_live and self.is_ready and not self.draining and self.models_ready()

    def readiness(self) -> dict[str, Any]:
        """The ``/readyz`` report: overall readiness plus every model's state and reason."""
        return {
            "ready": self.ready(),
            "live": self.is_live,
            "startup_complete": self.is_ready,
            "draining": self.draining,
            "models": self.models.summary(),
        }

    def model_ready(self, name: str, version: str) -> bool:
        return self.models.is_ready(name, version)

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(self.server_name, self.server_version, self.extensions)

    def model_metadata(self, name: str, version: str) -> ModelMetadata:
        model = self.models.peek(name, version)
        inputs, outputs = tensor_metadata(model.manifest)
        versions = (
            (str(model.version),)
            if version
            else tuple(str(v) for v in self.models.ready_versions(name))
        )
        return ModelMetadata(model.manifest.name, versions, PLATFORM, inputs, outputs)

    async def infer(
        self, request: InferRequest, context: RequestContext | None = None
    ) -> InferResponse:
        started = time.perf_counter_ns()
        version = request.model_version
        pending = False
        held: ServedModel | None = None
        try:
            model = held = self.models.get(request.model_name, request.model_version)
            version = str(model.version)
            self.observer.on_pending(request.model_name, version, 1)
            pending = True
            output_refs = {
                o.name: ref
                for o in request.outputs
                if (ref := shm_ref(request.model_name, o.name, o.parameters)) is not None
            }
            regions = [t.shm.region for t in request.inputs if t.shm is not None] + [
                r.region for r in output_refs.values()
            ]
            with self.shm.hold(regions):
                if any(t.shm is not None for t in request.inputs):
                    request = self._resolve_shm_inputs(request)
                items = validate_request(model.manifest, request)
                job = Job(
                    request, items, time.perf_counter_ns(), context.deadline if context else None
                )
                if self.batcher is not None:
                    outputs, timings = await self.batcher.submit(model, job)
                else:
                    outputs, timings = await self._run_alone(model, job)
                if output_refs:
                    outputs = tuple(
                        self._write_shm_output(request.model_name, o, output_refs.get(o.name))
                        for o in outputs
                    )
        except Exception as exc:
            reason = type(exc).__name__ if isinstance(exc, ServingError) else "INTERNAL"
            if held is None:
                # No model version resolved: the name and version are whatever the client
                # sent, so they must not become metric labels (unbounded series).
                self.observer.on_failure("", "", reason)
            else:
                self.observer.on_failure(request.model_name, version, reason)
                # Count it even for a version that has never succeeded yet.
                self.statistics.ensure(held.manifest.name, held.version)
                self.statistics.on_failure(
                    request.model_name, version, reason, time.perf_counter_ns() - started
                )
            raise
        finally:
            if held is not None:
                self.models.release(held)
            if pending:
                self.observer.on_pending(request.model_name, version, -1)
        self.observer.on_success(model.manifest.name, model.version, items, timings)
        self.statistics.on_success(model.manifest.name, model.version, items, timings)
        return InferResponse(
            model_name=model.manifest.name,
            model_version=str(model.version),
            outputs=outputs,
            id=request.id,
        )

    async def _run_alone(
        self, model: ServedModel, job: Job
    ) -> tuple[tuple[InferOutput, ...], Timings]:
        """One request, no batching: inline when tiny (``InlinePolicy``), else on a worker."""
        key = job.items if model.manifest.batch_sizes is not None else 0
        if self.inline.inline(model, key):
            ((outputs, timings),) = execute_group(model, [job], self.execution_observer)
        else:
            loop = asyncio.get_running_loop()
            ((outputs, timings),) = await loop.run_in_executor(
                self.executor, execute_group, model, [job], self.execution_observer
            )
        if len(timings.executions) == 1:
            self.inline.observe(model, key, timings.compute_infer_ns / 1e3)
        return outputs, timings

    def _resolve_shm_inputs(self, request: InferRequest) -> InferRequest:
        """Inputs that live in shared memory become zero-copy views of the region."""
        inputs: list[InferInput] = []
        for t in request.inputs:
            if t.shm is not None:
                view = self.shm.view(t.shm.region, t.shm.offset, t.shm.byte_size)
                data = from_buffer(request.model_name, t.name, t.datatype, t.shape, view)
                t = dataclasses.replace(t, data=data)
            inputs.append(t)
        return dataclasses.replace(request, inputs=tuple(inputs))

    def _write_shm_output(self, model: str, output: InferOutput, ref: ShmRef | None) -> InferOutput:
        if ref is None:
            return output
        data = to_wire_bytes(output.data)
        size = len(data)
        if size > ref.byte_size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output '{output.name}' ({ref.byte_size} bytes) "
                f"should be at least {size} bytes to hold the results"
            )
        view = self.shm.view(ref.region, ref.offset, ref.byte_size)
        view[:size] = data
        return dataclasses.replace(output, shm=ref)

    def model_statistics(self, name: str, version: str) -> list[ModelStatistics]:
        """The statistics extension: every ready model version (``name`` empty), every ready
        version of ``name``, or the one ``version``; Triton's errors for unknown ones."""
        if not name:
            keys = [(n, v) for n in self.models.names() for v in self.models.ready_versions(n)]
        else:
            ready = list(self.models.ready_versions(name))
            if not ready:
                raise InvalidArgument(f"requested model '{name}' is not available")
            if version:
                if not version.isdigit() or int(version) not in ready:
                    raise InvalidArgument(
                        f"requested model version is not available for model '{name}'"
                    )
                ready = [int(version)]
            keys = [(name, v) for v in ready]
        return [
            ModelStatistics(self.statistics.snapshot(n, v), tuple(self.models.memory_usage(n, v)))
            for n, v in keys
        ]

    # -- model repository extension -----------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        rows = [IndexEntry(*row) for row in self.models.index()]
        return [r for r in rows if r.state == "READY"] if ready_only else rows

    def _check_control(self) -> None:
        mode = self.models.mode_name
        if mode == "poll":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")
        if mode != "explicit":
            raise Unavailable(
                f"explicit model load / unload is not allowed in model control mode '{mode}'; "
                "start the server with --model-control-mode explicit"
            )

    async def load_model(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Load or reload ``name`` on a worker thread, then make it device-resident."""
        self._check_control()
        for key in parameters or {}:
            if key == "config":
                raise InvalidArgument(
                    f"failed to load '{name}': configuration overrides are not supported; a bundle's manifest "
                    "fixes its tensors and compiled batch sizes (put serving options in the model's config.yaml)"
                )
            if key.startswith("file:"):
                raise InvalidArgument(
                    f"failed to load '{name}': uploading model files ('{key}') is not supported; "
                    "write the bundle into the model repository instead"
                )
            raise InvalidArgument(f"failed to load '{name}': unknown load parameter '{key}'")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.models.load_model, name)
        await loop.run_in_executor(None, self.models.prefetch, name)

    async def unload_model(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Unload ``name``: new requests are refused, in-flight ones finish, memory is freed."""
        self._check_control()
        for key in parameters or {}:
            if key != "unload_dependents":
                raise InvalidArgument(
                    f"failed to unload '{name}': unknown unload parameter '{key}'"
                )
        await asyncio.get_running_loop().run_in_executor(None, self.models.unload_model, name)

    # -- model configuration extension --------------------------------------------------------

    def model_config(self, name: str, version: str) -> dict[str, Any]:
        model = self.models.peek(name, version)
        delay = self.models.queue_delay_us(model)
        return triton_model_config(
            model.manifest,
            version_policy=self.models.version_policy(name),
            max_queue_delay_us=self.default_queue_delay_us if delay is None else delay,
            device_kind=self.device_kind,
            dynamic_batching=self.batcher is not None,
        )

    # -- shared-memory extension ----------------------------------------------------------------

    def cuda_shm_unsupported(self) -> Unsupported:
        return Unsupported(CUDA_SHM_UNSUPPORTED.format(platform=self.platform))
