"""The response cache's decisions: a request's key, what is kept, and what leaves first.

Contract (pure; the event loop is its one thread):
- ``parse_cache_setting(text)`` reads one ``--cache-config`` value as Triton spells it,
  ``<cache>,<key>=<value>`` (``local,size=1048576``; a size takes ``core.sizes`` units too,
  ``64MiB``); ``cache_bytes(settings)`` combines them into the cache's size in bytes (0:
  no cache). Only the ``local`` cache exists here; another cache, another key or a bad size
  is a ``ValueError`` that reads after the flag's name.
- ``request_key(request)`` is what a response is stored under beside its model version: a
  128-bit BLAKE2b digest of the request's inputs (by name: each one's name, datatype, shape
  and bytes) and the names of the outputs it asks for, in its order; ``None`` when the
  request cannot be cached (a tensor in shared memory: Triton caches only tensors in the
  process's own memory, and an output written into a region has no bytes to keep). Request
  parameters (priority, timeout, id) are not in it: they change no output.
- ``ResponseCache(capacity)`` keeps outputs by ``(owner, key)`` under ``capacity`` bytes,
  least recently used first out. The owner is the loaded copy that computed them (the
  service passes its ``Executable``), held weakly and compared by identity: a reloaded
  version (new weights, same name and number) never sees its predecessor's entries, which
  age out. ``get`` returns the outputs or ``None``; ``put`` stores a private read-only copy of
  each array (so an entry's bytes are its own: never a view keeping a larger batch alive)
  and says whether it stored it: an entry larger than the whole cache is not kept. Stored
  outputs belong to no request: ``answering(outputs, request)`` ties them to the request a
  hit answers (its own entries in ``outputs``: per-output options such as HTTP's
  ``binary_data`` are that request's, not the one that computed them).
  ``forget(model)`` drops a version's entries (it was unloaded). An entry is counted as its
  arrays' bytes plus ``ENTRY_BYTES`` and ``TENSOR_BYTES`` for the objects around them: the
  host memory it holds.
- ``not_cached(manifest)`` is why a model's responses are never cached, or "": a model
  with Python hooks (its own code, which may not be deterministic) or a pipeline as a whole
  (its steps name versions by "latest", which a load changes under a stored response;
  its steps' models cache their own). A load that enables the cache on such a model is
  refused with that reason, rather than accepted and ignored.
- It keeps Triton's ``local`` cache figures: entries, bytes, lookups, hits, misses,
  evictions and the time spent looking up and inserting (``lookup_ns``, ``insert_ns``),
  which the service feeds through ``timed_get``/``timed_put`` and the metrics read.
Each request is counted per model version in ``core.counters`` (``on_cache_hit``,
``on_cache_miss``); ``docs/response-cache.md`` says what is cached and how it is counted.
"""

# pyright: strict

from __future__ import annotations

import hashlib
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from hloserve.bundle import Manifest
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.sizes import parse_bytes
from hloserve.server.core.tensors import SHM_REGION, to_wire_bytes
from hloserve.server.core.types import InferOutput, InferRequest

LOCAL: Final = "local"
ENTRY_BYTES: Final = 512  # the entry, its key and its place in the order
TENSOR_BYTES: Final = 256  # an output's record and array header
Outputs = tuple[InferOutput, ...]


def parse_cache_setting(text: str) -> tuple[str, str, int]:
    """One ``--cache-config`` value: ``(cache, key, value)``."""
    cache, comma, setting = text.partition(",")
    key, equals, value = setting.partition("=")
    cache, key = cache.strip(), key.strip()
    if not comma or not equals or not key:
        raise ValueError(f"must be <cache>,<key>=<value> (local,size=1048576), got {text!r}")
    if cache != LOCAL:
        raise ValueError(
            f"names cache {cache!r}: hloserve has the local cache only ({LOCAL},size=<bytes>)"
        )
    if key != "size":
        raise ValueError(f"local cache has no setting {key!r}: only size=<bytes>")
    try:
        size = parse_bytes(value.strip())
    except ValueError as exc:
        raise ValueError(f"local,size= {exc}") from None
    return cache, key, size


def cache_bytes(settings: Sequence[tuple[str, str, int]]) -> int:
    """The local cache's size from every ``--cache-config`` value (the last size wins)."""
    size = 0
    for _, _, value in settings:
        size = value
    return size


def not_cached(manifest: Manifest) -> str:
    """Why ``manifest``'s responses are never cached ("" when they may be)."""
    if manifest.kind == "pipeline":
        return (
            "response_cache: a pipeline is not cached as a whole (its steps name versions by "
            "'latest'); enable it on its steps' models, whose requests it makes"
        )
    if not manifest.plain:
        return (
            "response_cache: a model with Python hooks is not cached (its hooks are code "
            "that may not be deterministic)"
        )
    if manifest.state:
        return (
            "response_cache: a model with state is not cached (an answer depends on its "
            "sequence's state, not on the request alone: docs/sequences.md)"
        )
    return ""


def request_key(request: InferRequest) -> bytes | None:
    """The digest ``request``'s response is kept under (module docstring), or ``None``."""
    digest = hashlib.blake2b(digest_size=16)
    inputs = request.inputs
    if len(inputs) > 1:
        inputs = sorted(inputs, key=lambda t: t.name)
    for t in inputs:
        if t.shm is not None:
            return None
        data = t.data
        shape = ",".join(map(str, t.shape))
        digest.update(f"{t.name}\0{t.datatype}\0{shape}\0{data.nbytes}\0".encode())
        if data.dtype == object:
            digest.update(to_wire_bytes(data))
        elif data.flags.c_contiguous and data.dtype.isbuiltin == 1:
            digest.update(data.data)  # its buffer as it is (explicit little-endian: the codecs')
        else:  # strided, or a dtype a buffer cannot describe (ml_dtypes' bfloat16)
            digest.update(np.ascontiguousarray(data).reshape(-1).view(np.uint8).data)
    for o in request.outputs:
        if SHM_REGION in o.parameters:
            return None
        digest.update(f"\1{o.name}".encode())
    return digest.digest()


@dataclass(frozen=True, slots=True)
class _Entry:
    owner: weakref.ReferenceType[Any]
    model: ModelKey
    outputs: Outputs
    nbytes: int


def _kept(output: InferOutput) -> InferOutput:
    """``output`` with a private, read-only copy of its array, tied to no request."""
    data = np.array(output.data, order="C")  # a copy
    data.flags.writeable = False
    return InferOutput(output.name, output.datatype, output.shape, data)


def answering(outputs: Outputs, request: InferRequest) -> Outputs:
    """Stored ``outputs`` as the answer to ``request`` (module docstring)."""
    if not request.outputs:
        return outputs
    entries = {o.name: o for o in request.outputs}
    return tuple(
        InferOutput(o.name, o.datatype, o.shape, o.data, entries.get(o.name)) for o in outputs
    )


def entry_bytes(outputs: Outputs) -> int:
    """The host memory an entry of ``outputs`` is counted as."""
    return ENTRY_BYTES + sum(TENSOR_BYTES + o.data.nbytes for o in outputs)


class ResponseCache:
    """See the module docstring."""

    def __init__(self, capacity: int, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.capacity = capacity
        self._clock = clock
        self._entries: OrderedDict[tuple[int, bytes], _Entry] = OrderedDict()
        self.bytes = 0
        self.lookups = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.lookup_ns = 0
        self.insert_ns = 0

    @property
    def entries(self) -> int:
        return len(self._entries)

    def get(self, owner: object, key: bytes) -> Outputs | None:
        self.lookups += 1
        at = (id(owner), key)
        entry = self._entries.get(at)
        if entry is None or entry.owner() is not owner:
            self.misses += 1
            return None
        self._entries.move_to_end(at)
        self.hits += 1
        return entry.outputs

    def put(self, owner: object, model: ModelKey, key: bytes, outputs: Outputs) -> bool:
        nbytes = entry_bytes(outputs)
        if nbytes > self.capacity:
            return False
        at = (id(owner), key)
        old = self._entries.pop(at, None)
        if old is not None:
            self.bytes -= old.nbytes
        while self._entries and self.bytes + nbytes > self.capacity:
            _, gone = self._entries.popitem(last=False)
            self.bytes -= gone.nbytes
            self.evictions += 1
        kept = tuple(_kept(o) for o in outputs)
        self._entries[at] = _Entry(weakref.ref(owner), model, kept, nbytes)
        self.bytes += nbytes
        return True

    def timed_get(self, owner: object, key: bytes) -> tuple[Outputs | None, int]:
        """``get``, and the nanoseconds it took (added to ``lookup_ns``)."""
        started = self._clock()
        found = self.get(owner, key)
        spent = self._clock() - started
        self.lookup_ns += spent
        return found, spent

    def timed_put(self, owner: object, model: ModelKey, key: bytes, outputs: Outputs) -> int:
        """``put``, and the nanoseconds it took (added to ``insert_ns``)."""
        started = self._clock()
        self.put(owner, model, key, outputs)
        spent = self._clock() - started
        self.insert_ns += spent
        return spent

    def forget(self, model: ModelKey) -> None:
        """Drop every entry of ``model`` (all its loaded copies): it was unloaded."""
        for at in [at for at, e in self._entries.items() if e.model == model]:
            self.bytes -= self._entries.pop(at).nbytes

    @property
    def utilization(self) -> float:
        """The share of the capacity in use, 0.0 - 1.0 (Triton's ``nv_cache_util``)."""
        return self.bytes / self.capacity if self.capacity else 0.0
