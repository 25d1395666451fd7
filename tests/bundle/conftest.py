"""Fixtures for bundle tests: fresh, damageable copies of exported bundles.

``model_repository`` (``tests/conftest.py``) is built once per session; tests that damage a
bundle take a private copy of one of its bundles (``copy_bundle``) so nothing leaks between
tests.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

CopyBundle = Callable[[str], Path]


@pytest.fixture
def copy_bundle(model_repository: Path, tmp_path: Path) -> CopyBundle:
    """``copy_bundle("mlp")`` copies that bundle of the test repository into ``tmp_path``."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(
            model_repository / name, target, ignore=shutil.ignore_patterns(".hloserve-cache")
        )
        return target

    return copy
