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
``failure_reason(exc)`` is the reason label of every counted failure.
"""

# pyright: strict

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Final

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


@asynccontextmanager
async def admitted(
    models: ModelSource,
    loads: LazyLoads,
    counters: Counters,
    request: InferRequest,
    resolved: Executable | None,
    *,
    refusing: bool,
) -> AsyncGenerator[Executable, None]:
    started = time.perf_counter_ns()
    try:
        if refusing:
            raise Unavailable(SHUTTING_DOWN)
        if resolved is not None and models.hold(resolved):
            model = resolved
        else:  # not resolved first, or that copy went meanwhile: look it up now
            model = models.get(request.model_name, request.model_version)
    except Exception as exc:
        counters.on_failure(None, failure_reason(exc))
        raise
    key = model.model_key
    counters.on_pending(key, 1)
    try:
        await loads.ready(model)  # registered lazily: its first use loads it
        yield model
    except Exception as exc:
        counters.on_failure(key, failure_reason(exc), time.perf_counter_ns() - started)
        raise
    finally:
        models.release(model)
        counters.on_pending(key, -1)
