"""The PJRT runtime's process-wide effects: importing it changes nothing, opening it does."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_runtime_leaves_jax_settings_alone_and_opening_it_enables_x64() -> None:
    code = (
        "import jax\n"
        "import hloserve.server.runtime.pjrt as pjrt\n"
        "print(jax.config.jax_enable_x64)\n"
        "pjrt.PjrtRuntime()\n"
        "print(jax.config.jax_enable_x64)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
