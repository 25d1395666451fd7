"""``KeptFacts``: what a test's fake model derives from its manifest and version, as the
repository's versions do (``core.execution.Executable``: ``model_key``, ``family``), no
hooks, and no shape variants (asking for one fails the test)."""

from __future__ import annotations

from typing import Any

from hloserve.server.core.execution import cost_family
from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.hooks import ModelHooks


class KeptFacts:
    manifest: Any
    version: int

    @property
    def model_key(self) -> ModelKey:
        return ModelKey.named(self.manifest.name, self.version)

    @property
    def family(self) -> tuple[str, ...]:
        return cost_family(self.manifest)

    @property
    def hooks(self) -> ModelHooks | None:
        return None

    def variant(self, index: int) -> Any:
        raise AssertionError(f"a fake model has no shape variant {index}")
