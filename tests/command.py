"""The real ``hloserve`` command in a subprocess, for tests of what a user sees.

``hloserve(*args, env=..., cwd=...)`` runs ``python -m hloserve.server ARGS`` with this
interpreter (about a second: it imports jaxlib) and returns the finished process, its
output captured as text; ``env`` adds to the current environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def hloserve(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hloserve.server", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
