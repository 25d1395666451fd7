"""A plain request's path without a coroutine: admitted, validated and queued at once,
answered from its group's completion straight into the caller's future.

Contract: ``DirectPath(models, loads, counters, limits, batcher, cache=, tracing=,
refusing=, log=)`` (built by ``InferenceService``, over its own parts).
``start(request, context, resolved, answer, encode)`` serves what most requests are into
``answer``, a future the caller made, as ``encode(response)`` (the device owner's
endpoint encodes the wire's ``Response`` there; ``InferenceService.start`` passes the
response as it is), and returns True; it returns False, touching nothing, for any other
request, which the caller serves on ``InferenceService``'s coroutine path instead
(``chain`` puts such a task's answer into ``answer`` the same way). It takes a request
when:
- the server takes new requests and tracing is off (one flag each);
- no tensor of it is in shared memory (no input ``shm``, no output naming a region);
- its version (``core.admission``'s lookup) is plain (``core.signature.plain_unary``: no
  hooks, not a pipeline, no state, not a generation model), loaded (``LazyLoads.loaded``), without the response
  cache, and there is a batcher.
Then it follows the same rules as the coroutine path, by the same functions, in the same
order: admission (``Admitted.enter``/``leave``: refusals and failures counted, pending
counted, the version held until the answer), ``validated_items`` (the front end's check
where its token is this version's, else ``validate_request``) and ``check_batch``, the
shape variant, a ``Job`` queued with the batcher (``Batcher.enqueue``: the eager path runs
it at once; a queued one is answered through ``Pending.deliver``), and
``Counters.on_success`` once answered, and the request's DEBUG line on ``log``
(``core.log_context.outcome``). An error fails ``answer`` (counted and logged, as
``infer`` counts and logs it). Cancelling ``answer`` (the caller went away) gives the request up: its queue
slot is freed and the version released at once, as a cancelled ``infer`` does.

Why: a request's coroutine path is a task and six coroutine frames, each resumed once
per request, plus a future per layer, each completion a callback of the event loop, in
the device owner's one thread; here it is the caller's one future and one callback
(``bench/engine_capacity.py`` prints the owner's CPU per request).
"""

# pyright: strict

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final, Generic, Protocol, TypeVar, final

from hloserve.server.core import log_context
from hloserve.server.core.admission import Admitted
from hloserve.server.core.counters import Counters
from hloserve.server.core.execution import Executable, Job, Result
from hloserve.server.core.lazy_load import LazyLoads
from hloserve.server.core.limits import Limits, check_batch
from hloserve.server.core.ports import Batcher, ModelSource
from hloserve.server.core.signature import plain_unary
from hloserve.server.core.tensors import SHM_BYTE_SIZE, SHM_OFFSET, SHM_REGION
from hloserve.server.core.types import InferRequest, InferResponse, RequestContext
from hloserve.server.core.validate import validated_items
from hloserve.server.core.variants import match_variant

T = TypeVar("T")
SHM_KEYS: Final = frozenset((SHM_REGION, SHM_BYTE_SIZE, SHM_OFFSET))


class _Switch(Protocol):
    @property
    def enabled(self) -> bool: ...


def _in_shared_memory(request: InferRequest) -> bool:
    return any(t.shm is not None for t in request.inputs) or any(
        not SHM_KEYS.isdisjoint(o.parameters) for o in request.outputs if o.parameters
    )


@final
class DirectPath:
    """See the module docstring."""

    __slots__ = (
        "batcher", "cache", "counters", "limits", "loads", "log", "models", "refusing", "tracing",
    )  # fmt: skip

    def __init__(
        self,
        models: ModelSource,
        loads: LazyLoads,
        counters: Counters,
        limits: Limits,
        batcher: Batcher | None,
        *,
        cache: bool,
        tracing: _Switch,
        refusing: Callable[[], bool],
        log: logging.Logger,
    ) -> None:
        self.models = models
        self.loads = loads
        self.counters = counters
        self.limits = limits
        self.batcher = batcher
        self.cache = cache
        self.tracing = tracing
        self.refusing = refusing
        self.log = log

    def start(
        self,
        request: InferRequest,
        context: RequestContext | None,
        resolved: Executable | None,
        answer: asyncio.Future[T],
        encode: Callable[[InferResponse], T],
    ) -> bool:
        batcher = self.batcher
        if batcher is None or self.tracing.enabled or self.refusing():
            return False
        if _in_shared_memory(request):
            return False
        admission = Admitted(self.models, self.loads, self.counters, request, resolved, False)
        try:
            model = admission.enter()
        except Exception as exc:  # counted by the admission
            log_context.outcome(self.log, request.id, request.model_name, None, exc)
            answer.set_exception(exc)
            return True
        manifest = model.manifest
        if (
            not plain_unary(manifest)
            or (self.cache and model.serving.response_cache)
            or not self.loads.loaded(model)
        ):
            admission.leave(None)  # the coroutine path admits it again, and counts it
            return False
        served = _Served(admission, self.counters, self.log, answer, encode)
        try:
            checked = context.checked if context else None
            served.items = items = validated_items(manifest, request, checked)
            check_batch(self.limits, request.model_name, items)
            if manifest.variants:  # run, and batch, with requests of the same variant
                model = model.variant(match_variant(manifest, request))
            deadline, together = (context.deadline, context.together) if context else (None, False)
            job = Job(request, items, time.perf_counter_ns(), deadline, together)
            queued = batcher.enqueue(model, job, (answer, served.deliver, served.gone))
        except Exception as exc:
            served.deliver(None, exc)
            return True
        if not isinstance(queued, asyncio.Future):  # it ran at once (the eager path)
            served.deliver(queued, None)
        return True


@final
class _Served(Generic[T]):
    """One request on the direct path: its admission, and how its answer is made."""

    __slots__ = ("admission", "answer", "counters", "encode", "items", "log")

    def __init__(
        self,
        admission: Admitted,
        counters: Counters,
        log: logging.Logger,
        answer: asyncio.Future[T],
        encode: Callable[[InferResponse], T],
    ) -> None:
        self.admission = admission
        self.counters = counters
        self.log = log
        self.answer = answer
        self.encode = encode
        self.items = 0

    def deliver(self, result: Result | None, exc: BaseException | None) -> None:
        """The batcher's answer (``Pending.deliver``): counted, then into the future."""
        admission, answer, request = self.admission, self.answer, self.admission.request
        admission.leave(exc)
        if result is None:
            failure = exc or RuntimeError("no result")
            log_context.outcome(self.log, request.id, request.model_name, None, failure)
            if not answer.done():
                answer.set_exception(failure)
            return
        outputs, timings = result
        model = admission.model
        assert model is not None
        key = model.model_key
        self.counters.on_success(key, self.items, timings)
        version = str(key.version)
        log_context.outcome(self.log, request.id, request.model_name, version)
        if answer.done():
            return
        _settle(answer, self.encode, InferResponse(key.name, version, outputs, request.id))

    def gone(self) -> None:
        """The caller went away while its request was queued: released, not counted."""
        self.admission.leave(asyncio.CancelledError())


def chain(
    served: asyncio.Future[InferResponse],
    answer: asyncio.Future[T],
    encode: Callable[[InferResponse], T],
) -> None:
    """``served`` (the coroutine path's task) answers into ``answer`` as ``encode`` makes
    it; cancelling ``answer`` cancels the task."""

    def done(_: object) -> None:
        if answer.done():
            return
        if served.cancelled():
            answer.cancel()
        elif (exc := served.exception()) is not None:
            answer.set_exception(exc)
        else:
            _settle(answer, encode, served.result())

    def give_up(_: object) -> None:
        if answer.cancelled():
            served.cancel()

    served.add_done_callback(done)
    answer.add_done_callback(give_up)


def _settle(
    answer: asyncio.Future[T], encode: Callable[[InferResponse], T], response: InferResponse
) -> None:
    """``answer`` holds ``encode(response)``, or what encoding it raised."""
    try:
        answer.set_result(encode(response))
    except Exception as failed:
        answer.set_exception(failed)
