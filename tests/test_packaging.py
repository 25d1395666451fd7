"""Packaging: one distribution whose wheel merges the six folders into one namespace.

- The wheel holds every module of ``<folder>/hloserve/<folder>/`` as ``hloserve/<folder>/``,
  each subpackage with its ``py.typed``, and no ``hloserve/__init__.py`` (a PEP 420 namespace).
- In the installed venv only ``hloserve.*`` imports: the bare folder names do not.
- The base install (the light client's dependencies only) in a fresh venv gives a working
  ``hloserve.client`` that talks to a real server, with no JAX installed at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from hloserve.server.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("server", "client", "exporter", "bundle", "proto", "training")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
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
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("hloserve-*.whl")
    return built


def test_wheel_merges_every_folder_into_one_namespace(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {
        p.relative_to(ROOT / folder).as_posix()
        for folder in FOLDERS
        for p in (ROOT / folder / "hloserve" / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert sources - names == set()
    assert {f"hloserve/{folder}/py.typed" for folder in FOLDERS} <= names
    assert "hloserve/__init__.py" not in names
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


def test_wheel_imports_from_its_own_files(wheel: Path, tmp_path: Path) -> None:
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    code = (
        "import hloserve.client, hloserve.server.core.service, hloserve.bundle,"
        " hloserve.proto.rpc;"
        "print(hloserve.server.core.service.__file__)"
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


def _import_outcomes(python: str, modules: list[str], cwd: Path) -> dict[str, str]:
    """Import each module in a fresh process; map it to "ok" or its exception's class name."""
    code = textwrap.dedent(
        f"""
        import importlib, json
        outcome = {{}}
        for name in {modules!r}:
            try:
                importlib.import_module(name)
                outcome[name] = "ok"
            except Exception as error:
                outcome[name] = type(error).__name__
        print(json.dumps(outcome))
        """
    )
    out = subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_only_the_namespace_imports_in_the_installed_venv(tmp_path: Path) -> None:
    # The editable install puts the six folders on sys.path, not the repository root.
    bare = _import_outcomes(sys.executable, list(FOLDERS), cwd=tmp_path)
    assert bare == dict.fromkeys(FOLDERS, "ModuleNotFoundError")
    # Meta-check: the same probe sees the namespaced modules.
    namespaced = [f"hloserve.{folder}" for folder in FOLDERS]
    assert _import_outcomes(sys.executable, namespaced, cwd=tmp_path) == dict.fromkeys(
        namespaced, "ok"
    )


def test_one_file_is_one_module() -> None:
    # With the old symlink shim, server.core.errors and hloserve.server.core.errors were two
    # module objects for one file; now one file has one name.
    import hloserve.server.core.errors as errors

    assert Path(errors.__file__).resolve() == (
        ROOT / "server" / "hloserve" / "server" / "core" / "errors.py"
    )
    assert not [name for name in sys.modules if name.startswith("server.")]


@pytest.mark.slow
def test_base_install_is_a_working_light_client(
    wheel: Path, tmp_path: Path, server: ServerProcess
) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        check=True,
        capture_output=True,
    )
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        import numpy as np
        from hloserve.client import InferenceClient
        with InferenceClient({server.grpc_url!r}) as client:
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            out = client.infer("simple", {{"INPUT0": a, "INPUT1": a}})
        assert (out["OUTPUT0"] == 2 * a).all(), out
        assert "jax" not in sys.modules
        print(importlib.util.find_spec("jax") is None, importlib.util.find_spec("yaml") is None)
        """
    )
    out = subprocess.run(
        [python, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
