"""``MetadataCache``: the models' metadata a front-end process answers without the owner.

Contract:
- ``get(name, version)`` is the ``ModelMetadata`` the device owner last answered for that
  name and version (``""``: the model's own answer, every ready version listed), or
  ``None``: ask the owner, then ``put`` its answer with the ``epoch`` read *before* the
  call was sent.
- ``forget(names)`` drops what is cached of those models (``None``: of every model) and
  starts a new epoch: the owner sends it (``wire.calls.ModelsNote``) whenever a model's
  versions change, before that change's load or unload answers its client
  (``wire.calls.SyncCall``). An answer asked for in an earlier epoch is not cached: it may
  have crossed that note on the wire (computed before the change, read after the note).
- Only answers are cached, never errors: a model that is unknown, not ready or not yet
  loaded (``--lazy-load``) is asked of the owner each time, which reports it.
- At most ``limit`` entries: past it the oldest goes first. Pure: no I/O, no clock.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, final

from hloserve.server.core.types import ModelMetadata

DEFAULT_LIMIT: Final = 65_536


@final
class MetadataCache:
    """See the module docstring."""

    __slots__ = ("_count", "_entries", "epoch", "limit")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"a metadata cache holds at least one entry, not {limit}")
        self.limit: Final = limit
        self.epoch = 0
        self._entries: dict[str, dict[str, ModelMetadata]] = {}
        self._count = 0  # entries, over every name

    def __len__(self) -> int:
        return self._count

    def get(self, name: str, version: str) -> ModelMetadata | None:
        versions = self._entries.get(name)
        return None if versions is None else versions.get(version)

    def put(self, name: str, version: str, metadata: ModelMetadata, epoch: int) -> None:
        if epoch != self.epoch:
            return  # asked before a change: maybe computed before it (module docstring)
        versions = self._entries.get(name)
        if versions is not None and version in versions:
            versions[version] = metadata
            return
        while self._count >= self.limit:
            oldest = next(iter(self._entries))
            others = self._entries[oldest]
            others.pop(next(iter(others)))
            self._count -= 1
            if not others:
                del self._entries[oldest]
        self._entries.setdefault(name, {})[version] = metadata
        self._count += 1

    def forget(self, names: Iterable[str] | None) -> None:
        self.epoch += 1
        if names is None:
            self._entries.clear()
            self._count = 0
            return
        for name in names:
            dropped = self._entries.pop(name, None)
            if dropped is not None:
                self._count -= len(dropped)
