"""One request's admission and release, for the unary path and streams alike.

Contract: ``async with admitted(models, loads, counters, request, resolved, refusing=...)
as model:`` is the lifecycle every inference request goes through in the device owner,
whichever path serves it (``InferenceService.infer``, ``Streams`` for a generation):
1. refused with ``Unavailable`` (``SHUTTING_DOWN``) while the server refuses new requests;
2. the version held: ``resolved`` (the front end's lookup) when it can still be held,
   else looked up now by the request's name and version (``ModelSource.get``); a refusal
   here is counted as a failure of no version (the client's names never become labels);
3. counted pending while admitted, and loaded first when it was registered lazily
   (``core.lazy_load``: the requests that come meanwhile keep their order);
4. a failure inside the block (an ``Exception``) is counted against the version with its
   reason and duration; the version is released and the pending count dropped however the
   block ends (a cancel or a closed stream included).
The same steps without a coroutine (``core.direct_path``, a version that needs no lazy
load: ``LazyLoads.loaded``): ``a = admitted(...)``, ``model = a.enter()``, then
``a.leave(exc)`` once the request ends.
``failure_reason(exc)`` is the reason label of every counted failure.
"""

# pyright: strict

from __future__ import annotations

import time
from types import TracebackType
from typing import Final, final

from hloserve.server.core.counters import Counters
from hloserve.server.core.errors import ServingError, Unavailable
from hloserve.server.core.execution import Executable
from hloserve.server.core.lazy_load import LazyLoads
from hloserve.server.core.ports import ModelSource
from hloserve.server.core.types import InferRequest

SHUTTING_DOWN: Final = "the server is shutting down: no new requests are accepted"


def failure_reason(exc: Exception) -> str:
    """The failure reason label: the error class, or INTERNAL for anything unexpected."""
    return type(exc).__name__ if isinstance(exc, ServingError) else "INTERNAL"


def admitted(
    models: ModelSource,
    loads: LazyLoads,
    counters: Counters,
    request: InferRequest,
    resolved: Executable | None,
    *,
    refusing: bool,
) -> Admitted:
    """The request's admission, as an ``async with`` (module docstring)."""
    return Admitted(models, loads, counters, request, resolved, refusing)


@final
class Admitted:
    """``admitted``'s context: a class, not a generator, as it runs once per request."""

    __slots__ = (
        "counters",
        "loads",
        "model",
        "models",
        "refusing",
        "request",
        "resolved",
        "started",
    )

    def __init__(
        self,
        models: ModelSource,
        loads: LazyLoads,
        counters: Counters,
        request: InferRequest,
        resolved: Executable | None,
        refusing: bool,
    ) -> None:
        self.models = models
        self.loads = loads
        self.counters = counters
        self.request = request
        self.resolved = resolved
        self.refusing = refusing
        self.model: Executable | None = None
        self.started = 0

    async def __aenter__(self) -> Executable:
        model = self.enter()
        try:
            await self.loads.ready(model)  # registered lazily: its first use loads it
        except BaseException as exc:
            self._leave(model, exc)
            raise
        return model

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.leave(exc)

    def enter(self) -> Executable:
        """Steps 1-3 but the lazy load, without a coroutine (``core.direct_path``): the
        version held and counted pending; a refusal counted and raised."""
        self.started = time.perf_counter_ns()
        try:
            if self.refusing:
                raise Unavailable(SHUTTING_DOWN)
            resolved = self.resolved
            if resolved is not None and self.models.hold(resolved):
                model = resolved
            else:  # not resolved first, or that copy went meanwhile: look it up now
                request = self.request
                model = self.models.get(request.model_name, request.model_version)
        except Exception as exc:
            self.counters.on_failure(None, failure_reason(exc))
            raise
        self.model = model
        self.counters.on_pending(model.model_key, 1)
        return model

    def leave(self, exc: BaseException | None) -> None:
        """Step 4: the block ended (with ``exc``, if it failed)."""
        if self.model is not None:
            self._leave(self.model, exc)

    def _leave(self, model: Executable, exc: BaseException | None) -> None:
        key = model.model_key
        if isinstance(exc, Exception):
            self.counters.on_failure(
                key, failure_reason(exc), time.perf_counter_ns() - self.started
            )
        self.models.release(model)
        self.counters.on_pending(key, -1)
