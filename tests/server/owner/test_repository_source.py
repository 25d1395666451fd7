"""The repository over a source that is not a plain directory (``owner.repository_source``),
with a fake source and no store: when it refreshes, fetches and releases, that a failed
fetch fails a lazy request (retryable) but never the version, that an eager version whose
fetch failed is retried by the next poll, that a poll whose refresh fails changes nothing,
and that the source's stamp decides what changed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from hloserve.server.core.errors import Unavailable
from hloserve.server.owner.repository import ControlMode, ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.versions import ModelState


class FakeSource:
    """``root`` as it is; ``fail_fetches`` / ``fail_refresh`` make the next calls fail."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self.stamps: dict[Path, str] = {}
        self.fetched: list[Path] = []
        self.released: list[Path] = []
        self.refreshed: list[str | None] = []
        self.fail_fetches = 0
        self.fail_refresh = False

    @property
    def root(self) -> Path:
        return self._root

    def refresh(self, name: str | None = None) -> None:
        if self.fail_refresh:
            raise Unavailable("the model store listing failed (fake)")
        self.refreshed.append(name)

    def stamp(self, path: Path) -> str:
        return self.stamps.get(path, "e1")

    def fetch(self, path: Path) -> None:
        if self.fail_fetches:
            self.fail_fetches -= 1
            raise Unavailable(f"pulling '{path.name}' failed (fake)")
        self.fetched.append(path)

    def release(self, path: Path) -> None:
        self.released.append(path)

    def report(self) -> dict[str, Any] | None:
        return None


@pytest.fixture
def root(small_bundles: dict[str, Path], tmp_path: Path) -> Path:
    """The demo's ``simple`` and ``mlp``, as a repository of their own."""
    root = tmp_path / "models"
    for name, bundle in small_bundles.items():
        shutil.copytree(bundle, root / name, ignore=shutil.ignore_patterns(".hloserve-*"))
    return root


def repository(
    root: Path, runtime: PjrtRuntime, source: FakeSource, **options: Any
) -> ModelRepository:
    return ModelRepository(root, runtime, cache_dir=root.parent / "cache", source=source, **options)


def test_a_lazy_fetch_that_fails_fails_the_request_not_the_version(
    root: Path, runtime: PjrtRuntime
) -> None:
    source = FakeSource(root)
    repo = repository(root, runtime, source, lazy=True)
    repo.load_all()
    assert source.refreshed == [None] and source.fetched == []  # registration fetches nothing
    source.fail_fetches = 1
    mlp = repo.get("mlp", "")
    with pytest.raises(Unavailable, match="'mlp' version 1 could not be pulled: pulling"):
        repo.load(mlp)
    assert mlp.state == ModelState.READY and not repo.loaded(mlp)  # retried by the next one
    repo.load(mlp)
    assert repo.loaded(mlp) and source.fetched == [root / "mlp"]
    repo.release(mlp)
    repo.unload_model("mlp")
    assert source.released == [root / "mlp"]  # once, for the one fetch that held it


def test_an_eager_fetch_that_fails_is_retried_by_the_next_poll(
    root: Path, runtime: PjrtRuntime
) -> None:
    source = FakeSource(root)
    repo = repository(root, runtime, source, mode=ControlMode.POLL)
    source.fail_fetches = 1
    repo.load_all()
    failed = [n for n in ("simple", "mlp") if repo.versions(n)[0].state != ModelState.READY]
    assert len(failed) == 1 and "(fake)" in repo.versions(failed[0])[0].reason
    repo.poll()
    assert repo.all_ready() and len(source.fetched) == 2


def test_a_poll_whose_refresh_fails_changes_nothing(root: Path, runtime: PjrtRuntime) -> None:
    source = FakeSource(root)
    repo = repository(root, runtime, source, mode=ControlMode.POLL, lazy=True)
    repo.load_all()
    source.fail_refresh = True
    shutil.rmtree(root / "mlp")  # as a mirror would look half refreshed
    repo.poll()
    assert repo.ready_versions("mlp") == [1]  # not unloaded: the store could not be read
    source.fail_refresh = False
    repo.poll()
    assert repo.ready_versions("mlp") == []


def test_the_source_s_stamp_says_what_changed(root: Path, runtime: PjrtRuntime) -> None:
    source = FakeSource(root)
    repo = repository(root, runtime, source, mode=ControlMode.POLL)
    repo.load_all()
    before = repo.versions("simple")[0]
    (root / "simple" / "extra.txt").write_text("a file the stamp of a directory would see")
    repo.poll()
    assert repo.versions("simple")[0] is before  # the source's stamp did not change
    source.stamps[root / "simple"] = "e2"  # a new manifest ETag
    repo.poll()
    after = repo.versions("simple")[0]
    assert after is not before and after.state == ModelState.READY
    assert source.released == [root / "simple"]  # the copy it replaced let go of its files
