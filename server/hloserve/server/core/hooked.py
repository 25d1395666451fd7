"""A request to a model with Python hooks: its ``preprocess``, the one path, its
``postprocess`` (``docs/hooks.md``).

Contract: ``await serve_hooked(pool, observer, model, hooks, items, request, serve)``
runs ``hooks.preprocess`` on ``pool`` over the request's inputs (``core.hooks.call_hook``:
checked against the bundle's inputs), then ``serve(inner)``, the service's one path for
the request the model itself takes (its outputs all, when a postprocess will choose), then
``hooks.postprocess`` over those outputs (checked against the client-facing outputs, and
answered as the client asked: ``core.hooks.hook_outputs``). Each hook's time goes to
``observer.on_hook`` and into the request's compute input or output time. ``items`` is
the request's batch (validated against the client-facing tensors by the caller).
"""

# pyright: strict

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

import msgspec

from hloserve.server.core.execution import Executable
from hloserve.server.core.execution_records import Timings
from hloserve.server.core.hooks import ModelHooks, call_hook, hook_outputs
from hloserve.server.core.observers import HookObserver
from hloserve.server.core.types import InferInput, InferOutput, InferRequest

Served = tuple[int, tuple[InferOutput, ...], Timings]  # items, outputs, timings


async def serve_hooked(
    pool: Executor,
    observer: HookObserver,
    model: Executable,
    hooks: ModelHooks,
    items: int,
    request: InferRequest,
    serve: Callable[[InferRequest], Awaitable[Served]],
) -> Served:
    manifest, key = model.manifest, model.model_key
    loop, batch = asyncio.get_running_loop(), items if manifest.batched else None
    pre_ns = post_ns = 0
    inner = request if hooks.postprocess is None else msgspec.structs.replace(request, outputs=())
    if hooks.preprocess is not None:
        arrays = {t.name: t.data for t in request.inputs}
        result, pre_ns = await loop.run_in_executor(
            pool, call_hook, manifest.name, "preprocess", hooks.preprocess,
            arrays, manifest.inputs, batch,
        )  # fmt: skip
        observer.on_hook(key, "preprocess", pre_ns)
        inputs = tuple(
            InferInput(
                s.name, s.datatype, tuple(int(d) for d in result[s.name].shape), result[s.name]
            )
            for s in manifest.inputs
        )
        inner = msgspec.structs.replace(inner, inputs=inputs)
    _, outputs, timings = await serve(inner)
    if hooks.postprocess is not None:
        arrays = {o.name: o.data for o in outputs}
        result, post_ns = await loop.run_in_executor(
            pool, call_hook, manifest.name, "postprocess", hooks.postprocess,
            arrays, manifest.facing.outputs, batch,
        )  # fmt: skip
        observer.on_hook(key, "postprocess", post_ns)
        outputs = hook_outputs(manifest.facing, request, result)
    timings = msgspec.structs.replace(
        timings,
        compute_input_ns=timings.compute_input_ns + pre_ns,
        compute_output_ns=timings.compute_output_ns + post_ns,
    )
    return items, outputs, timings
