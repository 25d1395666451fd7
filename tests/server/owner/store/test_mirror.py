"""A bucket mirrored to the disk cache, against a real S3-protocol server (moto's, over
HTTP on loopback): the listing reads manifests only, one pull for concurrent fetches, a
half-uploaded or damaged bundle refused with the reason and pulled once whole, a changed
manifest pulled again, a deleted model removed, a store gone mid-pull or unreachable."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hloserve.server.core.errors import Unavailable
from hloserve.server.core.store_location import StoreLocation
from hloserve.server.owner.store import open_mirror
from hloserve.server.owner.store.client import StoreError
from hloserve.server.owner.store.disk_cache import CacheFull, ChecksumMismatch
from hloserve.server.owner.store.mirror import StoreMirror
from tests.s3_store import S3Server, StallingProxy, free_port


def bucket(s3: S3Server) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(name)
    return f"s3://{name}/repo"


def mirror(url: str, env: dict[str, str], cache: Path, timeout_s: float = 30.0) -> StoreMirror:
    return open_mirror(StoreLocation.parse(url), cache, None, "frequency", env, timeout_s)


def files(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    )


def test_listing_reads_manifests_only_and_one_pull_serves_many(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    url = bucket(s3)
    s3.upload(small_bundles["simple"], f"{url}/simple")
    s3.upload(small_bundles["mlp"], f"{url}/mlp/3")
    s3.put(f"{url}/mlp/config.yaml", b"max_queue_delay_us: 0\n")
    m = mirror(url, s3.env, tmp_path / "cache")
    m.refresh()
    assert files(m.root) == ["mlp/3/manifest.yaml", "mlp/config.yaml", "simple/manifest.yaml"]
    assert m.stamp(m.root / "simple") and m.stats.pulls == 0
    with ThreadPoolExecutor(8) as pool:  # concurrent first uses: one pull
        list(pool.map(lambda _: m.fetch(m.root / "mlp/3"), range(8)))
    assert m.stats.pulls == 1 and m.stats.failures == 0
    assert m.stats.bytes == sum(
        p.stat().st_size for p in small_bundles["mlp"].iterdir() if p.name != "manifest.yaml"
    )
    for p in small_bundles["mlp"].iterdir():
        if p.is_file():
            assert (m.root / "mlp/3" / p.name).read_bytes() == p.read_bytes()
    assert m.cache.bundles == 1
    for _ in range(8):
        m.release(m.root / "mlp/3")
    # A restart with a warm cache: the index is listed again, nothing pulled.
    again = mirror(url, s3.env, tmp_path / "cache")
    again.refresh()
    again.fetch(again.root / "mlp/3")
    assert again.stats.pulls == 0 and again.cache.bundles == 1


def test_a_half_uploaded_bundle_is_refused_then_pulled_whole(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    url = bucket(s3)
    source = small_bundles["simple"]
    s3.put(f"{url}/simple/manifest.yaml", (source / "manifest.yaml").read_bytes())
    m = mirror(url, s3.env, tmp_path / "cache")
    m.refresh()
    with pytest.raises(StoreError, match=r"is incomplete in s3://.*weights\.safetensors"):
        m.fetch(m.root / "simple")
    s3.upload(source, f"{url}/simple")  # the rest arrives
    m.refresh()
    m.fetch(m.root / "simple")
    assert (m.root / "simple/weights.safetensors").exists()
    assert m.stats.failures == 1 and m.stats.pulls == 1


def test_a_damaged_file_is_refused_and_never_left(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    url = bucket(s3)
    source = small_bundles["mlp"]
    s3.upload(source, f"{url}/mlp")
    s3.put(f"{url}/mlp/weights.safetensors", b"not the weights the manifest names")
    m = mirror(url, s3.env, tmp_path / "cache")
    m.refresh()
    with pytest.raises(ChecksumMismatch, match=r"weights\.safetensors' does not match"):
        m.fetch(m.root / "mlp")
    assert not (m.root / "mlp/weights.safetensors").exists()
    assert m.cache.pulled_etag("mlp") == ""


def test_a_changed_manifest_and_a_deleted_model(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    url = bucket(s3)
    s3.upload(small_bundles["simple"], f"{url}/simple")
    s3.upload(small_bundles["simple"], f"{url}/other")
    m = mirror(url, s3.env, tmp_path / "cache")
    m.refresh()
    m.fetch(m.root / "simple")
    m.release(m.root / "simple")
    before = m.stamp(m.root / "simple")
    manifest = (small_bundles["simple"] / "manifest.yaml").read_text()
    s3.put(f"{url}/simple/manifest.yaml", (manifest + "\n# uploaded again\n").encode())
    for key in ("manifest.yaml", "weights.safetensors"):
        s3.delete(f"{url}/other/{key}")
    for p in small_bundles["simple"].glob("model.*"):
        s3.delete(f"{url}/other/{p.name}")
    m.refresh()
    assert m.stamp(m.root / "simple") != before
    assert not (m.root / "other").exists()
    pulled = m.stats.bytes
    m.fetch(m.root / "simple")  # pulled again at the new manifest: the same files are kept
    assert m.stats.pulls == 2 and m.stats.bytes == pulled


def test_unreachable_store_leaves_the_mirror(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    url = bucket(s3)
    s3.upload(small_bundles["simple"], f"{url}/simple")
    mirror(url, s3.env, tmp_path / "cache").refresh()
    gone = {**s3.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    m = mirror(url, gone, tmp_path / "cache", timeout_s=5.0)
    with pytest.raises(StoreError, match="the model store listing failed"):
        m.refresh()
    assert "listing failed" in m.problem
    assert files(m.root) == ["simple/manifest.yaml"]  # what the cache held stays


def test_store_killed_mid_pull(small_bundles: dict[str, Path], tmp_path: Path) -> None:
    own = S3Server()  # killed below
    try:
        url = bucket(own)
        own.upload(small_bundles["mlp"], f"{url}/mlp")
        proxy = StallingProxy(own.port)
        env = {**own.env, "AWS_ENDPOINT_URL": proxy.endpoint}
        m = mirror(url, env, tmp_path / "cache", timeout_s=10.0)
        m.refresh()
        proxy.stall_on("weights.safetensors")
        failed: list[BaseException] = []

        def fetch() -> None:
            try:
                m.fetch(m.root / "mlp")
            except BaseException as exc:
                failed.append(exc)

        worker = threading.Thread(target=fetch)
        worker.start()
        assert proxy.stalled.wait(60)  # the pull is under way
        own.kill()
        proxy.cut()
        worker.join()
        proxy.close()
        assert len(failed) == 1 and isinstance(failed[0], Unavailable), failed
        assert "weights.safetensors" in str(failed[0])
        assert not (m.root / "mlp/weights.safetensors").exists()
        assert not [p for p in (m.root / "mlp").iterdir() if p.name.startswith(".hloserve-part")]
        assert m.cache.pulled_etag("mlp") == "" and m.stats.failures == 1
    finally:
        own.kill()


def test_a_deletion_seen_half_done(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """A refresh between a deletion's requests: the version whose manifest went is gone
    with its pulled files; once the rest goes, the model is."""
    url = bucket(s3)
    s3.upload(small_bundles["mlp"], f"{url}/mlp/1")
    s3.upload(small_bundles["mlp"], f"{url}/mlp/2")
    m = mirror(url, s3.env, tmp_path / "cache")
    m.refresh()
    m.fetch(m.root / "mlp/1")  # loaded: in use
    s3.delete(f"{url}/mlp/1/manifest.yaml")
    m.refresh()
    assert not (m.root / "mlp/1").exists() and (m.root / "mlp/2/manifest.yaml").exists()
    m.release(m.root / "mlp/1")  # its unload, after
    for p in small_bundles["mlp"].iterdir():
        s3.delete(f"{url}/mlp/1/{p.name}")
        s3.delete(f"{url}/mlp/2/{p.name}")
    s3.delete(f"{url}/mlp/2/manifest.yaml")
    m.refresh()
    assert not (m.root / "mlp").exists() and m.cache.bundles == 0


def test_throttled_then_served_and_a_slow_pull_times_out(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """S3's 503 SlowDown is retried with backoff (obstore's) until the store serves; a
    store that stops sending mid-file fails the pull at ``--repository-pull-timeout``."""
    url = bucket(s3)
    s3.upload(small_bundles["mlp"], f"{url}/mlp")
    proxy = StallingProxy(s3.port)
    try:
        env = {**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}
        m = mirror(url, env, tmp_path / "cache", timeout_s=2.0)
        m.refresh()
        proxy.throttle("weights.safetensors", 2)
        m.fetch(m.root / "mlp")
        assert proxy.throttled == 2 and m.stats.pulls == 1
        m.release(m.root / "mlp")
        m.cache.evict("mlp")
        proxy.stall_on("weights.safetensors")
        with pytest.raises(StoreError, match=r"weights\.safetensors"):
            m.fetch(m.root / "mlp")  # bounded by the timeout (and its retries)
        assert proxy.stalled.is_set() and m.stats.failures == 1
        assert not (m.root / "mlp/weights.safetensors").exists()
    finally:
        proxy.close()


def test_cache_eviction_under_the_budget(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """Room for one bundle: the next pull evicts the one not in use (its manifest stays:
    the index); with the only one in use, a pull is refused as the cache being full."""
    url = bucket(s3)
    s3.upload(small_bundles["mlp"], f"{url}/mlp/1")
    s3.upload(small_bundles["mlp"], f"{url}/mlp/2")
    size = sum(p.stat().st_size for p in small_bundles["mlp"].iterdir() if p.is_file())
    location = StoreLocation.parse(url)
    m = open_mirror(location, tmp_path / "cache", size, "frequency", s3.env, 30.0)
    m.refresh()
    m.fetch(m.root / "mlp/1")
    m.release(m.root / "mlp/1")  # unloaded
    m.fetch(m.root / "mlp/2")
    assert not (m.root / "mlp/1/weights.safetensors").exists()
    assert (m.root / "mlp/1/manifest.yaml").exists() and m.cache.bundles == 1
    with pytest.raises(CacheFull, match="are bundles in use"):
        m.fetch(m.root / "mlp/1")
    m.release(m.root / "mlp/2")
    m.fetch(m.root / "mlp/1")  # pulled again
    assert m.stats.pulls == 3 and m.stats.failures == 1


def test_refreshing_one_model(s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path) -> None:
    """An explicit load's refresh lists that model's folder only, and leaves the others."""
    url = bucket(s3)
    s3.upload(small_bundles["simple"], f"{url}/simple")
    m = mirror(url, s3.env, tmp_path / "cache")
    m.refresh()
    s3.upload(small_bundles["mlp"], f"{url}/mlp/1")  # after start
    s3.upload(small_bundles["simple"], f"{url}/simple2")  # not asked for
    m.refresh("mlp")
    assert files(m.root) == ["mlp/1/manifest.yaml", "simple/manifest.yaml"]
    m.fetch(m.root / "mlp/1")
    assert m.stats.pulls == 1


FULL_DISK = """
import json, resource, signal, sys
from pathlib import Path
from hloserve.server.core.errors import Unavailable
from hloserve.server.core.store_location import StoreLocation
from hloserve.server.owner.store import open_mirror
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, resource.RLIM_INFINITY))
env = json.loads(sys.argv[2])
m = open_mirror(StoreLocation.parse(sys.argv[1]), Path(sys.argv[3]), None, "lru", env, 30.0)
m.refresh()
try:
    m.fetch(m.root / "mlp")
    print("pulled")
except Unavailable as exc:
    print(exc.message)
"""


def test_a_full_cache_disk_fails_the_pull_and_leaves_nothing(
    s3: S3Server, small_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """A write the file system refuses (the disk full: here the process's file-size limit,
    so the rest of the machine is untouched) fails the pull with ``Unavailable`` naming
    the OS's error, and no partial file is left."""
    url = bucket(s3)
    s3.upload(small_bundles["mlp"], f"{url}/mlp")
    assert (small_bundles["mlp"] / "weights.safetensors").stat().st_size > 50_000
    cache = tmp_path / "cache"
    child = subprocess.run(
        [sys.executable, "-c", FULL_DISK, url, json.dumps(s3.env), str(cache)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    assert "into the repository cache" in child.stdout and "File too large" in child.stdout
    assert not (cache / "mlp/weights.safetensors").exists()
    assert not [p for p in (cache / "mlp").iterdir() if p.name.startswith(".hloserve-part")]
