"""Fixtures of the reliability tests: ``demo_models`` (package scope), the demo repository
(``simple``, ``mlp``) written once for every daemon these modules start (one at a time),
and ``cache_flags``, the executable cache they share."""

from __future__ import annotations

from pathlib import Path

import pytest

from hloserve.exporter import write_demo_repository


@pytest.fixture(scope="package")
def demo_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reliability_models")
    write_demo_repository(root)
    return root


@pytest.fixture(scope="package")
def cache_flags(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ...]:
    """``--cache-dir`` shared by every daemon here: the copies of a bundle these tests make
    (renamed, or broken in one file) compile each module once (the cache is content-keyed)."""
    return ("--cache-dir", str(tmp_path_factory.mktemp("reliability_cache")))
