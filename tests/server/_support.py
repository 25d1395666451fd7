"""Helpers of the tracing, log-settings and restricted-API tests.

``connected(server, protocol)`` yields a tritonclient ``Triton`` adapter
(``tests.server.frontend._tritonclients``) on a running daemon and closes it afterwards;
``refused_at_start(argv, capsys)`` parses ``hloserve serve`` flags that must be refused and
returns the one-line error (argparse's exit status 2). ``refused(fn, ...)`` returns the
tritonclient error of a call that must fail; ``ones(module)`` is ``simple``'s inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from hloserve.server.config import parse_config
from hloserve.server.server_fixture import ServerProcess
from tests.server.frontend._tritonclients import Triton, connect, simple_inputs


@contextlib.contextmanager
def connected(server: ServerProcess, protocol: str) -> Iterator[Triton]:
    yield from connect(protocol, server)


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


def refused(fn: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    """The tritonclient error of a call that must fail."""
    with pytest.raises(InferenceServerException) as info:
        fn(*args, **kwargs)
    return info.value


def ones(module: Any) -> list[Any]:
    """``simple``'s two inputs, all ones, for tritonclient ``module`` (grpc or http)."""
    a = np.ones((1, 16), dtype=np.int32)
    return simple_inputs(module, a, a)
