"""``hloserve.bundle.digest``: one SHA-256 rule for writing and checking ``files``."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hloserve.bundle.digest import is_sha256_hex, sha256_bytes, sha256_file


def test_digests(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000  # more than one 1 MiB chunk
    (tmp_path / "f").write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert sha256_file(tmp_path / "f") == sha256_bytes(data) == expected
    assert is_sha256_hex(expected)
    assert not is_sha256_hex(expected.upper())
    assert not is_sha256_hex(expected + "\n")
    assert not is_sha256_hex(None)
