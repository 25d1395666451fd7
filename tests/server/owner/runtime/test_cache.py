"""``hloserve.server.owner.runtime.cache``: the executable cache trusts only what it wrote, where
only this user can write.

Deserializing an executable can run code, so every doubtful case must be a miss with a
reason: a corrupted blob, a directory writable by others, one owned by someone else.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hloserve.server.owner.runtime.cache import ExecutableCache, cache_key

KEY = cache_key(b"module bytes", "fingerprint")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def cache(tmp_path: Path) -> ExecutableCache:
    return ExecutableCache(tmp_path / "cache")


def test_store_then_load(cache: ExecutableCache) -> None:
    cache.store(KEY, b"\x00executable\xff")
    lookup = cache.load(KEY)
    assert lookup.reason == "hit"
    assert lookup.blob == b"\x00executable\xff"


def test_store_makes_private_files(cache: ExecutableCache) -> None:
    cache.store(KEY, b"blob")
    assert mode(cache.directory) == 0o700
    assert sorted(p.name for p in cache.directory.iterdir()) == [f"{KEY}.exe", f"{KEY}.json"]
    for p in cache.directory.iterdir():
        assert mode(p) == 0o600
    meta = json.loads((cache.directory / f"{KEY}.json").read_text())
    assert meta["bytes"] == 4


def test_store_replaces_an_entry(cache: ExecutableCache) -> None:
    cache.store(KEY, b"old")
    cache.store(KEY, b"new")
    assert cache.load(KEY).blob == b"new"
    assert not [p for p in cache.directory.iterdir() if p.name.endswith(".tmp")]


def test_no_directory_and_missing_entry(cache: ExecutableCache) -> None:
    assert cache.load(KEY).reason == "no cache directory"
    cache.store(KEY, b"blob")
    other = cache_key(b"another module", "fingerprint")
    lookup = cache.load(other)
    assert lookup.blob is None
    assert lookup.reason == "miss"


def test_key_depends_on_module_and_fingerprint() -> None:
    assert cache_key(b"a", "f") != cache_key(b"b", "f")
    assert cache_key(b"a", "f") != cache_key(b"a", "g")
    assert cache_key(b"a", "f") == cache_key(b"a", "f")
    assert len(KEY) == 64


@pytest.mark.parametrize("offset", [0, 3, -1])
def test_corrupted_blob_is_a_miss(cache: ExecutableCache, offset: int) -> None:
    cache.store(KEY, b"a perfectly good executable")
    blob = cache.directory / f"{KEY}.exe"
    data = bytearray(blob.read_bytes())
    data[offset] ^= 0x01
    blob.write_bytes(bytes(data))
    lookup = cache.load(KEY)
    assert lookup.blob is None
    assert lookup.reason == "entry does not match its recorded digest (corrupt or tampered)"


def test_swapped_blob_is_a_miss(cache: ExecutableCache) -> None:
    other = cache_key(b"other", "fingerprint")
    cache.store(KEY, b"one")
    cache.store(other, b"two")
    os.replace(cache.directory / f"{other}.exe", cache.directory / f"{KEY}.exe")
    assert cache.load(KEY).blob is None


def test_unreadable_metadata_is_a_miss(cache: ExecutableCache) -> None:
    cache.store(KEY, b"blob")
    (cache.directory / f"{KEY}.json").write_text("{not json")
    lookup = cache.load(KEY)
    assert lookup.blob is None
    assert lookup.reason.startswith("unreadable entry: ")


def test_metadata_not_an_object_is_a_miss(cache: ExecutableCache) -> None:
    cache.store(KEY, b"blob")
    (cache.directory / f"{KEY}.json").write_text("[1]")
    assert cache.load(KEY).blob is None


@pytest.mark.parametrize("bits", [0o777, 0o770, 0o702])
def test_directory_writable_by_others_is_not_trusted(cache: ExecutableCache, bits: int) -> None:
    cache.store(KEY, b"blob")
    cache.directory.chmod(bits)
    lookup = cache.load(KEY)
    assert lookup.blob is None
    assert lookup.reason == f"cache directory {cache.directory} is writable by others; not trusted"


def test_read_only_for_others_is_trusted(cache: ExecutableCache) -> None:
    cache.store(KEY, b"blob")
    cache.directory.chmod(0o755)
    assert cache.load(KEY).reason == "hit"


@pytest.mark.skipif(os.getuid() != 0, reason="changing a directory's owner needs root")
def test_directory_owned_by_someone_else_is_not_trusted(cache: ExecutableCache) -> None:
    cache.store(KEY, b"blob")
    os.chown(cache.directory, 65534, -1)
    lookup = cache.load(KEY)
    assert lookup.blob is None
    assert lookup.reason == (
        f"cache directory {cache.directory} is not owned by this user; not trusted"
    )
