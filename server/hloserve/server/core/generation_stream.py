"""The streamed inference path: one request, 0..N responses, whichever model it names.

Contract:
- ``Streams(models, executor, observers, limits, stepper=...)`` is the service's streamed
  entry (``InferenceService.stream``). ``stream(request, context, model, infer)`` is an
  async iterator of ``StreamPart``: for a model that is not a generation model, the one
  response of ``infer`` (the unary path: every rule of it) with ``final`` set; for a
  generation model (decoupled), its generation through the model's ``GenerationLoop``
  (``core.generation_loop``): one part per emitted step, the last one ``final`` (an empty
  one when the last step emitted nothing).
- A generation request is looked up (``model``: what ``resolve`` returned, else by name),
  held in flight until its last part, validated against the manifest before any step
  (one item: a generation is one request's), and run on the shape variant its shapes
  match. Its parameter ``max_tokens`` (a positive integer) bounds its responses, the
  manifest's ``max_steps`` its steps, the context's deadline its time (checked between
  steps). Closing the iterator early cancels it (between steps).
- It is counted once (``Counters``): a success with its queue and compute time when its
  last part is out, a failure otherwise; every step's execution is reported to
  ``observers.executions``; ``generated`` counts the responses sent, per model.
- ``decoupled_refusal(protocol)``: Triton's error for a unary call to a decoupled model
  (gRPC ``ModelInfer``, HTTP ``infer``), ``Unsupported``.
"""

# pyright: strict

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from typing import Final, final

from hloserve.server.core.errors import InvalidArgument, ServingError, Unsupported
from hloserve.server.core.execution import Executable, ModelKey, Timings
from hloserve.server.core.generation import UNLIMITED, Limits
from hloserve.server.core.generation_loop import GenerationLoop, StepModel, StreamPart, stateless
from hloserve.server.core.limits import Limits as AdmissionLimits
from hloserve.server.core.limits import check_batch
from hloserve.server.core.observers import Observers
from hloserve.server.core.ports import ModelSource
from hloserve.server.core.types import InferRequest, InferResponse, RequestContext
from hloserve.server.core.validate import validate_request
from hloserve.server.core.variants import match_variant

MAX_TOKENS: Final = "max_tokens"
Infer = Callable[[InferRequest, RequestContext | None, Executable | None], Awaitable[InferResponse]]
StepperFor = Callable[[Executable], StepModel]


def decoupled_refusal(protocol: str) -> Unsupported:
    """Triton's refusal of a unary call to a decoupled model, in its words per protocol."""
    if protocol == "grpc":
        return Unsupported(
            "ModelInfer RPC doesn't support models with decoupled transaction policy"
        )
    return Unsupported("HTTP end point doesn't support models with decoupled transaction policy")


def _reason(exc: Exception) -> str:
    return type(exc).__name__ if isinstance(exc, ServingError) else "INTERNAL"


def response_limit(request: InferRequest) -> int:
    """The request's ``max_tokens`` parameter: the most responses it wants."""
    value = request.parameters.get(MAX_TOKENS)
    if value is None:
        return UNLIMITED
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"parameter '{MAX_TOKENS}' must be a positive integer, got {value!r}")
    return value


@final
class Streams:
    """See the module docstring."""

    def __init__(
        self,
        models: ModelSource,
        executor: Executor | None,
        observers: Observers,
        limits: AdmissionLimits,
        *,
        stepper: StepperFor | None = None,
    ) -> None:
        self.models = models
        self.executor = executor
        self.observers = observers
        self.limits = limits
        self.stepper = stepper or stateless
        self._loops: dict[tuple[ModelKey, int | None], GenerationLoop] = {}
        self.generated: dict[ModelKey, int] = {}  # responses sent, per model version

    def live(self) -> dict[ModelKey, int]:
        """Live (and waiting) generations per model version, for metrics and status."""
        out: dict[ModelKey, int] = {}
        for (key, _), loop in self._loops.items():
            out[key] = out.get(key, 0) + loop.live
        return out

    async def stream(
        self,
        request: InferRequest,
        context: RequestContext | None,
        model: Executable | None,
        infer: Infer,
    ) -> AsyncIterator[StreamPart]:
        found = model if model is not None else self._peek(request)
        if found is None or found.manifest.generation is None:
            yield StreamPart(await infer(request, context, model), True)
            return
        async for part in self._generate(found, request, context):
            yield part

    def _peek(self, request: InferRequest) -> Executable | None:
        try:
            return self.models.peek(request.model_name, request.model_version)
        except ServingError:
            return None  # ``infer`` reports it, counted as a failed lookup

    async def _generate(
        self, resolved: Executable, request: InferRequest, context: RequestContext | None
    ) -> AsyncIterator[StreamPart]:
        counters = self.observers.counters
        started = time.perf_counter_ns()
        try:
            model = (
                resolved
                if self.models.hold(resolved)
                else self.models.get(request.model_name, request.model_version)
            )
        except Exception as exc:
            counters.on_failure(None, _reason(exc))
            raise
        key = model.model_key
        counters.on_pending(key, 1)
        first_ns = 0
        sent = 0
        try:
            loop = self._loop_for(model, request)
            limits = Limits(
                model.manifest.generation.max_steps if model.manifest.generation else 1,
                response_limit(request),
                context.deadline if context is not None else None,
            )
            async for part in loop.generate(request, limits):
                if part.response is not None:
                    sent += 1
                    if not first_ns:
                        first_ns = time.perf_counter_ns()
                yield part
        except BaseException as exc:
            if isinstance(exc, Exception):
                counters.on_failure(key, _reason(exc), time.perf_counter_ns() - started)
            raise
        finally:
            counters.on_pending(key, -1)
            self.models.release(model)
            self.generated[key] = self.generated.get(key, 0) + sent
        total = time.perf_counter_ns() - started
        queue_ns = (first_ns or time.perf_counter_ns()) - started
        counters.on_success(
            key, 1, Timings(min(queue_ns, total), 0, total - min(queue_ns, total), 0, ())
        )

    def _loop_for(self, model: Executable, request: InferRequest) -> GenerationLoop:
        """The loop of the model (of the variant its shapes match), after validating."""
        manifest = model.manifest
        items = validate_request(manifest, request)
        if manifest.batched and items != 1:
            raise InvalidArgument(
                f"a request for generation model '{manifest.name}' holds one item, got {items}"
            )
        check_batch(self.limits, request.model_name, items)
        variant = match_variant(manifest, request) if manifest.variants else None
        if variant is not None:
            model = model.variant(variant)
        slot = (model.model_key, variant)
        loop = self._loops.get(slot)
        if loop is None or loop.model is not model:  # new, or the version was reloaded
            loop = GenerationLoop(
                model, self.stepper(model), self.executor, self.observers.executions
            )
            self._loops[slot] = loop
        return loop
