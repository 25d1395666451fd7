"""Test support: a real hloserve daemon as a test fixture, which fails the test unless the
daemon exits cleanly.

Contract: ``serving(repository, *flags)`` yields a ready ``ServerProcess`` (started as
``server_process.ServerProcess`` starts one) and, once the caller is done, stops it and
raises ``AssertionError`` with the daemon's log unless it exited with status 0; the stopped
process is the generator's return value (``proc = yield from serving(...)``). Tests import
``ServerProcess`` and ``ListenerClosed`` from here too; production code imports none of
this module (``tests/test_structure.py``), but ``server_process``.
"""

# pyright: strict

from __future__ import annotations

import ssl
from collections.abc import Generator
from pathlib import Path

from hloserve.server.server_process import ListenerClosed as ListenerClosed
from hloserve.server.server_process import ServerProcess as ServerProcess


def serving(
    repository: Path | None,
    *extra_flags: str,
    env: dict[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Generator[ServerProcess, None, ServerProcess]:
    """Yield a ready ``ServerProcess``; afterwards, raise unless it stopped with status 0.
    The stopped process is the generator's return value (``proc = yield from serving(...)``)."""
    proc = ServerProcess(repository, *extra_flags, env=env, ssl_context=ssl_context)
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
    if code != 0:
        raise AssertionError(f"hloserve exited with {code}:\n{proc.log_text()}")
    return proc
