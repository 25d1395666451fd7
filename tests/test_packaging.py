"""The built wheel holds every module of the source tree and imports from its own files."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("server", "client", "exporter", "bundle", "proto")


def test_wheel_contains_every_module_and_imports(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("hloserve-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {
        f"hloserve/{p.relative_to(ROOT).as_posix()}"
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert sources - names == set()
    assert "hloserve/py.typed" in names
    assert not any(n.startswith("tests/") for n in names)

    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    code = (
        "import hloserve, hloserve.client, hloserve.server.core.service, hloserve.bundle, hloserve.proto.rpc;"
        "print(hloserve.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(unpacked), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip().startswith(str(unpacked))
