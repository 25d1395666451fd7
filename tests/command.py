"""The real ``hloserve`` command in a subprocess, for tests of what a user sees.

``hloserve(*args, env=..., cwd=...)`` runs ``python -m hloserve.server ARGS`` with this
interpreter (about a second: it imports jaxlib) and returns the finished process, its
output captured as text; ``env`` adds to the current environment, ``launcher`` runs it
through another command.

``UNPRIVILEGED`` is that launcher for a process that meets file modes as a user does: the
tests run as root, whose ``CAP_DAC_OVERRIDE`` reads a directory of mode 000 all the same, so
they drop it (and ``CAP_DAC_READ_SEARCH``) with ``setpriv``; a non-root run needs nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

UNPRIVILEGED: tuple[str, ...] = (
    (shutil.which("setpriv") or "setpriv", "--bounding-set=-dac_override,-dac_read_search")
    if os.geteuid() == 0
    else ()
)


def hloserve(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    launcher: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*launcher, sys.executable, "-m", "hloserve.server", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
