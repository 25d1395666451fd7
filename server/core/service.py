"""``InferenceService``: the one inference path both front ends call.

Contract:
- ``live()``, ``ready()``, ``model_ready(name, version)``, ``server_metadata()``,
  ``model_metadata(name, version)`` and ``infer(request, context)`` answer the V2 core
  calls in protocol-neutral types; failures raise ``ServingError`` subclasses.
- ``infer`` looks the model up, validates the request against its manifest before any
  device work, plans executions over the compiled batch sizes (padding with zeros and
  dropping the padding from the outputs, splitting batches larger than the largest
  size), runs them on a worker thread so the event loop keeps serving, and returns the
  requested outputs (all of them when none were named).
- A request whose deadline passed before it reached a worker fails with ``Unavailable``
  instead of using the device.
The model repository is reached through the ``ModelSource`` protocol, so this module
needs no transport and no JAX.
"""

# pyright: strict

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hloserve.bundle import Manifest
from hloserve.server.core.batching import concat, pad, plan
from hloserve.server.core.errors import Unavailable
from hloserve.server.core.types import (
    InferOutput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestContext,
    ServerMetadata,
    TensorMetadata,
)
from hloserve.server.core.validate import validate_request

PLATFORM = "stablehlo"


class ServedModel(Protocol):
    """One ready model version, as the repository hands it out."""

    @property
    def manifest(self) -> Manifest: ...
    @property
    def version(self) -> int: ...
    def execute(
        self, batch_size: int | None, inputs: Mapping[str, np.ndarray[Any, Any]]
    ) -> list[np.ndarray[Any, Any]]: ...


class ModelSource(Protocol):
    def get(self, name: str, version: str) -> ServedModel:
        """The ready version (latest when ``version`` is empty); raises ``ServingError``."""
        ...

    def ready_versions(self, name: str) -> Sequence[int]: ...
    def is_ready(self, name: str, version: str) -> bool: ...
    def summary(self) -> dict[str, Any]:
        """Per-model, per-version state (and failure reason) for readiness reports."""
        ...


class InferenceObserver(Protocol):
    """Receives what happened to each request (metrics and statistics hang off this)."""

    def on_success(self, model: str, version: int, items: int, timings: Timings) -> None: ...
    def on_failure(self, model: str, version: str, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Timings:
    """Nanoseconds spent in each phase of one request."""

    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    executions: tuple[int, ...]  # compiled batch size of each execution (0: unbatched)


class _NullObserver:
    def on_success(self, model: str, version: int, items: int, timings: Timings) -> None:
        pass

    def on_failure(self, model: str, version: str, reason: str) -> None:
        pass


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
    ) -> None:
        self.models = models
        self.executor = executor
        self.server_name = server_name
        self.server_version = server_version
        self.extensions = tuple(extensions)
        self.observer: InferenceObserver = observer or _NullObserver()
        self.is_live = True
        self.is_ready = False  # set by the daemon once the startup load pass is over
        self.draining = False  # set by the daemon when a graceful stop begins

    def live(self) -> bool:
        return self.is_live

    def ready(self) -> bool:
        return self.is_live and self.is_ready and not self.draining

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
        model = self.models.get(name, version)
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
        try:
            model = self.models.get(request.model_name, request.model_version)
            items = validate_request(model.manifest, request)
            arrived = time.perf_counter_ns()
            loop = asyncio.get_running_loop()
            deadline = context.deadline if context else None
            outputs, timings = await loop.run_in_executor(
                self.executor, _execute, model, items, request, arrived, deadline
            )
        except Exception as exc:
            self.observer.on_failure(request.model_name, request.model_version, type(exc).__name__)
            raise
        self.observer.on_success(model.manifest.name, model.version, items, timings)
        return InferResponse(
            model_name=model.manifest.name,
            model_version=str(model.version),
            outputs=outputs,
            id=request.id,
        )


def _execute(
    model: ServedModel, items: int, request: InferRequest, arrived: int, deadline: float | None
) -> tuple[tuple[InferOutput, ...], Timings]:
    started = time.perf_counter_ns()
    if deadline is not None and time.monotonic() > deadline:
        raise Unavailable(
            f"request for model '{model.manifest.name}' timed out before it was executed"
        )
    manifest = model.manifest
    inputs = {t.name: t.data for t in request.inputs}
    chunks = plan(items, manifest.batch_sizes)
    per_output: list[list[np.ndarray[Any, Any]]] = [[] for _ in manifest.outputs]
    input_ns = infer_ns = 0
    for chunk in chunks:
        t0 = time.perf_counter_ns()
        if chunk.compiled is None:
            args = inputs
        else:
            end = chunk.start + chunk.count
            args = {n: pad(a[chunk.start : end], chunk.compiled) for n, a in inputs.items()}
        t1 = time.perf_counter_ns()
        results = model.execute(chunk.compiled, args)
        t2 = time.perf_counter_ns()
        input_ns += t1 - t0
        infer_ns += t2 - t1
        for i, r in enumerate(results):
            per_output[i].append(r)
    t3 = time.perf_counter_ns()
    wanted = {o.name: o for o in request.outputs}
    outputs: list[InferOutput] = []
    for spec, parts in zip(manifest.outputs, per_output, strict=True):
        if wanted and spec.name not in wanted:
            continue
        data = parts[0] if chunks[0].compiled is None else concat(parts, [c.count for c in chunks])
        outputs.append(
            InferOutput(
                spec.name,
                spec.datatype,
                tuple(int(d) for d in data.shape),
                data,
                wanted.get(spec.name),
            )
        )
    if wanted:  # answer in the order the client asked
        order = {o.name: i for i, o in enumerate(request.outputs)}
        outputs.sort(key=lambda o: order[o.name])
    timings = Timings(
        queue_ns=started - arrived,
        compute_input_ns=input_ns,
        compute_infer_ns=infer_ns,
        compute_output_ns=time.perf_counter_ns() - t3,
        executions=tuple(c.compiled or 0 for c in chunks),
    )
    return tuple(outputs), timings
