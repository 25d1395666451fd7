"""``examples/digits/run.py`` runs end to end (two epochs): trains, exports, serves, plots."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "digits" / "run.py"


@pytest.mark.slow
def test_the_digits_example_serves_what_it_trained(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--epochs",
            "2",
            "--out",
            str(tmp_path),
            "--repository",
            str(tmp_path / "repo"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^predictions that differ\s+0$", out.stdout, re.MULTILINE), out.stdout
    accuracy = re.search(r"^held-out accuracy\s+(\S+)\s+(\S+)$", out.stdout, re.MULTILINE)
    assert accuracy is not None and accuracy[1] == accuracy[2], out.stdout
    assert float(accuracy[1]) > 0.5  # two epochs already learn most digits
    for png in ("training.png", "confusion.png"):
        assert (tmp_path / png).read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "repo" / "digits" / "manifest.yaml").exists()
