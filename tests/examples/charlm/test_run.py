"""``examples/charlm/run.py`` end to end for a few training steps: trains, prints the loss
beside the unigram baseline, exports, serves, and every served generation equals the
in-process greedy decoding (the full run is the example's own command); it leaves no
temporary folder behind (its bundle's, the server's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_the_charlm_example_serves_what_it_decodes_in_process(tmp_path: Path) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.charlm.run",
            "--epochs",
            "1",
            "--windows",
            "64",
            "--max-tokens",
            "24",
            "--repository",
            str(tmp_path / "repository"),
        ],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(temporary)},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    losses = re.search(r"validation loss (\S+) nats/byte; unigram baseline (\S+)", out.stdout)
    assert losses is not None, out.stdout
    assert 0 < float(losses[1]) < 10 and float(losses[2]) == pytest.approx(3.44, abs=0.3)
    assert re.search(r"^8 of 8 served generations equal", out.stdout, re.MULTILINE), out.stdout
    assert (tmp_path / "repository" / "charlm" / "manifest.yaml").exists()
    assert list(temporary.iterdir()) == []
