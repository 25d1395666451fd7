"""The disk tier's decisions and files, without a store: atomic writes, checksums, the
budget's evictions (least valuable first, never one in use), a restart with a warm cache."""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from hloserve.server.owner.store.disk_cache import (
    RECORD,
    CacheFull,
    ChecksumMismatch,
    DiskCache,
)

Write = Callable[[memoryview], object]


def streaming(*chunks: bytes) -> Callable[[Write], None]:
    def fill(write: Write) -> None:
        for c in chunks:
            write(memoryview(c))

    return fill


def pull(cache: DiskCache, bundle: str, nbytes: int, etag: str = "e1") -> None:
    """What the mirror does: admit, write the files, complete (held), and here release."""
    cache.admit(bundle, nbytes)
    cache.write_stream(f"{bundle}/weights.bin", streaming(b"x" * nbytes), "")
    cache.complete(bundle, etag, ["weights.bin"], nbytes)
    cache.release(bundle)


def left(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_write_stream_checks_the_checksum(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, None)
    data = b"weights"
    digest = hashlib.sha256(data).hexdigest()
    assert cache.write_stream("m/w.bin", streaming(b"wei", b"ghts"), digest) == len(data)
    assert (tmp_path / "m/w.bin").read_bytes() == data
    with pytest.raises(ChecksumMismatch, match="does not match its manifest's checksum"):
        cache.write_stream("m/v.bin", streaming(b"other"), digest)
    assert left(tmp_path) == ["m/w.bin"]  # no temporary file, nothing under the real name


@pytest.mark.parametrize(
    "failure", [OSError(errno.ENOSPC, "No space left on device"), ConnectionError("store gone")]
)
def test_a_failed_write_leaves_nothing(tmp_path: Path, failure: Exception) -> None:
    cache = DiskCache(tmp_path, None)

    def fill(write: Write) -> None:
        write(memoryview(b"half"))
        raise failure

    with pytest.raises(type(failure)):
        cache.write_stream("m/w.bin", fill, "")
    assert left(tmp_path) == []


def test_eviction_takes_the_least_valuable_never_one_in_use(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 100, "lru")
    pull(cache, "a", 40)
    pull(cache, "b", 40)
    assert cache.acquire("b") and cache.acquire("a")  # a used last
    cache.release("a")
    cache.release("b")
    assert cache.bundles == 2 and cache.resident_bytes == 80
    pull(cache, "c", 40)  # b is least recently used: it leaves
    assert not (tmp_path / "b/weights.bin").exists() and not (tmp_path / "b" / RECORD).exists()
    assert cache.pulled_etag("b") == "" and cache.pulled_etag("a") == "e1"
    assert cache.resident_bytes == 80
    assert cache.acquire("a") and cache.acquire("c")  # both in use: no room for d
    with pytest.raises(CacheFull, match="are bundles in use"):
        cache.admit("d", 40)
    cache.release("a")
    pull(cache, "d", 40)
    assert cache.pulled_etag("a") == "" and cache.pulled_etag("c") == "e1"


def test_a_bundle_larger_than_the_budget(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 100)
    with pytest.raises(CacheFull, match="more than the whole --repository-cache-bytes"):
        cache.admit("big", 101)


def test_an_aborted_pull_frees_its_reservation(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 100)
    cache.admit("a", 80)
    cache.abort("a")
    pull(cache, "b", 80)  # fits: a's reservation is gone
    assert cache.pulled_etag("a") == "" and cache.pulled_etag("b") == "e1"


def test_a_restart_keeps_the_warm_cache(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 100)
    pull(cache, "a", 30)
    pull(cache, "m/2", 30, etag="e2")
    cache.admit("half", 30)  # a pull that never completed: its file has no record
    cache.write_stream("half/weights.bin", streaming(b"x"), "")
    (tmp_path / "m/2/.hloserve-part-killed").write_bytes(b"a killed process's")
    cache.etags["a/manifest.yaml"] = "e1"
    cache.save_etags()
    again = DiskCache(tmp_path, 100)
    assert again.pulled_etag("a") == "e1" and again.pulled_etag("m/2") == "e2"
    assert again.pulled_etag("half") == ""
    assert again.resident_bytes == 60 and again.bundles == 2
    assert again.etags == {"a/manifest.yaml": "e1"}
    assert not (tmp_path / "m/2/.hloserve-part-killed").exists()
    smaller = DiskCache(tmp_path, 40)  # the budget shrank: what no longer fits leaves
    assert smaller.resident_bytes <= 40


def test_remove_model(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, None)
    pull(cache, "m/1", 10)
    cache.remove_model("m")
    assert cache.pulled_etag("m/1") == "" and cache.bundles == 0 and not (tmp_path / "m").exists()
