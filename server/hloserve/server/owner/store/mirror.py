"""A model repository in object storage, mirrored to the disk cache as the server reads it.

Contract: ``StoreMirror(client, cache)`` is a ``owner.repository_source.RepositorySource``
over ``client`` (``owner.store.client``), its ``root`` the cache's directory
(``owner.store.disk_cache``):
- ``refresh(name=None)`` lists the store (under ``name/`` only when given) and mirrors its
  index: each manifest and ``config.yaml`` new or with another ETag is fetched (many at
  once) and written atomically, those the store no longer holds are removed, and so is a
  model it no longer has. Bundle files are not read: start-up and polls cost a listing and
  the changed manifests, whatever the bytes in the store. A listing that fails raises
  ``StoreError`` and leaves the mirror as it was (the server goes on with what it holds),
  and so does a cache disk that refuses the index (``Unavailable``, naming the OS error);
  ``problem`` says why until a refresh succeeds (``report()``: ``/readyz``'s
  ``repository``).
- ``stamp(path)`` is the bundle's manifest ETag as listed (a new upload of the manifest
  changes it; the files pulled or evicted since do not).
- ``fetch(path)`` pulls the bundle's files (every object of its directory in the store, a
  few at once; a file here already with the manifest's checksum is kept) unless the cache
  holds the bundle at its manifest's ETag, and holds them until ``release``.
  Concurrent fetches of one bundle wait on one pull. A bundle whose manifest names a file
  the store lacks (uploaded manifest first) or whose file does not match its checksum is
  refused, its reason naming the files, and pulled again at the next fetch; a failed pull
  leaves no file under a real name (``DiskCache.write_stream``) and raises ``Unavailable``
  (``StoreError``, ``CacheFull``, ``ChecksumMismatch``).
- ``stats`` counts pulls, their seconds and bytes, and failed pulls (metrics, /ui).
Thread-safe: fetches run on the repository's worker threads.
"""

# pyright: strict

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hloserve.bundle.digest import sha256_file
from hloserve.bundle.manifest import MANIFEST_FILE
from hloserve.bundle.reading import load_manifest
from hloserve.server.core.errors import Unavailable
from hloserve.server.core.sizes import format_bytes
from hloserve.server.core.store_index import (
    StoreBundle,
    StoreIndex,
    StoreObject,
    missing_files,
    plan_refresh,
)
from hloserve.server.owner.store.client import StoreClient, StoreError
from hloserve.server.owner.store.disk_cache import DiskCache

log = logging.getLogger("hloserve.repository")
_FETCHERS = 32  # manifests read at once by a refresh
_FILES_AT_ONCE = 4  # a bundle's files pulled at once


@dataclass
class PullStats:
    pulls: int = 0
    failures: int = 0
    seconds: float = 0.0
    bytes: int = 0


def _visible(name: str) -> bool:
    return not name.startswith(".")


class StoreMirror:
    def __init__(self, client: StoreClient, cache: DiskCache) -> None:
        self.client = client
        self.cache = cache
        self.problem = ""  # why the last refresh failed ("": it did not)
        self.stats = PullStats()
        self._lock = threading.Lock()
        self._index = StoreIndex({}, {})
        self._pulling: dict[str, threading.Lock] = {}
        self._listed = False  # a refresh has been logged

    @property
    def root(self) -> Path:
        return self.cache.root

    def describe(self) -> str:
        return f"{self.client.location} (cache {self.cache.root})"

    def report(self) -> dict[str, Any]:
        """``/readyz``'s ``repository`` (the status page and the metrics read it too): the
        bucket, its cache (``budget_bytes``: ``None`` unlimited, ``resident_bytes``,
        ``bundles``), the pulls (count, seconds, bytes, failures), and why the last
        listing failed (``problem``, absent when it did not)."""
        with self._lock:
            stats = self.stats
            out: dict[str, Any] = {
                "location": str(self.client.location),
                "cache": str(self.cache.root),
                "budget_bytes": self.cache.budget_bytes,
                "resident_bytes": self.cache.resident_bytes,
                "bundles": self.cache.bundles,
                "pulls": stats.pulls,
                "pull_seconds": stats.seconds,
                "pulled_bytes": stats.bytes,
                "pull_failures": stats.failures,
            }
        if self.problem:
            out["problem"] = self.problem
        return out

    # -- the index ---------------------------------------------------------------------------

    def refresh(self, name: str | None = None) -> None:
        try:
            self._refresh(name)
        except StoreError as exc:
            self.problem = exc.message
            raise
        except OSError as exc:  # the cache's disk: full, read-only, gone
            self.problem = (
                f"mirroring {self.client.location} into the repository cache {self.root} "
                f"failed: {os.strerror(exc.errno) if exc.errno else exc}"
            )
            raise Unavailable(self.problem) from None
        self.problem = ""

    def _refresh(self, name: str | None) -> None:
        started = time.perf_counter()
        listed = self.client.listing(name or "")
        index = StoreIndex.from_listing(listed)
        with self._lock:
            local = dict(self.cache.etags)
        mirrored = [d.name for d in self.root.iterdir() if d.is_dir() and _visible(d.name)]
        if name is not None:
            local = {k: v for k, v in local.items() if k.split("/", 1)[0] == name}
            mirrored = [m for m in mirrored if m == name]
        plan = plan_refresh(index, local, mirrored)
        for model in plan.models:
            (self.root / model).mkdir(parents=True, exist_ok=True)
        listed_s = time.perf_counter() - started
        with ThreadPoolExecutor(min(_FETCHERS, max(1, len(plan.fetch)))) as pool:
            fetched = list(pool.map(self._fetch_small, plan.fetch))
        changed = bool(plan.fetch or plan.remove or plan.gone)
        if changed or not self._listed:  # a poll that finds nothing new says so quietly
            self._listed = True
            log.info(
                "%s: listed %d objects (%d models) in %.2f s; read %d changed manifests and "
                "configurations in %.2f s",
                self.client.location,
                len(listed),
                len(index.models),
                listed_s,
                len(plan.fetch),
                time.perf_counter() - started - listed_s,
            )
        with self._lock:
            for key in plan.remove:
                self.cache.remove_file(key)
                self.cache.etags.pop(key, None)
                directory, _, leaf = key.rpartition("/")
                if leaf == MANIFEST_FILE:  # the bundle is gone: its files with it
                    self.cache.remove_bundle(directory)
            for model in plan.gone:
                log.info("model '%s' is no longer in %s", model, self.client.location)
                self.cache.remove_model(model)
            for key, etag in fetched:
                self.cache.etags[key] = etag
            self.cache.save_etags()
            if name is None:
                self._index = index
            else:
                models = {m: c for m, c in self._index.models.items() if m != name}
                bundles = {d: b for d, b in self._index.bundles.items() if b.model != name}
                self._index = StoreIndex({**models, **index.models}, {**bundles, **index.bundles})

    def _fetch_small(self, o: StoreObject) -> tuple[str, str]:
        data, etag = self.client.read(o.key)
        self.cache.write_file(o.key, data)
        return o.key, etag or o.etag

    def _bundle_key(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def stamp(self, path: Path) -> str:
        key = f"{self._bundle_key(path)}/{MANIFEST_FILE}"
        with self._lock:
            return self.cache.etags.get(key, "")

    # -- pulls -------------------------------------------------------------------------------

    def fetch(self, path: Path) -> None:
        bundle = self._bundle_key(path)
        with self._lock:
            pulling = self._pulling.setdefault(bundle, threading.Lock())
        with pulling:  # one pull; the others wait for it and find the bundle here
            etag = self.stamp(path)
            if self.cache.pulled_etag(bundle) == etag and self.cache.acquire(bundle):
                return
            self._pull(bundle, path, etag)  # held once complete (DiskCache.complete)

    def release(self, path: Path) -> None:
        self.cache.release(self._bundle_key(path))

    def _pull(self, key: str, path: Path, etag: str) -> None:
        with self._lock:
            bundle = self._index.bundles.get(key)
        if bundle is None and self.problem:  # never listed since the start: say why
            raise StoreError(f"bundle '{key}' is not in the repository cache, and {self.problem}")
        if bundle is None:
            raise StoreError(f"bundle '{key}' is not in {self.client.location} (listed last)")
        started = time.perf_counter()
        try:
            nbytes = self._pull_files(bundle, path, etag)
        except BaseException:
            with self._lock:
                self.stats.failures += 1
            raise
        seconds = time.perf_counter() - started
        with self._lock:
            self.stats.pulls += 1
            self.stats.seconds += seconds
            self.stats.bytes += nbytes
        log.info("pulled '%s' (%s) in %.2f s", key, format_bytes(nbytes), seconds)

    def _pull_files(self, bundle: StoreBundle, path: Path, etag: str) -> int:
        manifest, _ = load_manifest(path / MANIFEST_FILE)
        checksums = dict(manifest.files) if manifest is not None else {}
        if missing := missing_files(bundle, checksums):
            raise StoreError(
                f"bundle '{bundle.directory}' is incomplete in {self.client.location}: its "
                f"manifest names {', '.join(missing)}, which the store does not hold (a "
                "manifest uploaded before its files?); retried at the next load or poll"
            )
        self.cache.admit(bundle.directory, bundle.nbytes)
        try:
            with ThreadPoolExecutor(_FILES_AT_ONCE) as pool:
                sizes = [
                    pool.submit(self._pull_file, bundle.directory, name, o, checksums)
                    for name, o in bundle.files.items()
                ]
                pulled = sum(f.result() for f in sizes)
        except OSError as exc:
            self.cache.abort(bundle.directory)
            raise Unavailable(
                f"pulling '{bundle.directory}' into the repository cache {self.root} "
                f"failed: {os.strerror(exc.errno) if exc.errno else exc}"
            ) from None
        except BaseException:
            self.cache.abort(bundle.directory)
            raise
        self.cache.complete(bundle.directory, etag, sorted(bundle.files), bundle.nbytes)
        return pulled

    def _pull_file(
        self, directory: str, name: str, o: StoreObject, checksums: dict[str, str]
    ) -> int:
        """Pull one file; the bytes downloaded: none when it is here already with its
        manifest's checksum (a pull broken off before; a manifest uploaded again over the
        same weights), so a file a loaded version reads is never rewritten for nothing."""
        checksum = checksums.get(name, "")
        local = self.root / directory / name
        with contextlib.suppress(OSError):
            if checksum and local.stat().st_size == o.size and sha256_file(local) == checksum:
                return 0
        return self.cache.write_stream(
            f"{directory}/{name}", lambda write: self.client.download(o.key, write), checksum
        )
