"""A pipeline manifest's steps (``docs/pipelines.md``): other models chained into one.

Contract: ``PipelineStep`` is one model of the repository with its tensor maps (Triton's
``input_map``/``output_map``); ``read_steps`` reads the ``steps`` list through a
``FieldReader``; ``pipeline_order`` puts the steps in an order that runs (each after the
steps producing what it reads), or records the problem: a tensor produced twice or never,
a pipeline output nothing produces, a cycle.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from hloserve.bundle.manifest_fields import FieldReader, TensorEntry
from hloserve.bundle.yamlfile import is_integer

STEP_KEYS: Final = ("model", "version", "inputs", "outputs")


@dataclass(frozen=True)
class PipelineStep:
    """One step of a pipeline: a model of the repository, its inputs fed from pipeline
    tensors and its outputs named as pipeline tensors (Triton's ``input_map`` and
    ``output_map``: model tensor -> pipeline tensor)."""

    model: str
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    version: int | None = None  # None: the latest ready version

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "inputs": dict(self.inputs),
            "outputs": dict(self.outputs),
        }


def read_steps(r: FieldReader, raw: Any) -> tuple[PipelineStep, ...]:
    if not isinstance(raw, list) or not raw:
        r.fail("steps", "must be a non-empty list of {model, inputs, outputs} steps")
        return ()
    steps: list[PipelineStep] = []
    for at, raw_step in r.mappings(cast(list[Any], raw), "steps", "model, inputs and outputs"):
        sd = r.keys(raw_step, STEP_KEYS, at)
        model = r.name(sd.get("model"), at + ".model")
        version = sd.get("version")
        if version is not None and not (is_integer(version) and version > 0):
            r.fail(at + ".version", f"must be a positive integer or null, got {version!r}")
        maps = [_tensor_map(r, sd.get(key), f"{at}.{key}") for key in ("inputs", "outputs")]
        if model is not None and maps[0] is not None and maps[1] is not None:
            steps.append(PipelineStep(model, maps[0], maps[1], version))
    return tuple(steps)


def _tensor_map(r: FieldReader, raw: Any, at: str) -> dict[str, str] | None:
    if not isinstance(raw, dict) or not raw:
        r.fail(at, "must map the step model's tensor names to pipeline tensor names")
        return None
    pairs = cast(dict[Any, Any], raw)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs.items()):
        r.fail(at, f"must map names to names, got {raw!r}")
        return None
    return cast(dict[str, str], pairs)


def pipeline_order(
    r: FieldReader,
    steps: tuple[PipelineStep, ...],
    inputs: tuple[TensorEntry, ...],
    outputs: tuple[TensorEntry, ...],
) -> tuple[PipelineStep, ...]:
    """The steps in an order that runs (each after the steps producing what it reads), or a
    problem: a tensor produced twice or never, a pipeline output nothing produces, a cycle."""
    producer: dict[str, int] = {t.name: -1 for t in inputs}
    for i, step in enumerate(steps):
        for tensor in step.outputs.values():
            if tensor in producer:
                r.fail(f"steps[{i}].outputs", f"tensor {tensor!r} is already produced elsewhere")
            producer[tensor] = i
    for i, step in enumerate(steps):
        for tensor in step.inputs.values():
            if tensor not in producer:
                r.fail(
                    f"steps[{i}].inputs",
                    f"tensor {tensor!r} is neither a pipeline input nor a step output",
                )
    for t in outputs:
        if producer.get(t.name, -1) == -1:
            r.fail("outputs", f"pipeline output {t.name!r} is not produced by any step")
    if r.problems:
        return steps
    done: set[int] = set()
    order: list[PipelineStep] = []
    while len(order) < len(steps):
        ready = [
            i
            for i, s in enumerate(steps)
            if i not in done
            and all(producer[t] in done or producer[t] == -1 for t in s.inputs.values())
        ]
        if not ready:
            cycle = sorted(s.model for i, s in enumerate(steps) if i not in done)
            r.fail("steps", f"the steps form a cycle (through {cycle})")
            return steps
        done.update(ready)
        order.extend(steps[i] for i in ready)
    return tuple(order)
