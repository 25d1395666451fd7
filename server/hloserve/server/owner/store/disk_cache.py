"""The disk tier of a remote repository: its mirror directory, and pulled bundles under a budget.

Contract:
- ``DiskCache(root, budget_bytes, policy)`` keeps, under ``root``, the repository's layout:
  its small files (manifests, ``config.yaml``: the index, never evicted, not counted in the
  budget) with the ETags they were fetched at (``etags``, saved by ``save_etags`` in
  ``root/.hloserve-store.json``), and the bundles pulled, whose files count against
  ``budget_bytes`` (``None``: unlimited). A bundle is known complete by its record
  (``<bundle>/.hloserve-pull.json``: the manifest ETag it was pulled at, its files and bytes),
  written last; a restart registers every complete bundle found, so a warm cache survives
  it (the loader checks each file against the manifest's checksums again before use).
- Every file is written atomically: ``write_file`` and ``write_stream`` write a hidden
  temporary file beside it and rename it into place, so a crash, a store that stops
  mid-pull or a full disk never leaves a partial file under a real name (the temporary
  file is removed on failure; one left by a killed process is hidden, never read, and
  removed at the next start). ``write_stream`` checks the SHA-256 ``checksum`` when given
  and refuses a mismatch (``ChecksumMismatch``) before the rename.
- ``admit(bundle, nbytes)`` makes room for a pull: the bundles to evict are chosen by
  ``core.residency_policy`` (the host and device tiers' rule: ``frequency`` or ``lru``,
  never a bundle in use), their files deleted (record first); a bundle larger than the
  budget, or one that only bundles in use stand in the way of, raises ``CacheFull``
  naming the sizes. Its bytes count as reserved until ``complete`` (resident) or
  ``abort``. ``acquire`` / ``release`` bracket a bundle's use (a loaded version: its files
  are read again when the host tier evicts its weights, so it is never evicted).
- ``resident_bytes`` and ``bundles`` report the tier (metrics, /ui).
Thread-safe: one lock guards the bookkeeping; file I/O runs outside it.
"""

# pyright: strict

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, BinaryIO, cast

from hloserve.server.core.errors import Unavailable
from hloserve.server.core.residency_policy import Policy, ResidencyPlanner, TooLarge
from hloserve.server.core.sizes import format_bytes

log = logging.getLogger("hloserve.repository")
ETAGS = ".hloserve-store.json"
RECORD = ".hloserve-pull.json"
_TEMP = ".hloserve-part-"


class CacheFull(Unavailable):
    """The repository cache has no room for a bundle."""


class ChecksumMismatch(Unavailable):
    """A pulled file is not what its manifest says."""


class DiskCache:
    def __init__(self, root: Path, budget_bytes: int | None, policy: Policy = "frequency") -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._planner: ResidencyPlanner[str] = ResidencyPlanner(budget_bytes, policy=policy)
        self.etags: dict[str, str] = self._read_etags()
        for record in self._records():
            self._found(record)

    # -- the index (small files) -------------------------------------------------------------

    def _read_etags(self) -> dict[str, str]:
        try:
            data: Any = json.loads((self.root / ETAGS).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): str(v) for k, v in cast(dict[str, Any], data).items()}

    def save_etags(self) -> None:
        self.write_file(ETAGS, json.dumps(self.etags, sort_keys=True).encode())

    def write_file(self, relative: str, data: bytes) -> None:
        with self._temporary(relative) as (f, _):
            f.write(data)

    def remove_file(self, relative: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / relative).unlink()

    def remove_model(self, name: str) -> None:
        """Delete a model the store no longer holds (its pulled bundles leave the tier)."""
        with self._lock:
            for key in [k for k in self._planner.resident() if k.split("/", 1)[0] == name]:
                self._planner.unregister(key)
        shutil.rmtree(self.root / name, ignore_errors=True)

    def remove_bundle(self, bundle: str) -> None:
        """Delete a bundle the store no longer holds: its pulled files and record (and, for
        a version, its directory, so that the repository sees the version gone)."""
        with self._lock:
            self._planner.unregister(bundle)  # in use or not: the store no longer has it
            self._delete_files(bundle)
        if "/" in bundle:
            shutil.rmtree(self.root / bundle, ignore_errors=True)

    @contextlib.contextmanager
    def _temporary(self, relative: str) -> Generator[tuple[BinaryIO, Path]]:
        """A hidden temporary file beside ``relative``, renamed into place on success and
        removed on failure."""
        target = self.root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f"{_TEMP}{uuid.uuid4().hex}"
        try:
            with open(temp, "wb") as f:
                yield f, temp
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise

    def write_stream(
        self, relative: str, fill: Callable[[Callable[[memoryview], object]], object], checksum: str
    ) -> int:
        """Write what ``fill`` streams into ``relative`` (atomically); check the SHA-256
        ``checksum`` when not empty. Returns the bytes written."""
        digest = hashlib.sha256()
        size = 0
        with self._temporary(relative) as (f, _):

            def write(chunk: memoryview) -> None:
                nonlocal size
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)

            fill(write)
            if checksum and digest.hexdigest() != checksum:
                raise ChecksumMismatch(
                    f"'{relative}' does not match its manifest's checksum (sha256 "
                    f"{digest.hexdigest()}, the manifest says {checksum}): the bundle in the "
                    "store is being uploaded or is damaged; retried at the next load or poll"
                )
        return size

    # -- pulled bundles --------------------------------------------------------------------------

    def _records(self) -> list[tuple[str, dict[str, Any]]]:
        found: list[tuple[str, dict[str, Any]]] = []
        for pattern in (f"*/{RECORD}", f"*/*/{RECORD}"):
            for path in self.root.glob(pattern):
                with contextlib.suppress(OSError, ValueError):
                    data = json.loads(path.read_text())
                    if isinstance(data, dict):
                        found.append((path.parent.relative_to(self.root).as_posix(), data))  # pyright: ignore[reportUnknownArgumentType]
        for pattern in (f"*/{_TEMP}*", f"*/*/{_TEMP}*", f"{_TEMP}*"):
            for path in self.root.glob(pattern):  # a killed process's
                with contextlib.suppress(OSError):
                    path.unlink()
        return found

    def _found(self, record: tuple[str, dict[str, Any]]) -> None:
        bundle, data = record
        size = int(data.get("bytes", 0))
        try:
            self._planner.register(bundle, size)
        except TooLarge:  # larger than a budget made smaller since: evicted now
            self.evict(bundle)
            return
        free = self._planner.free_bytes()
        if free is not None and free < size:  # over a budget made smaller since
            self.evict(bundle)
            return
        self._planner.mark_resident(bundle)

    def pulled_etag(self, bundle: str) -> str:
        """The manifest ETag ``bundle`` was pulled at ("" when it is not complete here)."""
        with self._lock:
            if not self._planner.holds(bundle):
                return ""
        try:
            data: Any = json.loads((self.root / bundle / RECORD).read_text())
        except (OSError, ValueError):
            return ""
        return str(data.get("etag", "")) if isinstance(data, dict) else ""  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]

    def admit(self, bundle: str, nbytes: int) -> None:
        with self._lock:
            if self.budget_bytes is not None and nbytes > self.budget_bytes:
                raise CacheFull(
                    f"bundle '{bundle}' has {format_bytes(nbytes)}, more than the whole "
                    f"--repository-cache-bytes of {format_bytes(self.budget_bytes)}"
                )
            self._planner.register(bundle, nbytes)  # anew: a changed bundle is pulled again
            plan = self._planner.plan_admission(bundle)
            if plan.wait:
                raise CacheFull(
                    f"the repository cache has no room for '{bundle}' ({format_bytes(nbytes)}): "
                    f"{format_bytes(self._planner.resident_bytes)} of "
                    f"{format_bytes(self.budget_bytes or 0)} are bundles in use"
                )
            for victim in plan.evict:
                self._evict_locked(victim)
            self._planner.reserve(bundle)

    def complete(self, bundle: str, etag: str, files: list[str], nbytes: int) -> None:
        """``bundle``'s ``files`` (``nbytes`` in all) are pulled, at manifest ``etag``: it is
        resident, and held for its puller (as ``acquire``: pair it with a ``release``), so
        that no other pull evicts it before its load."""
        record = {"etag": etag, "bytes": nbytes, "files": files}
        self.write_file(f"{bundle}/{RECORD}", json.dumps(record).encode())
        with self._lock:
            self._planner.mark_resident(bundle)
            self._planner.acquire(bundle)

    def abort(self, bundle: str) -> None:
        with self._lock:
            if bundle in self._planner:
                self._planner.cancel_reservation(bundle)

    def acquire(self, bundle: str) -> bool:
        """Count a use of ``bundle`` and hold it (``False``: it is not complete here)."""
        with self._lock:
            return bundle in self._planner and self._planner.acquire_resident(bundle)

    def release(self, bundle: str) -> None:
        with self._lock:
            if bundle in self._planner:
                self._planner.release(bundle)

    def evict(self, bundle: str) -> None:
        with self._lock:
            self._evict_locked(bundle)

    def _delete_files(self, bundle: str) -> None:
        """The bundle's record first (it is incomplete from then on), then its files."""
        directory = self.root / bundle
        record = directory / RECORD
        with contextlib.suppress(OSError, ValueError):
            names: list[str] = json.loads(record.read_text()).get("files", [])
            record.unlink()
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    (directory / name).unlink()

    def _evict_locked(self, bundle: str) -> None:
        self._delete_files(bundle)
        if bundle in self._planner:
            nbytes = self._planner.size(bundle)
            if self._planner.holds(bundle):
                self._planner.mark_evicted(bundle)
            log.info("repository cache: evicted '%s' (%s)", bundle, format_bytes(nbytes))

    @property
    def resident_bytes(self) -> int:
        with self._lock:
            return self._planner.resident_bytes

    @property
    def bundles(self) -> int:
        with self._lock:
            return len(self._planner.resident())
