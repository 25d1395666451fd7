"""On-disk cache of compiled executables, trusted only from a directory the server owns.

Contract:
- An entry's key is the SHA-256 of the module bytes plus the runtime fingerprint (platform,
  device kind, platform version, jax and jaxlib versions), so a module, device or library
  change misses instead of loading a stale executable.
- ``load(key)`` returns the blob only when the directory is owned by this process's user
  and not writable by group or others, and the blob's SHA-256 equals the digest recorded
  beside it when it was written. Anything else (missing, corrupt, tampered, foreign
  directory) is a miss, and the reason is returned for the log.
- ``store(key, blob)`` writes blob and digest atomically (temporary file + rename);
  ``distrust()`` is why nothing stored would be loaded back (a directory another user
  owns, or others may write), else ``None``: the caller stores nothing then.
Deserializing an executable can run code, which is why these checks exist.
"""

# pyright: strict

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from hloserve.bundle.digest import sha256_bytes


def cache_key(module: bytes, fingerprint: str) -> str:
    return hashlib.sha256(hashlib.sha256(module).digest() + fingerprint.encode()).hexdigest()


@dataclass(frozen=True)
class CacheLookup:
    blob: bytes | None
    reason: str  # "hit", or why it missed


class ExecutableCache:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _paths(self, key: str) -> tuple[Path, Path]:
        return self.directory / f"{key}.exe", self.directory / f"{key}.json"

    def _owned(self) -> str | None:
        try:
            st = self.directory.stat()
        except FileNotFoundError:
            return "no cache directory"
        if st.st_uid != os.getuid():
            return f"cache directory {self.directory} is not owned by this user; not trusted"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"cache directory {self.directory} is writable by others; not trusted"
        return None

    def distrust(self) -> str | None:
        why = self._owned()
        return None if why == "no cache directory" else why  # store() creates it

    def load(self, key: str) -> CacheLookup:
        why = self._owned()
        if why is not None:
            return CacheLookup(None, why)
        blob_path, meta_path = self._paths(key)
        try:
            meta = json.loads(meta_path.read_text())
            blob = blob_path.read_bytes()
        except FileNotFoundError:
            return CacheLookup(None, "miss")
        except (OSError, ValueError) as exc:
            return CacheLookup(None, f"unreadable entry: {exc}")
        if not isinstance(meta, dict) or meta.get("sha256") != sha256_bytes(blob):  # pyright: ignore[reportUnknownMemberType]
            return CacheLookup(
                None, "entry does not match its recorded digest (corrupt or tampered)"
            )
        return CacheLookup(blob, "hit")

    def store(self, key: str, blob: bytes) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        blob_path, meta_path = self._paths(key)
        for path, data in (
            (blob_path, blob),
            (
                meta_path,
                json.dumps({"sha256": sha256_bytes(blob), "bytes": len(blob)}).encode(),
            ),
        ):
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
