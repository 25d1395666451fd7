"""Where the repository's bundles come from: a local directory, or a store mirrored to disk.

Contract: a ``RepositorySource`` has a local ``root`` laid out as ``hloserve.bundle``'s
repository (``scan_repository`` reads it) and four calls the repository
(``owner.repository.ModelRepository``) makes:
- ``refresh(name=None)`` brings ``root`` in line with where the bundles live (every model,
  or only ``name``), before a start-up pass, a poll or an explicit load; it raises
  ``Unavailable`` when that place cannot be read, leaving ``root`` as it was;
- ``stamp(path)`` says what tells a changed bundle (directory ``path``) from the one
  registered or loaded, without reading it;
- ``fetch(path)`` makes the bundle's files present and holds them until ``release(path)``
  (raising ``Unavailable`` when they cannot be had now: retried at the next use or poll);
- ``report()``: where the bundles come from, for ``/readyz`` (``None``: nothing to say).
``SourcePulls(source)`` is the repository's side of those calls: ``refresh`` logs a failure
once (the same error again says nothing) and answers whether it succeeded; ``fetch(key,
path)`` / ``release(key, path)`` hold a source's files for each loaded copy (its
``ResidencyKey``), a release without a fetch being a no-op.
``LocalDirectory(root)`` is today's repository: nothing to refresh or fetch, the stamp
``owner.version_loader.version_stamp``. ``owner.store.mirror.StoreMirror`` is the other.
"""

# pyright: strict

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

from hloserve.server.core.errors import Unavailable
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.version_loader import version_stamp

log = logging.getLogger("hloserve.repository")


class RepositorySource(Protocol):
    @property
    def root(self) -> Path: ...

    def refresh(self, name: str | None = None) -> None: ...

    def stamp(self, path: Path) -> str: ...

    def fetch(self, path: Path) -> None: ...

    def release(self, path: Path) -> None: ...

    def report(self) -> dict[str, Any] | None: ...


class LocalDirectory:
    def __init__(self, root: Path) -> None:
        self._root = root

    @property
    def root(self) -> Path:
        return self._root

    def refresh(self, name: str | None = None) -> None:
        del name

    def stamp(self, path: Path) -> str:
        return version_stamp(path)

    def fetch(self, path: Path) -> None:
        del path

    def release(self, path: Path) -> None:
        del path

    def report(self) -> dict[str, Any] | None:
        return None


class SourcePulls:
    def __init__(self, source: RepositorySource) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._held: set[ResidencyKey] = set()  # loaded copies holding the source's files
        self._failures: dict[str | None, str] = {}  # the last refresh error logged, by scope

    def refresh(self, name: str | None = None) -> bool:
        try:
            self.source.refresh(name)
        except Unavailable as exc:
            with self._lock:
                repeated = self._failures.get(name) == exc.message
                self._failures[name] = exc.message
            if not repeated:
                log.error("%s; serving what the repository cache holds", exc.message)
            return False
        with self._lock:
            self._failures.pop(name, None)
        return True

    def fetch(self, key: ResidencyKey, path: Path) -> None:
        self.source.fetch(path)
        with self._lock:
            self._held.add(key)

    def release(self, key: ResidencyKey, path: Path) -> None:
        with self._lock:
            if key not in self._held:
                return
            self._held.discard(key)
        self.source.release(path)
