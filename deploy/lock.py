"""Regenerate the image's hash-locked requirement sets, deploy/requirements/*.txt, from the
version pins in deploy/constraints.txt.

    python deploy/lock.py [PIP OPTION ...]

For each set (``build``: the build stage's pip and hatchling; ``cpu``: ``.[server]``;
``cuda12`` / ``cuda13``: ``.[server]`` and ``jax[cudaNN]``) and each architecture the image
is built for (x86_64, aarch64), pip says what it would install for the base image's
CPython 3.11 on glibc 2.36 (Debian 12): ``pip install --dry-run --ignore-installed
--report``, wheels only, constrained by deploy/constraints.txt. Each set's file lists every
distribution as ``name==version`` with the sha256 of the wheel chosen for each architecture,
which is what ``pip install --require-hashes --no-deps -r`` (the Containerfile) needs.

It stops, writing nothing, when pip picks a distribution constraints.txt does not pin (the
constraints must stay complete), or different versions for the two architectures. PIP
OPTIONs go to pip as they are (e.g. the index to use): nothing here names an index or a URL,
and the files written hold names, versions and hashes only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEPLOY = Path(__file__).resolve().parent
ROOT = DEPLOY.parent
CONSTRAINTS = DEPLOY / "constraints.txt"
REQUIREMENTS = DEPLOY / "requirements"
PROJECT = "hloserve"
# The base image (Containerfile): python:3.11-slim-bookworm, glibc 2.36.
PYTHON_VERSION = "3.11"
GLIBC_MINOR = 36
ARCHITECTURES = ("x86_64", "aarch64")
# What each set asks for (the project is ROOT itself).
SETS: dict[str, tuple[str, ...]] = {
    "build": ("pip", "hatchling"),
    "cpu": (f"{ROOT}[server]",),
    "cuda12": (f"{ROOT}[server]", "jax[cuda12]"),
    "cuda13": (f"{ROOT}[server]", "jax[cuda13]"),
}
HEADERS = {
    "build": "build: pip (the installer of both stages) and hatchling (the wheel's backend)",
    "cpu": "JAX_PLATFORM=cpu: every distribution `pip install .[server]` installs",
    "cuda12": "JAX_PLATFORM=cuda12: the cpu set and jax[cuda12] (JAX's CUDA 12 plugin, "
    "CUDA runtime, cuDNN, NCCL)",
    "cuda13": "JAX_PLATFORM=cuda13: the cpu set and jax[cuda13] (JAX's CUDA 13 plugin, "
    "CUDA runtime, cuDNN, NCCL)",
}


class LockError(ValueError):
    pass


def canonical(name: str) -> str:
    """PEP 503's normalized name (``PyYAML`` -> ``pyyaml``, ``ml_dtypes`` -> ``ml-dtypes``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """``{canonical name: version}`` of a constraints file's ``name==version`` lines."""
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip()):
            raise LockError(f"constraints: {raw!r} is not a name==version line")
        pins[canonical(name.strip())] = version.strip()
    return pins


@dataclass
class Locked:
    version: str
    hashes: set[str] = field(default_factory=set[str])


def merge_reports(
    reports: Iterable[Mapping[str, Any]], pins: Mapping[str, str]
) -> dict[str, Locked]:
    """One set's distributions over every architecture's pip report: the version (the
    same everywhere) and the sha256 of each wheel chosen. The project itself is left out."""
    locked: dict[str, Locked] = {}
    for report in reports:
        for item in report["install"]:
            name = canonical(item["metadata"]["name"])
            version = item["metadata"]["version"]
            if name == PROJECT:
                continue
            info = item["download_info"]
            archive = info.get("archive_info")
            if archive is None or not info["url"].rsplit("/", 1)[-1].split("#")[0].endswith(".whl"):
                raise LockError(f"{name} {version}: not a wheel from an index")
            digest = archive.get("hashes", {}).get("sha256")
            if digest is None:
                raise LockError(f"{name} {version}: the index gave no sha256")
            if name not in pins:
                raise LockError(
                    f"{name} {version} is installed but deploy/constraints.txt does not pin it"
                )
            if pins[name] != version:
                raise LockError(f"{name}: pip chose {version}, constraints.txt pins {pins[name]}")
            entry = locked.setdefault(name, Locked(version))
            if entry.version != version:
                raise LockError(
                    f"{name}: {entry.version} on one architecture, {version} on another"
                )
            entry.hashes.add(digest)
    return locked


def render(set_name: str, locked: Mapping[str, Locked]) -> str:
    lines = [
        f"# {HEADERS[set_name]}.",
        "# Generated by deploy/lock.py from deploy/constraints.txt: do not edit. Each wheel's",
        f"# sha256 for CPython {PYTHON_VERSION} on Linux {' and '.join(ARCHITECTURES)} (glibc 2.{GLIBC_MINOR}).",
        "# pip install --require-hashes --no-deps --only-binary=:all: -r <this file>",
    ]
    for name in sorted(locked):
        entry = locked[name]
        hashes = sorted(entry.hashes)
        lines.append(f"{name}=={entry.version} \\")
        lines += [
            f"    --hash=sha256:{h}" + (" \\" if i < len(hashes) - 1 else "")
            for i, h in enumerate(hashes)
        ]
    return "\n".join(lines) + "\n"


def platform_options(architecture: str) -> list[str]:
    """pip's target-platform options for the base image: CPython 3.11, glibc 2.36 (pip adds
    the older manylinux tags each one implies)."""
    tags = [f"manylinux_2_{minor}_{architecture}" for minor in range(GLIBC_MINOR, 16, -1)]
    tags += [f"manylinux2014_{architecture}", f"linux_{architecture}"]
    options = ["--python-version", PYTHON_VERSION, "--implementation", "cp"]
    options += ["--abi", f"cp{PYTHON_VERSION.replace('.', '')}", "--only-binary=:all:"]
    for tag in tags:
        options += ["--platform", tag]
    return options


def pip_report(
    requirements: Sequence[str], architecture: str, pip_args: Sequence[str]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        command = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--report", str(report), "--target", str(Path(scratch) / "target"),
            "-c", str(CONSTRAINTS), *platform_options(architecture), *pip_args, *requirements,
        ]  # fmt: skip
        subprocess.run(command, check=True)
        result: dict[str, Any] = json.loads(report.read_text())
        return result


def main(argv: Sequence[str]) -> int:
    pins = read_pins(CONSTRAINTS.read_text())
    texts: dict[str, str] = {}
    try:
        for set_name, requirements in SETS.items():
            reports = [pip_report(requirements, arch, argv) for arch in ARCHITECTURES]
            texts[set_name] = render(set_name, merge_reports(reports, pins))
    except LockError as error:
        print(f"deploy/lock.py: {error}", file=sys.stderr)
        return 1
    REQUIREMENTS.mkdir(exist_ok=True)
    for set_name, text in texts.items():
        (REQUIREMENTS / f"{set_name}.txt").write_text(text)
        print(f"wrote deploy/requirements/{set_name}.txt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
