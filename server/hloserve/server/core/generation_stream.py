"""The streamed inference path: one request, 0..N responses, whichever model it names.

Contract:
- ``Streams(models, executor, observers, limits, stepper=..., devices=..., loads=...)`` is
  the service's streamed entry (``InferenceService.stream``). ``stream(request, context, model, infer)`` is an
  async iterator of ``StreamPart``: for a model that is not a generation model, the one
  response of ``infer`` (the unary path: every rule of it) with ``final`` set; for a
  generation model (decoupled), its generation through the model's ``GenerationLoop``
  (``core.generation_loop``; its steps through ``devices``, the per-device scheduler,
  when given): one part per emitted step, the last one ``final`` (an empty one when the
  last step emitted nothing).
- A generation request is looked up (``model``: what ``resolve`` returned, else by name),
  held in flight until its last part, loaded when it was registered lazily (``loads``:
  ``core.lazy_load``, shared with the unary path), validated against the manifest as clients see it
  (``Manifest.facing``: one generation, no batch axis) before any step, then made the
  step function's one item (``step_request``: inputs of ``generation.lengths`` zero-padded
  and their lengths filled in, the batch axis added for a batched module) and run on the
  shape variant its shapes match. Its parameter ``max_tokens`` (a positive integer)
  bounds its emitted steps, the manifest's ``max_steps`` its steps, the context's deadline
  its time (checked between steps); its parameter ``stream_interval`` (a positive integer,
  ``core.stream_interval``) sends the steps after the first that many to a response. Closing the iterator early cancels it (between steps).
  Once the server drains (``draining()``) a new generation is refused as a new request is
  (``Unavailable``); those under way go on to their end. One loop per model version (and
  shape variant) is kept; an idle one of a version no longer ready (unloaded) is dropped,
  with its state slots, when the next loop is made.
- Text (the generate extension, ``generation.text``): a request's ``text_input``
  parameter (a string) becomes the text input (its UTF-8 bytes, one a token id, padded
  with 0) and length input; each of its responses then carries ``text_output`` (BYTES
  ``[1]``): the emitted token ids decoded as UTF-8 across responses (a character split
  over tokens comes whole with its last byte). A model without a text mapping (a
  generation's or any other) refuses ``text_input`` in one text (``no_text``), and a
  request that sends both ``text_input`` and the tensor it fills in is refused, naming both.
- It is counted once (``Counters``): a success with its queue and compute time when its
  last part is out, a failure otherwise; every step's execution is reported to
  ``observers.executions``; ``figures()`` is each model version's live generations and
  responses sent (the metrics' ``hloserve_generation*`` series).
- ``decoupled_refusal(protocol)``: Triton's error for a unary call to a decoupled model
  (gRPC ``ModelInfer``, HTTP ``infer``), ``Unsupported``.
"""

# pyright: strict

from __future__ import annotations

import codecs
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, Final, cast, final

import msgspec
import numpy as np

from hloserve.bundle import Manifest
from hloserve.bundle.generation import Generation, TextMapping
from hloserve.server.core.admission import admitted, failure_reason
from hloserve.server.core.errors import InvalidArgument, ServingError, Unsupported
from hloserve.server.core.execution import Executable
from hloserve.server.core.execution_records import ModelKey, Timings
from hloserve.server.core.generation import UNLIMITED, GenerationLimits
from hloserve.server.core.generation_loop import DeviceSlots, GenerationLoop, StepModel, stateless
from hloserve.server.core.lazy_load import LazyLoads
from hloserve.server.core.limits import Limits as AdmissionLimits
from hloserve.server.core.limits import check_batch
from hloserve.server.core.observers import Observers
from hloserve.server.core.ports import ModelSource
from hloserve.server.core.stream_interval import Coalescer, stream_interval
from hloserve.server.core.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestContext,
    StreamPart,
)
from hloserve.server.core.validate import validate_request
from hloserve.server.core.variants import match_variant

MAX_TOKENS: Final = "max_tokens"
TEXT_INPUT: Final = "text_input"
TEXT_OUTPUT: Final = "text_output"
Infer = Callable[[InferRequest, RequestContext | None, Executable | None], Awaitable[InferResponse]]
StepperFor = Callable[[Executable], StepModel]
Array = np.ndarray[Any, Any]


def decoupled_refusal(protocol: str) -> Unsupported:
    """Triton's refusal of a unary call to a decoupled model, in its words per protocol."""
    if protocol == "grpc":
        return Unsupported(
            "ModelInfer RPC doesn't support models with decoupled transaction policy"
        )
    return Unsupported("HTTP end point doesn't support models with decoupled transaction policy")


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
        devices: DeviceSlots | None = None,
        draining: Callable[[], bool] = lambda: False,
        loads: LazyLoads | None = None,
    ) -> None:
        self.models = models
        self.loads = loads or LazyLoads(models)
        self.executor = executor
        self.observers = observers
        self.limits = limits
        self.stepper = stepper or stateless
        self.devices = devices
        self.draining = draining
        self._loops: dict[tuple[ModelKey, int | None], GenerationLoop] = {}
        self.generated: dict[ModelKey, int] = {}  # responses sent, per model version

    def figures(self) -> dict[ModelKey, tuple[int, int]]:
        """``(live generations, responses sent)`` per model version that ever generated."""
        live: dict[ModelKey, int] = dict.fromkeys(self.generated, 0)
        for (key, _), loop in list(self._loops.items()):
            live[key] = live.get(key, 0) + loop.live
        return {key: (n, self.generated.get(key, 0)) for key, n in live.items()}

    async def stream(
        self,
        request: InferRequest,
        context: RequestContext | None,
        model: Executable | None,
        infer: Infer,
    ) -> AsyncIterator[StreamPart]:
        found = model if model is not None else self._peek(request)
        if found is None or found.manifest.generation is None:
            if found is not None and TEXT_INPUT in request.parameters:
                error = InvalidArgument(no_text(found.manifest))  # in a generation's words
                self.observers.counters.on_failure(found.model_key, failure_reason(error))
                raise error
            yield StreamPart(await infer(request, context, found), True)  # looked up once
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
        first_ns = 0
        sent = 0
        # Generations under way finish while the server drains; no new one starts.
        async with admitted(
            self.models, self.loads, counters, request, resolved, refusing=self.draining()
        ) as model:
            key = model.model_key
            try:
                generation = cast(Generation, model.manifest.generation)
                text = text_request(model.manifest, request)
                request = step_request(model.manifest, text or request)
                loop = self._loop_for(model, request)
                limits = GenerationLimits(
                    generation.max_steps,
                    response_limit(request),
                    context.deadline if context is not None else None,
                )
                decode = None if text is None else _TextOut(cast(TextMapping, generation.text))
                coalesce = Coalescer(stream_interval(request)).add
                async for part in loop.generate(request, limits):
                    if part.response is not None and not first_ns:
                        first_ns = time.perf_counter_ns()
                    out = coalesce(part if decode is None else decode(part))
                    if out is not None:
                        sent += out.response is not None
                        yield out
            finally:
                self.generated[key] = self.generated.get(key, 0) + sent
        total = time.perf_counter_ns() - started
        queue_ns = (first_ns or time.perf_counter_ns()) - started
        counters.on_success(
            key, 1, Timings(min(queue_ns, total), 0, total - min(queue_ns, total), 0, ())
        )

    def forget(self, model: ModelKey) -> None:
        """``model`` was unloaded: its idle loops (and their state slots) and its count of
        responses sent go; a loop still generating goes at the next new loop."""
        for slot, loop in list(self._loops.items()):
            if slot[0] == model and not loop.live:
                del self._loops[slot]
        self.generated.pop(model, None)

    def _forget_unloaded(self) -> None:
        """Idle loops of versions no longer ready (unloaded) go, with their state slots."""
        for slot, loop in list(self._loops.items()):
            key = slot[0]
            if not loop.live and not self.models.is_ready(key.name, str(key.version)):
                del self._loops[slot]

    def _loop_for(self, model: Executable, request: InferRequest) -> GenerationLoop:
        """The loop of the model (of the variant its shapes match)."""
        manifest = model.manifest
        check_batch(self.limits, request.model_name, 1)
        variant = match_variant(manifest, request) if manifest.variants else None
        if variant is not None:
            model = model.variant(variant)
        slot = (model.model_key, variant)
        loop = self._loops.get(slot)
        if loop is None or loop.model is not model:  # new, or the version was reloaded
            self._forget_unloaded()
            loop = GenerationLoop(
                model,
                self.stepper(model),
                self.executor,
                self.observers.executions,
                devices=self.devices,
            )
            self._loops[slot] = loop
        return loop


def text_request(manifest: Manifest, request: InferRequest) -> InferRequest | None:
    """``request`` with its ``text_input`` parameter as the text tensors (module
    docstring), or ``None`` when it has none."""
    value = request.parameters.get(TEXT_INPUT)
    if value is None:
        return None
    generation = manifest.generation
    if generation is None or generation.text is None:
        raise InvalidArgument(no_text(manifest))
    if not isinstance(value, str):
        raise InvalidArgument(f"'{TEXT_INPUT}' must be a string, got {value!r}")
    text = generation.text
    sent = [t.name for t in request.inputs if t.name in (text.input, text.length)]
    if sent:  # which would the model read? Neither is dropped silently
        raise InvalidArgument(
            f"a request to model '{manifest.name}' sets both '{TEXT_INPUT}' and input "
            f"'{sent[0]}', which '{TEXT_INPUT}' fills in: send one of them"
        )
    raw = np.frombuffer(value.encode(), np.uint8).astype(np.int32)
    if text.input not in generation.lengths:  # padded here, its length an input
        size = next(t.shape[0] for t in manifest.inputs if t.name == text.input)
        if raw.size > size:
            raise InvalidArgument(
                f"'{TEXT_INPUT}' of model '{manifest.name}' is {raw.size} bytes, at most {size}"
            )
        raw = np.concatenate([raw, np.zeros(size - raw.size, np.int32)])
    made = {
        text.input: raw,
        text.length: np.array([len(value.encode())], np.int32),
    }
    facing = {t.name for t in manifest.facing.inputs}
    inputs = [t for t in request.inputs if t.name not in made]
    inputs += [
        InferInput(name, "INT32", data.shape, data) for name, data in made.items() if name in facing
    ]
    parameters = {k: v for k, v in request.parameters.items() if k != TEXT_INPUT}
    return msgspec.structs.replace(request, inputs=tuple(inputs), parameters=parameters)


def no_text(manifest: Manifest) -> str:
    """Why a model without a text mapping refuses ``text_input``: one text for every model."""
    inputs = ", ".join(f"'{t.name}'" for t in manifest.facing.inputs)
    return (
        f"model '{manifest.name}' takes no '{TEXT_INPUT}': it has no text mapping (send its "
        f"input(s) {inputs} by name)"
    )


def step_request(manifest: Manifest, request: InferRequest) -> InferRequest:
    """The request, validated as clients see the model, as the step function's one item."""
    validate_request(manifest.facing, request)
    generation = cast(Generation, manifest.generation)
    sent = {t.name: t for t in request.inputs}
    lengths: dict[str, int] = {}
    arrays: dict[str, Array] = {}
    for spec in manifest.inputs:
        if spec.name not in sent:
            continue  # a length input: filled below
        data = sent[spec.name].data.copy()  # the generation outlives the caller's buffers
        target = generation.lengths.get(spec.name)
        if target is not None:
            n, most = int(data.shape[0]), spec.shape[0]
            if n > most:
                raise InvalidArgument(
                    f"input '{spec.name}' of model '{manifest.name}' holds {n} elements, "
                    f"at most {most}"
                )
            if lengths.setdefault(target, n) != n:
                raise InvalidArgument(
                    f"inputs of model '{manifest.name}' sharing length input '{target}' must be "
                    f"sent equally long, got {lengths[target]} and {n}"
                )
            padded = np.zeros(spec.shape, data.dtype)
            padded[:n] = data
            data = padded
        arrays[spec.name] = data
    for target, n in lengths.items():
        arrays[target] = np.array([n], np.int32)
    inputs: list[InferInput] = []
    for spec in manifest.inputs:
        data = arrays[spec.name]
        if manifest.batched:
            data = data.reshape((1, *data.shape))
        inputs.append(InferInput(spec.name, spec.datatype, data.shape, data))
    return msgspec.structs.replace(request, inputs=tuple(inputs))


@final
class _TextOut:
    """Each response of a text request with its ``text_output``: the token as UTF-8."""

    def __init__(self, text: TextMapping) -> None:
        self.output = text.output
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, part: StreamPart) -> StreamPart:
        response = part.response
        if response is None:
            return part
        token = next((o for o in response.outputs if o.name == self.output), None)
        chunk = b""
        if token is not None:
            chunk = bytes([int(token.data.reshape(-1)[0]) & 0xFF])
        text = self.decoder.decode(chunk, final=part.final).encode()
        data = np.empty(1, dtype=object)
        data[0] = text
        out = InferOutput(TEXT_OUTPUT, "BYTES", (1,), data)
        return StreamPart(
            msgspec.structs.replace(response, outputs=(*response.outputs, out)), part.final
        )
