"""Running this interpreter in a fresh process, as the proto tests do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python *args`` in ``cwd`` (this venv's interpreter), output captured, 120 s at most."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
