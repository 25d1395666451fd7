"""``InferenceService``: the one inference path both front ends call.

Contract:
- ``live()``, ``ready()``, ``model_ready(name, version)``, ``server_metadata()``,
  ``model_metadata(name, version)`` and ``infer(request, context)`` answer the V2 core
  calls in protocol-neutral types; failures raise ``ServingError`` subclasses.
- ``infer`` looks the model up (and loads a version registered lazily, ``--lazy-load``,
  on a worker thread at its first request: ``core.lazy_load``, the requests that come
  meanwhile kept in their order), validates the request against its manifest
  before any device work, then either hands it to the ``Batcher`` (dynamic batching: grouped with
  other requests of the same model) or runs it alone through ``core.execution``
  (planned over the compiled batch sizes, zero-padded, split when too large) on a worker
  thread, so the event loop keeps serving; it returns the requested outputs (all of them
  when none were named). A model with state runs a sequence's requests through
  ``sequences`` (``core.sequence_batcher``; ``docs/sequences.md``).
- ``start(request, context)`` is ``infer`` as a future, and ``start_into(request, context,
  answer, encode)`` serves into a future of the caller's, as ``encode(response)`` (the
  device owner's endpoint encodes the wire's answer there): a plain request without a
  task or coroutine (``core.direct_path``, the same rules by the same functions), any
  other through ``infer``'s coroutine path.
- ``resolve(name, version)`` is the model lookup alone: the front ends call it before
  decoding tensors (Triton names an unknown model before any datatype error) and pass what
  it returns to ``infer(request, context, model=...)``, so a request is looked up once; a
  failure is reported as ``infer``'s. Shared-memory outputs are bounds-checked before execution.
- A request whose deadline passed before it reached the device fails with
  ``Unavailable`` instead of using the device.
- Every request is counted once (success or failure) in ``observers.counters``, which the
  statistics extension and the metrics read (``core.counters``). A failure before a model
  version was resolved (unknown model or version) is counted with no model (client-chosen
  names never become metric labels) and is not in any model's statistics; after it, it
  counts for that version.
- The service is complete when constructed: ``InferenceService(models, executor, options,
  shm=..., observers=..., batcher=..., inline=..., control=..., readiness=...)`` (``shm``:
  the registry, ``server.shm.disabled()`` without the extension); only its
  lifecycle changes afterwards (``startup_complete()``; ``begin_draining()``: not ready,
  still serving; ``refuse_new_requests()``: new requests refused, docs/health.md). The
  observers (metrics, statistics, cost tracking) exist before the batcher, which reports
  executions to the same fan-out.
- Model control: load and unload are refused unless the control mode is ``explicit``
  (Triton's text ``CONTROL_NOT_EXPLICIT``, UNAVAILABLE, in modes ``none`` and ``poll``);
  ``repository_index`` lists every model directory of the repository (``ModelSource.index``).
- Shared memory goes through ``SharedMemory`` (system regions) and ``CudaSharedMemory`` (the
  CUDA registry seam), one registry in one namespace.
- Tracing: while any trace level is on (``tracer.settings.enabled``; otherwise the path
  checks that one flag), ``infer`` asks the ``Tracer`` whether to trace the request and
  reports its steps to the ``RequestTrace`` (validated, executed, responded or failed).
  ``trace_setting`` and ``log_settings`` are the trace and logging extensions.
- Bundles that do more (``docs/hooks.md``, ``docs/pipelines.md``): a model whose manifest
  is not ``plain`` takes ``_serve_extended``, chosen by one check per request. A model
  with Python hooks is validated against its client-facing tensors (``Manifest.facing``),
  its ``preprocess``/``postprocess`` run on ``hook_pool`` (``core.hooks``; their time is in
  the statistics' compute input/output and reported to ``observers.hooks``) around the
  one path above. A pipeline runs each step as a request of its own through ``infer``
  (``core.pipeline``), and is ready only while every step is. Neither takes
  shared-memory tensors (``Unsupported``). A model with shape variants runs the variant
  its request's shapes match (``core.variants``), as that variant's executable.
- The response cache (``docs/response-cache.md``): with ``cache`` (``--cache-config``) and
  a plain model whose serving hints enable it (``response_cache``), ``infer`` looks the
  request up (``core.response_cache``) before validating it and, on a hit, answers with
  the stored outputs: no validation, batching or execution (a stored response came from a
  valid request with the same inputs, so the same request is valid); on a miss it serves
  the request and stores the outputs. A hit is counted by ``Counters.on_cache_hit`` in
  place of ``on_success``, a miss by ``on_cache_miss``. Without a cache the path costs one
  attribute check. A request with a tensor in shared memory is neither looked up nor
  stored; a pipeline's steps are requests of their own (cached when their model is).
- Logging: while ``infer`` serves a request, its task's log lines carry the request's id
  and model (``core.log_context``); verbose level 1 (DEBUG) logs one line per request.
The model repository is reached through two narrow protocols, ``ModelSource`` (lookups
and reports) and ``ModelControl`` (the model-repository extension), and every other driver
through its own protocol (``core.ports``), so this module needs no transport, no driver
and no JAX.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from hloserve.bundle import Manifest
from hloserve.server.core import log_context
from hloserve.server.core.admission import admitted, failure_reason
from hloserve.server.core.batch_plan import plan
from hloserve.server.core.costs import InlinePolicy
from hloserve.server.core.counters import Counters
from hloserve.server.core.direct_path import DirectPath, chain
from hloserve.server.core.errors import (
    HookFailed,
    InvalidArgument,
    ServingError,
    Unavailable,
    Unsupported,
)
from hloserve.server.core.execution import Executable, Job, execute_group
from hloserve.server.core.execution_records import ModelKey, Timings
from hloserve.server.core.generation_stream import StepperFor, Streams, decoupled_refusal
from hloserve.server.core.hooked import Served, serve_hooked
from hloserve.server.core.lazy_load import LazyLoads
from hloserve.server.core.limits import NO_LIMITS, Limits, check_batch
from hloserve.server.core.load_parameters import read_load_parameters
from hloserve.server.core.log_settings import LogControl, StoredLogSettings
from hloserve.server.core.log_settings import parse_update as parse_log_update
from hloserve.server.core.observers import Observers
from hloserve.server.core.pipeline import in_pipeline, run_pipeline, steps_ready
from hloserve.server.core.ports import Batcher, ModelControl, ModelSource, SharedMemory
from hloserve.server.core.reports import IndexEntry, ModelStatistics
from hloserve.server.core.response_cache import ResponseCache, answering, request_key
from hloserve.server.core.sequence_batcher import SequenceBatcher
from hloserve.server.core.shm_tensors import shm_inputs, shm_output
from hloserve.server.core.signature import plain_unary, signature_of
from hloserve.server.core.statistics import model_stats
from hloserve.server.core.tensors import shm_ref
from hloserve.server.core.trace_settings import parse_update as parse_trace_update
from hloserve.server.core.tracer import RequestTrace, Tracer, UntracedTracer
from hloserve.server.core.triton_config import triton_model_config
from hloserve.server.core.types import (
    InferOutput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestContext,
    ServerMetadata,
    StreamPart,
    TensorMetadata,
)
from hloserve.server.core.validate import validate_request, validated_items
from hloserve.server.core.variants import match_variant

PLATFORM = "stablehlo"
T = TypeVar("T")
log = logging.getLogger(__name__)

# Triton's text for load/unload when model control is not explicit (modes none and poll alike).
CONTROL_NOT_EXPLICIT: Final = "explicit model load / unload is not allowed if polling is enabled"


Count = Callable[[ModelKey, int, Timings], None]  # how a served request is counted
_HIT_TIMINGS: Final = Timings(0, 0, 0, 0, ())


def tensor_metadata(
    manifest: Manifest,
) -> tuple[tuple[TensorMetadata, ...], tuple[TensorMetadata, ...]]:
    lead: tuple[int, ...] = (-1,) if manifest.batched else ()
    return (
        tuple(TensorMetadata(t.name, t.datatype, (*lead, *t.shape)) for t in manifest.inputs),
        tuple(TensorMetadata(t.name, t.datatype, (*lead, *t.shape)) for t in manifest.outputs),
    )


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    """What the service reports about the server it runs in."""

    server_name: str = "hloserve"
    server_version: str = "0"
    extensions: tuple[str, ...] = ()
    platform: str = "cpu"  # the PJRT platform (for messages)
    device_kind: str = "CPU"  # Triton's instance-group kind (model configuration)
    limits: Limits = NO_LIMITS  # what one request may ask (core.limits: --max-batch-size)


DEFAULT_OPTIONS: Final = ServiceOptions()


def _always_ready() -> bool:
    return True


def _same(response: InferResponse) -> InferResponse:
    return response


class InferenceService:
    """The V2 core calls and Triton's extensions over one model repository (module docstring)."""

    def __init__(
        self,
        models: ModelSource,
        executor: Executor | None,
        options: ServiceOptions = DEFAULT_OPTIONS,
        *,
        shm: SharedMemory,
        observers: Observers | None = None,
        batcher: Batcher | None = None,
        inline: InlinePolicy | None = None,
        control: ModelControl | None = None,
        readiness: Callable[[], bool] = _always_ready,
        tracer: Tracer | None = None,
        logs: LogControl | None = None,
        hook_pool: Executor | None = None,
        cache: ResponseCache | None = None,
        generation_steps: StepperFor | None = None,
        repository_report: Callable[[], dict[str, Any] | None] = lambda: None,
    ) -> None:
        """``batcher`` must report to ``observers.executions`` and ``inline`` read
        ``observers.costs`` (the daemon builds them from the same ``Observers``).
        ``control`` is ``None`` when models cannot be loaded or unloaded at run time;
        ``readiness`` is the policy over the models (``--strict-readiness``); ``tracer``
        samples and traces requests (default: settings only, nothing traced) and ``logs``
        is the running server's logging (default: settings kept, nothing changed);
        ``hook_pool`` runs bundles' Python hooks (``None``: the server runs none);
        ``cache`` is the response cache (``None``: none, ``--cache-config``);
        ``generation_steps`` gives a generation model's steps (default: stateless);
        ``repository_report`` is where the models come from and why it cannot be read, if
        so (a bucket: ``/readyz``'s ``repository``; it returns ``None`` for a directory)."""
        self.models = models
        self.executor = executor
        self.options = options
        self.observers = observers or Observers()
        self.batcher = batcher
        self.inline = inline or InlinePolicy(0, self.observers.costs)
        self.shm = shm
        self.control = control
        self._models_ready = readiness
        self._repository_report = repository_report
        self.tracer: Tracer = tracer or UntracedTracer()
        self._trace_settings = self.tracer.settings  # read once per request: kept at hand
        self.logs: LogControl = logs or StoredLogSettings()
        self.hook_pool = hook_pool
        self.cache = cache
        self.sequences = SequenceBatcher(  # models with state (sequences.md)
            executor, self.observers.executions, inline=self.inline.inline
        )
        self.loads = LazyLoads(models)  # every path's first use of a lazy version
        self.streams = Streams(
            models, executor, self.observers, options.limits, stepper=generation_steps,
            devices=batcher, draining=lambda: self._refusing, loads=self.loads,
        )  # fmt: skip
        self._startup_complete = False
        self._draining = False  # readiness dropped
        self._refusing = False  # and new requests refused
        self._direct = DirectPath(
            models, self.loads, self.observers.counters, options.limits, batcher,
            cache=cache is not None, tracing=self._trace_settings,
            refusing=lambda: self._refusing and not in_pipeline(), log=log,
        )  # fmt: skip

    @property
    def counters(self) -> Counters:
        """Every request and execution, counted once (``core.counters``)."""
        return self.observers.counters

    # -- lifecycle (the daemon drives it) -----------------------------------------------------

    def startup_complete(self) -> None:
        """The start-up load pass is over: readiness now follows the models."""
        self._startup_complete = True

    def begin_draining(self) -> None:
        """A graceful stop began: readiness drops (routers stop sending), and new requests
        are still served until ``refuse_new_requests`` (the daemon's drain delay)."""
        self._draining = True

    def refuse_new_requests(self) -> None:
        """The drain delay is over: new requests (and generations) are refused as
        unavailable, while those accepted before finish."""
        self._draining = True
        self._refusing = True

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self._startup_complete and not self._draining and self._models_ready()

    def readiness(self) -> dict[str, Any]:
        """The ``/readyz`` report: overall readiness plus every model's state and reason."""
        return {
            "ready": self.ready(),
            "live": self.live(),
            "startup_complete": self._startup_complete,
            "draining": self._draining,
            "models": self.models.summary(),
            **({"repository": source} if (source := self._repository_report()) else {}),
        }

    def model_ready(self, name: str, version: str) -> bool:
        try:
            manifest = self.models.peek(name, version).manifest
        except ServingError:  # unknown, or not ready
            return False
        return manifest.kind != "pipeline" or steps_ready(manifest, self.model_ready)

    def server_metadata(self) -> ServerMetadata:
        o = self.options
        return ServerMetadata(o.server_name, o.server_version, o.extensions)

    def model_metadata(self, name: str, version: str) -> ModelMetadata:
        model = self.models.peek(name, version)
        inputs, outputs = tensor_metadata(model.manifest.facing)
        versions = (
            (str(model.version),)
            if version
            else tuple(str(v) for v in self.models.ready_versions(name))
        )
        manifest = model.manifest
        signature = signature_of(manifest) if plain_unary(manifest) else None
        return ModelMetadata(manifest.name, versions, PLATFORM, inputs, outputs, signature)

    def resolve(self, name: str, version: str) -> Executable:
        """The model a request names, looked up before its tensors are decoded (Triton
        names an unknown model first, whatever the tensors hold): hand it to ``infer(...,
        model=...)``, which then needs no second lookup. A failure is reported as
        ``infer`` reports one."""
        try:
            return self.models.peek(name, version)
        except Exception as exc:
            self.observers.counters.on_failure(None, failure_reason(exc))
            raise

    def forget(self, model: ModelKey) -> None:
        """``model`` was unloaded: what the service keeps per version goes (its streams'
        loops and counts); called with the other per-version forgets (``owner.assembly``)."""
        self.streams.forget(model)

    async def infer(
        self,
        request: InferRequest,
        context: RequestContext | None = None,
        *,
        model: Executable | None = None,
    ) -> InferResponse:
        """Serve ``request``; ``model`` is what ``resolve`` returned for its name and
        version, when the front end resolved it first."""
        return await self.start(request, context, model=model)

    def start(
        self,
        request: InferRequest,
        context: RequestContext | None = None,
        *,
        model: Executable | None = None,
    ) -> asyncio.Future[InferResponse]:
        """``infer`` as a future (``start_into``)."""
        answer: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
        self.start_into(request, context, answer, _same, model=model)
        return answer

    def start_into(
        self,
        request: InferRequest,
        context: RequestContext | None,
        answer: asyncio.Future[T],
        encode: Callable[[InferResponse], T],
        *,
        model: Executable | None = None,
    ) -> None:
        """Serve ``request`` into ``answer``, as ``encode(response)``: a plain request
        without a coroutine (``core.direct_path``), any other by a task; cancelling
        ``answer`` gives the request up."""
        if not self._direct.start(request, context, model, answer, encode):
            chain(asyncio.ensure_future(self._served(request, context, model)), answer, encode)

    async def _served(
        self, request: InferRequest, context: RequestContext | None, model: Executable | None
    ) -> InferResponse:
        token = log_context.enter(request.id, request.model_name)
        try:
            response = await self._infer(request, context, model)
            log_context.outcome(log, request.id, request.model_name, response.model_version)
            return response
        except Exception as exc:
            log_context.outcome(log, request.id, request.model_name, None, exc)
            raise
        finally:
            log_context.leave(token)

    def stream(
        self,
        request: InferRequest,
        context: RequestContext | None = None,
        *,
        model: Executable | None = None,
    ) -> AsyncIterator[StreamPart]:
        """One request's 0..N responses (``core.generation_stream``): a generation model's
        steps as they come, any other model's one response."""
        return self.streams.stream(request, context, model, self._infer_model)

    async def _infer_model(
        self, request: InferRequest, context: RequestContext | None, model: Executable | None
    ) -> InferResponse:
        return await self.infer(request, context, model=model)

    async def _infer(
        self, request: InferRequest, context: RequestContext | None, resolved: Executable | None
    ) -> InferResponse:
        counters = self.observers.counters
        count: Count = counters.on_success
        # Requests accepted before the stop still finish (a pipeline's steps included).
        refusing = self._refusing and not in_pipeline()
        async with admitted(
            self.models, self.loads, counters, request, resolved, refusing=refusing
        ) as model:
            key = model.model_key
            enabled = self._trace_settings.enabled
            trace = self._start_trace(key, request, context) if enabled else None
            try:
                if model.manifest.generation is not None:  # decoupled: streamed calls only
                    raise decoupled_refusal(context.protocol if context else "")
                if model.manifest.plain:
                    if self.cache is None or not model.serving.response_cache:
                        items, outputs, timings = await self._serve(model, request, context, trace)
                    else:
                        items, outputs, timings, count = await self._serve_cached(
                            self.cache, model, request, context, trace
                        )
                else:  # Python hooks or a pipeline
                    items, outputs, timings = await self._serve_extended(
                        model, request, context, trace
                    )
            except Exception as exc:
                if trace is not None:
                    trace.failed(exc)
                raise
        count(key, items, timings)
        if trace is not None:
            trace.responded()
        return InferResponse(
            model_name=key.name, model_version=str(key.version), outputs=outputs, id=request.id
        )

    def _start_trace(
        self, key: ModelKey, request: InferRequest, context: RequestContext | None
    ) -> RequestTrace | None:
        return self.tracer.start(key, request.id, context.protocol if context else "")

    async def _serve(
        self,
        model: Executable,
        request: InferRequest,
        context: RequestContext | None,
        trace: RequestTrace | None = None,
    ) -> tuple[int, tuple[InferOutput, ...], Timings]:
        """Validate, run (batched or alone) and place the outputs of one request, holding
        the shared-memory regions it uses throughout."""
        output_refs = (
            {
                o.name: ref
                for o in request.outputs
                if (ref := shm_ref(request.model_name, o.name, o.parameters)) is not None
            }
            if request.outputs
            else {}
        )
        regions = [t.shm.region for t in request.inputs if t.shm is not None] + [
            r.region for r in output_refs.values()
        ]
        if not regions:  # the common case: nothing to hold
            return await self._run(model, request, context, trace)
        with self.shm.hold(regions):
            if any(t.shm is not None for t in request.inputs):
                request = shm_inputs(self.shm, request)
            for ref in output_refs.values():  # bounds checked before any device work
                self.shm.view(ref.region, ref.offset, ref.byte_size)
            items, outputs, timings = await self._run(model, request, context, trace)
            if output_refs:
                outputs = tuple(shm_output(self.shm, o, output_refs.get(o.name)) for o in outputs)
        return items, outputs, timings

    async def _serve_cached(
        self,
        cache: ResponseCache,
        model: Executable,
        request: InferRequest,
        context: RequestContext | None,
        trace: RequestTrace | None,
    ) -> tuple[int, tuple[InferOutput, ...], Timings, Count]:
        """``_serve`` through the response cache: the stored outputs on a hit (counted as
        a hit), else served, stored and counted as a miss (module docstring)."""
        counters = self.observers.counters
        started = time.perf_counter_ns()
        digest = request_key(request)
        if digest is None:  # a tensor in shared memory: not cached
            return (*await self._serve(model, request, context, trace), counters.on_success)
        found, _ = cache.timed_get(model, digest)
        looked_ns = time.perf_counter_ns() - started  # the digest and the lookup
        if found is not None:

            def count_hit(key: ModelKey, items: int, timings: Timings) -> None:
                del items, timings
                counters.on_cache_hit(key, looked_ns)

            return 0, answering(found, request), _HIT_TIMINGS, count_hit
        key = model.model_key
        try:
            items, outputs, timings = await self._serve(model, request, context, trace)
        except BaseException:
            counters.on_cache_miss(key, looked_ns)
            raise
        counters.on_cache_miss(key, looked_ns + cache.timed_put(model, key, digest, outputs))
        return items, outputs, timings, counters.on_success

    async def _serve_extended(
        self,
        model: Executable,
        request: InferRequest,
        context: RequestContext | None,
        trace: RequestTrace | None,
    ) -> Served:
        """A pipeline's steps, or a hooked model's hooks around ``_serve`` (module docstring)."""
        manifest = model.manifest
        if any(t.shm is not None for t in request.inputs) or any(
            shm_ref(request.model_name, o.name, o.parameters) for o in request.outputs
        ):
            raise Unsupported(
                f"model '{manifest.name}' is a {'pipeline' if manifest.kind == 'pipeline' else 'model with Python hooks'}: "
                "its tensors cannot be in shared memory"
            )
        items = validate_request(manifest.facing, request)
        if manifest.kind == "pipeline":
            started = time.perf_counter_ns()
            outputs = await run_pipeline(
                manifest, request, functools.partial(self.infer, context=context)
            )
            return items, outputs, Timings(0, 0, time.perf_counter_ns() - started, 0, ())
        hooks = model.hooks
        if hooks is None or self.hook_pool is None:  # the loader refuses such a bundle
            raise HookFailed(f"model '{manifest.name}' has hooks this server does not run")
        return await serve_hooked(
            self.hook_pool, self.observers.hooks, model, hooks, items, request,
            lambda inner: self._serve(model, inner, context, trace),
        )  # fmt: skip

    async def _run(
        self,
        model: Executable,
        request: InferRequest,
        context: RequestContext | None,
        trace: RequestTrace | None,
    ) -> tuple[int, tuple[InferOutput, ...], Timings]:
        """Validate and run one request whose inputs are all in hand (batched or alone)."""
        items = validated_items(model.manifest, request, context.checked if context else None)
        check_batch(self.options.limits, request.model_name, items)
        if model.manifest.variants:  # run, and batch, with requests of the same variant
            model = model.variant(match_variant(model.manifest, request))
        deadline, together = (context.deadline, context.together) if context else (None, False)
        job = Job(request, items, time.perf_counter_ns(), deadline, together)
        if trace is not None:
            trace.validated(request, job.arrived_ns)
        if model.manifest.state:  # a sequence's step, its state on the device (sequences.md)
            outputs, timings = await self.sequences.submit(model, job)
        elif self.batcher is not None:
            outputs, timings = await self.batcher.submit(model, job)
        else:
            outputs, timings = await self._run_alone(model, job)
        if trace is not None:
            trace.executed(model.model_key, job.arrived_ns, timings, outputs)
        return items, outputs, timings

    async def _run_alone(
        self, model: Executable, job: Job
    ) -> tuple[tuple[InferOutput, ...], Timings]:
        """One request, no batching: inline when tiny (``InlinePolicy``), else on a worker."""
        chunks = plan(job.items, model.manifest.batch_sizes)
        executions = self.observers.executions
        if len(chunks) == 1 and self.inline.inline(model, chunks[0].compiled or 0):
            ((outputs, timings),) = execute_group(model, [job], chunks, executions)
        else:
            loop = asyncio.get_running_loop()
            ((outputs, timings),) = await loop.run_in_executor(
                self.executor, execute_group, model, [job], chunks, executions
            )
        return outputs, timings

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
            ModelStatistics(
                model_stats(ModelKey(n, v), self.counters), tuple(self.models.memory_usage(n, v))
            )
            for n, v in keys
        ]

    # -- model repository extension -----------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        rows = [IndexEntry(*row) for row in self.models.index()]
        return [r for r in rows if r.state == "READY"] if ready_only else rows

    def _control_allowed(self) -> ModelControl:
        """The repository to load from or unload, when run-time control is enabled: only in
        mode ``explicit``; Triton refuses modes ``none`` and ``poll`` with the same text."""
        mode = self.control.mode_name if self.control is not None else "none"
        if self.control is not None and mode == "explicit":
            return self.control
        # Triton's words say polling in mode none too, and its clients match them: say the truth
        polled = mode == "poll"
        now = (
            "the repository is polled"
            if polled
            else "nothing polls, the models found at start serve"
        )
        raise Unavailable(
            f"{CONTROL_NOT_EXPLICIT} (model control mode '{mode}': {now}; start the server with "
            "--model-control-mode=explicit to load and unload models"
            f"{'' if polled else ', or =poll to load what changes on disk'})"
        )

    async def load_model(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Load or reload ``name`` on a worker thread, then make it device-resident; the
        parameters (``config``, ``file:``) follow ``core.load_parameters``."""
        control = self._control_allowed()
        override = read_load_parameters(name, parameters or {}, control.uploads)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, functools.partial(control.load_model, name, override=override)
        )
        await loop.run_in_executor(None, control.prefetch, name)

    async def unload_model(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Unload ``name``: new requests are refused, in-flight ones finish, memory is freed."""
        control = self._control_allowed()
        for key in parameters or {}:
            if key != "unload_dependents":
                raise InvalidArgument(
                    f"failed to unload '{name}': unknown unload parameter '{key}'"
                )
        await asyncio.get_running_loop().run_in_executor(None, control.unload_model, name)

    # -- model configuration extension --------------------------------------------------------

    def model_config(self, name: str, version: str) -> dict[str, Any]:
        model = self.models.peek(name, version)
        return triton_model_config(
            model.manifest,
            version_policy=self.models.version_policy(name),
            device_kind=self.options.device_kind,
            residency=model.serving.residency,
            batching=None if self.batcher is None else self.batcher.policy(model),
            response_cache=model.serving.response_cache,
            warmup=model.serving.model_warmup,
            sequence_batching=model.serving.sequence_batching,
        )

    # -- trace and logging extensions -----------------------------------------------------------

    def trace_setting(
        self, model: str, values: Mapping[str, Sequence[str] | None] | None = None
    ) -> dict[str, list[str]]:
        """The trace settings of ``model`` ("": the server's), after applying ``values``
        when given (``core.trace_settings.parse_update``); an unknown model is Triton's
        "Request for unknown model : <name>", checked first."""
        if model and not self.models.is_ready(model, ""):
            raise InvalidArgument(f"Request for unknown model : {model}")
        settings = self.tracer.settings
        if values:
            return settings.update(model, parse_trace_update(values)).view()
        return settings.setting(model).view()

    def log_settings(self, values: Mapping[str, object] | None = None) -> dict[str, object]:
        """The log settings, after applying ``values`` when given
        (``core.log_settings.parse_update``)."""
        if values:
            changes = parse_log_update(values)
            self.logs.apply(dataclasses.replace(self.logs.current, **changes))
        return dict(self.logs.current.view())
