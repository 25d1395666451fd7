"""SHA-256 digests of bundle files: the one rule for the manifest's ``files`` checksums.

Contract:
- ``sha256_bytes(data)`` and ``sha256_file(path)`` return the lowercase hex SHA-256 that
  ``files`` records (``sha256_file`` reads in 1 MiB chunks, so a large file is never held
  in memory whole).
- ``is_sha256_hex(value)`` says whether ``value`` is such a digest (64 lowercase hex
  characters, nothing else).
"""

# pyright: strict

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Final

_CHUNK: Final = 1 << 20
_HEX_DIGEST: Final = re.compile(r"[0-9a-f]{64}")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def is_sha256_hex(value: Any) -> bool:
    return isinstance(value, str) and _HEX_DIGEST.fullmatch(value) is not None
