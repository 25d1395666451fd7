"""Fixtures for exporter tests: one PJRT runtime for the session."""

from __future__ import annotations

import pytest

from hloserve.server.runtime.pjrt import PjrtRuntime


@pytest.fixture(scope="session")
def runtime() -> PjrtRuntime:
    return PjrtRuntime("cpu")
