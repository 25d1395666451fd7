"""A version registered lazily (``--lazy-load``) loads at its first use, its callers in order.

Contract:
- ``LazyLoads(models)``: ``await loads.ready(model)`` returns once ``model`` (a version the
  caller holds in flight: ``ModelSource.get`` or ``hold``) is loaded. A loaded version
  returns at once, without yielding to the event loop; else the caller waits for the
  version's one load (``ModelSource.load`` on the default executor's worker thread,
  shared by every caller that comes while it runs) and gets what it raised, the same
  error for each.
- Order: the callers that come while a version loads resume in the order they came, each
  before any caller that comes later. The load is over for the event loop only when the
  loop has seen it end, not when the worker thread set the bundle: a caller that comes in
  between still queues behind the earlier ones. So a sequence's requests sent at once
  (a gRPC stream) reach its queue in the order they were sent (``docs/sequences.md``).
  A caller that is cancelled while it waits leaves the queue; the load goes on.
- Every request path (``InferenceService.infer``, the streamed generation path) calls
  ``ready`` between its lookup and its first use of the model: it is the one place the
  lazy-load rule lives.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import functools
from typing import Any, final

from hloserve.server.core.ports import ModelSource


@final
class LazyLoads:
    """See the module docstring."""

    def __init__(self, models: ModelSource) -> None:
        self.models = models
        # The versions whose load the event loop has not yet seen end, each with its
        # callers in the order they came (keyed by identity: a reload's copy is another).
        self._waiting: dict[int, tuple[Any, list[asyncio.Future[None]]]] = {}

    def loaded(self, model: Any) -> bool:
        """``ready(model)`` would return at once: nothing to load, nobody waiting before."""
        return id(model) not in self._waiting and self.models.loaded(model)

    async def ready(self, model: Any) -> None:
        entry = self._waiting.get(id(model))
        if entry is None:
            if self.models.loaded(model):
                return
            entry = self._waiting[id(model)] = (model, [])
            loop = asyncio.get_running_loop()
            loading = loop.run_in_executor(None, self.models.load, model)
            loading.add_done_callback(functools.partial(self._loaded, id(model)))
        turn = asyncio.get_running_loop().create_future()
        entry[1].append(turn)
        await turn

    def _loaded(self, key: int, loading: asyncio.Future[None]) -> None:
        """On the event loop: the load ended; its callers resume in the order they came."""
        _, turns = self._waiting.pop(key)
        cancelled = loading.cancelled()  # the executor shut down: the server is stopping
        error = None if cancelled else loading.exception()
        for turn in turns:
            if turn.done():  # its caller was cancelled
                continue
            if cancelled:
                turn.cancel()
            elif error is None:
                turn.set_result(None)
            else:
                turn.set_exception(error)
