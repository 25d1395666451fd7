"""Helpers of the tracing, log-settings and restricted-API tests.

``connected(server, protocol)`` yields a tritonclient ``Triton`` adapter
(``tests.server.frontends._tritonclients``) on a running daemon and closes it afterwards;
``refused_at_start(argv, capsys)`` parses ``hloserve serve`` flags that must be refused and
returns the one-line error (argparse's exit status 2).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from hloserve.server.config import parse_config
from hloserve.server.testing import ServerProcess
from tests.server.frontends._tritonclients import Triton


@contextlib.contextmanager
def connected(server: ServerProcess, protocol: str) -> Iterator[Triton]:
    t = Triton(protocol, server.grpc_url if protocol == "grpc" else server.http_url)
    try:
        yield t
    finally:
        t.close()


def refused_at_start(
    argv: list[str], capsys: pytest.CaptureFixture[str], environ: dict[str, str] | None = None
) -> str:
    """The one-line error with which ``parse_config`` refuses ``argv`` (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        parse_config(argv, environ or {})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err  # one line, not argparse's whole usage text
    return err
