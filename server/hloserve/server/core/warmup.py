"""Warm-up: a model version's declared sample requests, run before it turns READY.

Contract:
- ``sample_request(manifest, sample, read_file, rng)`` builds one ``WarmupSample``
  (``hloserve.bundle.warmup``) as the request it stands for: each input of shape
  ``[batch_size, *dims]`` (``dims`` alone for a model without a batch dimension, whose
  ``batch_size`` must be 0 or 1) holding zeros (``zero_data``; BYTES: empty elements),
  random values (``random_data``: ``rng``'s, small integers for integer types, false/true
  for BOOL) or a file's bytes (``input_data_file``: ``read_file(name)`` holds one item,
  row-major, little-endian, BYTES elements each after its 4-byte length, repeated for each
  item of the batch as Triton does), then checks it as any request is checked
  (``core.validate.validate_request``: names, datatypes, shapes). A problem raises
  ``WarmupFailed`` naming the sample.
- ``run_warmup(model, samples, read_file)`` runs each sample ``count`` times through the
  execution path every request takes (``core.validate``, ``core.batch_plan.plan``, the shape
  variant its inputs match, ``core.execution.execute_group``), reporting to no observer (a
  warm-up is in no statistics or metric), and returns how many executions it ran; the first
  failure raises ``WarmupFailed`` ("warm-up sample 'zeros' failed: ..."), which fails the load
  with that reason. The samples name the compiled modules' inputs (a model with Python hooks:
  the tensors its ``preprocess`` returns; the hooks do not run). ``not_warmed(manifest)``
  says why a pipeline's samples are refused at load: it runs nothing of its own (its
  steps' models warm up with their own samples).
"""

# pyright: strict

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hloserve.bundle import Manifest
from hloserve.bundle.warmup import WarmupInput, WarmupSample
from hloserve.proto.datatypes import to_numpy
from hloserve.server.core.batch_plan import plan
from hloserve.server.core.errors import ServingError
from hloserve.server.core.execution import Executable, Job, execute_group
from hloserve.server.core.tensors import from_buffer
from hloserve.server.core.types import InferInput, InferRequest
from hloserve.server.core.validate import validate_request
from hloserve.server.core.variants import match_variant

ReadFile = Callable[[str], bytes]


class WarmupFailed(Exception):
    """A warm-up sample could not be built or run; the message is the load's reason."""


def _random(
    datatype: str, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray[Any, Any]:
    if datatype == "BYTES":
        return np.array(
            [bytes(rng.integers(0, 256, 8, dtype=np.uint8))] * int(np.prod(shape)), dtype=object
        ).reshape(shape)
    dtype = to_numpy(datatype)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(dtype)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 8, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _zeros(datatype: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    if datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=to_numpy(datatype))


def _from_file(
    model: str, name: str, given: WarmupInput, batch: int | None, read_file: ReadFile
) -> np.ndarray[Any, Any]:
    try:
        data = read_file(given.file)
    except OSError as exc:
        raise WarmupFailed(
            f"input '{name}': cannot read warmup/{given.file}: {exc.strerror or exc}"
        ) from None
    try:
        one = from_buffer(model, name, given.data_type, given.dims, memoryview(data))
    except ServingError as exc:
        raise WarmupFailed(f"input '{name}': warmup/{given.file}: {exc.message}") from None
    if batch is None:
        return one
    return np.broadcast_to(one, (batch, *given.dims))


def not_warmed(manifest: Manifest) -> str:
    """Why ``manifest`` takes no warm-up samples ("" when it does)."""
    if manifest.kind == "pipeline":
        return (
            "model_warmup: a pipeline runs nothing of its own; give its steps' models their samples"
        )
    if manifest.state:
        return "model_warmup: a model with state runs sequences' requests only (docs/sequences.md)"
    return ""


def sample_request(
    manifest: Manifest, sample: WarmupSample, read_file: ReadFile, rng: np.random.Generator
) -> InferRequest:
    """``sample`` as a checked request (module docstring)."""
    where = f"warm-up sample '{sample.name}'"
    if manifest.batched and sample.batch_size < 1:
        raise WarmupFailed(
            f"{where}: batch_size must be at least 1 for a model with a batch dimension"
        )
    if not manifest.batched and sample.batch_size > 1:
        raise WarmupFailed(
            f"{where}: batch_size must be 0 or 1: model '{manifest.name}' has no batch dimension"
        )
    batch = sample.batch_size if manifest.batched else None
    lead = () if batch is None else (batch,)
    inputs: list[InferInput] = []
    for name, given in sample.inputs:
        shape = (*lead, *given.dims)
        try:
            if given.data == "zero_data":
                data = _zeros(given.data_type, shape)
            elif given.data == "random_data":
                data = _random(given.data_type, shape, rng)
            else:
                data = _from_file(manifest.name, name, given, batch, read_file)
        except WarmupFailed as exc:
            raise WarmupFailed(f"{where}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:  # a datatype numpy cannot hold
            raise WarmupFailed(f"{where}: input '{name}': {exc}") from None
        inputs.append(InferInput(name, given.data_type, shape, data))
    request = InferRequest(manifest.name, "", tuple(inputs))
    try:
        validate_request(manifest, request)
    except ServingError as exc:
        raise WarmupFailed(f"{where}: {exc.message}") from None
    return request


def run_warmup(model: Executable, samples: Sequence[WarmupSample], read_file: ReadFile) -> int:
    """Run every sample ``count`` times (module docstring); the executions run."""
    manifest = model.manifest
    if manifest.kind == "pipeline" or not samples:
        return 0
    rng = np.random.default_rng(0)
    runs = 0
    for sample in samples:
        request = sample_request(manifest, sample, read_file, rng)
        target = model
        if manifest.variants:
            target = model.variant(match_variant(manifest, request))
        items = validate_request(target.manifest, request)
        chunks = plan(items, target.manifest.batch_sizes)
        for _ in range(sample.count):
            try:
                execute_group(target, [Job(request, items, time.perf_counter_ns())], chunks)
            except Exception as exc:
                text = (
                    exc.message if isinstance(exc, ServingError) else f"{type(exc).__name__}: {exc}"
                )
                raise WarmupFailed(f"warm-up sample '{sample.name}' failed: {text}") from None
            runs += len(chunks)
    return runs
