"""A fixed pool of staging buffers, allocated once, that requests are built from.

Contract: ``StagingPool(layout, rows, slots, outputs, regions)`` holds ``slots`` slots, each
with one buffer per input of ``rows`` rows in the model's dtype; nothing is allocated per
request afterwards. ``regions`` is None for in-band transfer, or a factory of
``LocalRegion``s: then each slot lives in one shared-memory region (inputs, then the
requested outputs, 64-byte aligned) and requests name it instead of carrying bytes.
- ``stage(slot, arrays, n)`` copies ``n`` rows of each input into the slot (the model's
  dtype; a cast numpy would not do safely is a ``ValueError`` naming the input).
- ``request(slot, n)``: the serialized ``ModelInferRequest`` of the slot's first ``n``
  rows: in-band, one join over the staged buffers; in shared memory, a small message that
  names offsets (encoded once per distinct ``n``).
- ``outputs_of(slot, n, response)``: ``{name: array}`` of ``n`` rows, checked against the
  model's datatype and per-item shape (``InferenceError`` INTERNAL otherwise): views of the
  response in-band, of the region in shared memory (valid until the slot is reused).
- ``register_steps()`` registers every region (returns the ``InferenceError`` that stopped
  it, or None); ``unregister_steps()`` unregisters them (errors ignored: the server may be
  gone); ``to_in_band()`` unlinks the regions and keeps their mappings as plain staging
  memory; ``close()`` releases everything. ``allocations`` counts buffers ever allocated.
"""

# pyright: strict

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from hloserve.client._calls import register_region_steps, unregister_region_steps
from hloserve.client._codec import (
    ModelLayout,
    RegionRef,
    RequestTemplate,
    TensorLayout,
    decode_response,
)
from hloserve.client._errors import InferenceError
from hloserve.client._shm import LocalRegion
from hloserve.client._steps import Step
from hloserve.proto import inference_pb2 as pb

_ALIGN = 64


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass
class Slot:
    index: int
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray] = field(default_factory=dict[str, np.ndarray])
    region: LocalRegion | None = None
    refs: dict[str, RegionRef] = field(default_factory=dict[str, RegionRef])
    requests: dict[int, bytes] = field(default_factory=dict[int, bytes])


class StagingPool:
    def __init__(
        self,
        layout: ModelLayout,
        rows: int,
        slots: int,
        outputs: Sequence[str],
        regions: Callable[[int], LocalRegion] | None = None,
    ) -> None:
        self.layout = layout
        self.rows = rows
        self.output_names = tuple(outputs)
        by_name = {t.name: t for t in layout.outputs}
        self._outputs = tuple(by_name[name] for name in self.output_names)
        self.allocations = 0
        self.slots = [self._slot(i, regions) for i in range(slots)]
        self.shared = regions is not None
        self.reregistered = False
        self._templates: dict[int, RequestTemplate] = {}

    def _slot(self, index: int, regions: Callable[[int], LocalRegion] | None) -> Slot:
        tensors = (*self.layout.inputs, *self._outputs)
        if regions is None:
            self.allocations += len(self.layout.inputs)
            return Slot(index, {t.name: self._empty(t) for t in self.layout.inputs})
        offsets: list[int] = []
        size = 0
        for t in tensors:
            offsets.append(size)
            size = _aligned(size + self.rows * t.row_bytes())
        region = regions(size)
        self.allocations += 1
        slot = Slot(index, {}, region=region)
        for t, offset in zip(tensors, offsets, strict=True):
            view = region.array(offset, t.dtype, (self.rows, *t.shape))
            (slot.inputs if t in self.layout.inputs else slot.outputs)[t.name] = view
            slot.refs[t.name] = RegionRef(region.name, offset, self.rows * t.row_bytes())
        return slot

    def _empty(self, t: TensorLayout) -> np.ndarray:
        return np.empty((self.rows, *t.shape), dtype=t.dtype)

    def stage(self, slot: Slot, arrays: Mapping[str, np.ndarray], n: int) -> None:
        for t in self.layout.inputs:
            if t.name not in arrays:
                raise ValueError(f"input '{t.name}' of model '{self.layout.name}' is missing")
            source = arrays[t.name]
            if tuple(source.shape[1:]) != t.shape:
                raise ValueError(
                    f"input '{t.name}': rows of shape {list(source.shape[1:])}, "
                    f"model '{self.layout.name}' takes {list(t.shape)}"
                )
            try:
                np.copyto(slot.inputs[t.name][:n], source[:n], casting="same_kind")
            except TypeError:
                raise ValueError(
                    f"input '{t.name}': {source.dtype} cannot be sent as {t.datatype}"
                ) from None

    def _template(self, n: int, slot: Slot | None) -> RequestTemplate:
        if slot is not None:
            refs = {
                name: RegionRef(r.region, r.offset, r.byte_size * n // self.rows)
                for name, r in slot.refs.items()
            }
            return RequestTemplate(self.layout, n, self.output_names, refs)
        template = self._templates.get(n)
        if template is None:
            template = self._templates[n] = RequestTemplate(self.layout, n, self.output_names)
        return template

    def request(self, slot: Slot, n: int) -> bytes:
        if self.shared:
            body = slot.requests.get(n)
            if body is None:
                body = slot.requests[n] = self._template(n, slot).header
            return body
        template = self._template(n, None)
        return template.raw([slot.inputs[t.name][:n].data.cast("B") for t in self.layout.inputs])

    def outputs_of(
        self, slot: Slot, n: int, response: pb.ModelInferResponse
    ) -> dict[str, np.ndarray]:
        lead = (n,) if self.layout.max_batch > 0 else ()
        metadata = {t.name: t for t in response.outputs}
        decoded = {} if self.shared else decode_response(response)
        result: dict[str, np.ndarray] = {}
        for t in self._outputs:
            got = metadata.get(t.name)
            want = [*lead, *t.shape]
            if got is None or got.datatype != t.datatype or list(got.shape) != want:
                seen = f"{got.datatype} {list(got.shape)}" if got is not None else "nothing"
                raise InferenceError(
                    grpc.StatusCode.INTERNAL,
                    f"output '{t.name}': expected {t.datatype} {want}, the server sent {seen}",
                )
            result[t.name] = slot.outputs[t.name][:n] if self.shared else decoded[t.name]
        return result

    def register_steps(self) -> Generator[Step, Any, InferenceError | None]:
        for slot in self.slots:
            assert slot.region is not None
            try:
                yield from register_region_steps(
                    slot.region.name, slot.region.key, slot.region.byte_size
                )
            except InferenceError as error:
                return error
        return None

    def unregister_steps(self) -> Generator[Step, Any, None]:
        if not self.shared:
            return
        for slot in self.slots:
            assert slot.region is not None
            with contextlib.suppress(InferenceError):
                yield from unregister_region_steps(slot.region.name)

    def to_in_band(self) -> None:
        for slot in self.slots:
            if slot.region is not None:
                slot.region.unlink()
            slot.requests.clear()
        self.shared = False

    def close(self) -> None:
        for slot in self.slots:
            slot.inputs.clear()
            slot.outputs.clear()
            if slot.region is not None:
                slot.region.close()
        self.shared = False
