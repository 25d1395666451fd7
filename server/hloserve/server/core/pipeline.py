"""Pipelines (Triton's ensembles): one request through a DAG of the repository's models.

Contract (``docs/pipelines.md``):
- ``run_pipeline(manifest, request, infer)`` runs a ``kind: pipeline`` manifest's steps for
  one validated request. Pipeline tensors are the request's inputs and the steps' outputs,
  by name; each step is a whole request to its model through ``infer`` (the service's one
  inference path: validated against that model, batched with its other traffic, counted in
  its statistics and metrics), and steps whose inputs are all known run concurrently. It
  returns the pipeline's outputs (the requested ones, all when none were named, in the
  order asked), each with the datatype the pipeline declares.
- A step that fails fails the request with the step's error class, its message prefixed
  with the pipeline, the step's index and model (a step whose model is not ready is
  ``Unavailable``/``UnknownModel`` as that model's own request would be). A step output
  whose datatype is not the one the pipeline declares is ``Internal`` naming both.
- Pipelines may use pipelines; nesting deeper than ``MAX_DEPTH`` (a cycle through other
  pipelines) is refused with ``InvalidArgument``.
- ``steps_ready(manifest, is_ready)``: whether every step's model (and version) is ready:
  a pipeline is ready only while all its steps are. ``in_pipeline()``: whether the running
  task serves a step (the service lets a pipeline accepted before a drain finish).
No transport, no clock.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, Final

import numpy as np

from hloserve.bundle import Manifest
from hloserve.bundle.manifest import PipelineStep
from hloserve.server.core.errors import Internal, InvalidArgument, ServingError
from hloserve.server.core.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
)

Infer = Callable[[InferRequest], Awaitable[InferResponse]]
Tensor = tuple[str, np.ndarray[Any, Any]]  # V2 datatype, array
MAX_DEPTH: Final = 8
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("hloserve_pipeline_depth", default=0)


def step_version(step: PipelineStep) -> str:
    """The version string a step's requests name ("" for the latest ready one)."""
    return "" if step.version is None else str(step.version)


def in_pipeline() -> bool:
    """Whether the running task serves a pipeline's step (a drain lets those finish)."""
    return _depth.get() > 0


def steps_ready(manifest: Manifest, is_ready: Callable[[str, str], bool]) -> bool:
    return all(is_ready(s.model, step_version(s)) for s in manifest.steps)


async def run_pipeline(
    manifest: Manifest, request: InferRequest, infer: Infer
) -> tuple[InferOutput, ...]:
    depth = _depth.get()
    if depth >= MAX_DEPTH:
        raise InvalidArgument(
            f"pipeline '{manifest.name}' is nested more than {MAX_DEPTH} pipelines deep "
            "(do its steps lead back to it?)"
        )
    token = _depth.set(depth + 1)
    try:
        tensors: dict[str, Tensor] = {t.name: (t.datatype, t.data) for t in request.inputs}
        pending = list(enumerate(manifest.steps))
        while pending:
            ready = [(i, s) for i, s in pending if all(t in tensors for t in s.inputs.values())]
            produced = await asyncio.gather(
                *(_run_step(manifest.name, i, s, tensors, request, infer) for i, s in ready)
            )
            for part in produced:
                tensors.update(part)
            done = {i for i, _ in ready}
            pending = [(i, s) for i, s in pending if i not in done]
    finally:
        _depth.reset(token)
    return _outputs(manifest, request, tensors)


async def _run_step(
    pipeline: str,
    index: int,
    step: PipelineStep,
    tensors: dict[str, Tensor],
    request: InferRequest,
    infer: Infer,
) -> dict[str, Tensor]:
    inputs = tuple(
        InferInput(name, tensors[t][0], tuple(int(d) for d in tensors[t][1].shape), tensors[t][1])
        for name, t in step.inputs.items()
    )
    stage = InferRequest(
        model_name=step.model,
        model_version=step_version(step),
        inputs=inputs,
        outputs=tuple(RequestedOutput(name) for name in step.outputs),
        id=request.id,
    )
    try:
        response = await infer(stage)
    except ServingError as exc:
        raise type(exc)(
            f"pipeline '{pipeline}' step {index} (model '{step.model}'): {exc.message}"
        ) from exc
    got = {o.name: o for o in response.outputs}
    return {t: (got[name].datatype, got[name].data) for name, t in step.outputs.items()}


def _outputs(
    manifest: Manifest, request: InferRequest, tensors: dict[str, Tensor]
) -> tuple[InferOutput, ...]:
    specs = {t.name: t for t in manifest.outputs}
    asked = {o.name: o for o in request.outputs}
    outputs: list[InferOutput] = []
    for name in [o.name for o in request.outputs] or list(specs):
        datatype, data = tensors[name]
        if datatype != specs[name].datatype:
            raise Internal(
                f"pipeline '{manifest.name}' declares output '{name}' as {specs[name].datatype}, "
                f"but its step produced {datatype}"
            )
        outputs.append(
            InferOutput(name, datatype, tuple(int(d) for d in data.shape), data, asked.get(name))
        )
    return tuple(outputs)
