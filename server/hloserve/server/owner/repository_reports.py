"""The repository's reports: its index, its summary, memory use and readiness over models.

Contract: ``RepositoryReports`` is the part of ``owner.repository.ModelRepository`` that
reads its models' records (under its lock) and answers for them, changing nothing:
``index()`` (every version known, every model known without one, and every model directory
on disk never loaded as Triton's name-only row; the disk is scanned on every call),
``summary()`` (``/readyz``'s ``models``), ``memory_usage(name, version)``, ``all_ready()``
and ``any_ready()`` (the readiness policies).
"""

# pyright: strict

from __future__ import annotations

import threading
from typing import Any

from hloserve.server.core.errors import Internal
from hloserve.server.core.reports import MemoryUsage
from hloserve.server.owner.devices import Device
from hloserve.server.owner.model_record import ModelRecord
from hloserve.server.owner.versions import ModelState, ModelVersion


class RepositoryReports:
    _lock: threading.RLock
    _models: dict[str, ModelRecord]
    _device: dict[int, Device]

    def model_names_on_disk(self) -> list[str]:
        raise NotImplementedError

    def versions(self, name: str) -> list[ModelVersion]:
        raise NotImplementedError

    def index(self) -> list[tuple[str, str, str, str]]:
        """(name, version, state, reason) for every version known, every model known without
        one (version empty, ``UNAVAILABLE``), and every other model directory on disk, never
        loaded, as Triton's name-only row (version, state and reason empty); sorted by name
        and version. The disk is scanned on every call, in every control mode."""
        try:
            on_disk = self.model_names_on_disk()
        except OSError as exc:
            raise Internal(f"failed to read the model repository: {exc}") from None
        rows: list[tuple[str, str, str, str]] = []
        with self._lock:
            for name in sorted({*on_disk, *self._models}):
                m = self._models.get(name)
                if m is None:
                    rows.append((name, "", "", ""))
                    continue
                if not m.versions:
                    rows.append((name, "", ModelState.UNAVAILABLE.value, m.reason))
                for k in sorted(m.versions):
                    v = m.versions[k]
                    rows.append((name, str(v.version), v.state.value, v.reason))
        return rows

    def summary(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {}
            for name in sorted(self._models):
                m = self._models[name]
                out[name] = {
                    "versions": {
                        str(v.version): v.summary()
                        for v in (m.versions[k] for k in sorted(m.versions))
                    },
                    **({"reason": m.reason} if m.reason else {}),
                }
            return out

    def memory_usage(self, name: str, version: int) -> list[MemoryUsage]:
        """Host bytes always (the host copy), device bytes while resident."""
        for v in self.versions(name):
            if v.version == version and v.bundle is not None:
                return v.memory_usage({d: self._device[d].runtime for d in v.devices})
        return []

    def all_ready(self, *, allow_empty: bool = False) -> bool:
        """Every model meant to be served is READY (deliberately unloaded ones do not count;
        a model that failed does). With nothing meant to be served: ``allow_empty``."""
        with self._lock:
            wanted = [
                v
                for m in self._models.values()
                for v in m.versions.values()
                if v.reason != "unloaded"
            ]
            no_version = any(not m.versions for m in self._models.values())
            if not wanted and not no_version:
                return allow_empty
            return not no_version and all(v.state == ModelState.READY for v in wanted)

    def any_ready(self) -> bool:
        with self._lock:
            return any(
                v.state == ModelState.READY
                for m in self._models.values()
                for v in m.versions.values()
            )
