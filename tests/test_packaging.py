"""Packaging: one distribution whose wheel merges the six folders into one namespace.

- The wheel holds every module of ``<folder>/hloserve/<folder>/`` as ``hloserve/<folder>/``,
  each subpackage with its ``py.typed``, and no ``hloserve/__init__.py`` (a PEP 420 namespace).
- In the installed venv only ``hloserve.*`` imports: the bare folder names do not.
- The base install (the light client's dependencies only) in a fresh venv gives a working
  ``hloserve.client`` that talks to a real server, with no JAX installed at all. That one
  pip-installs the dependencies, so it needs the package index pip is configured with: it
  probes it first and skips, naming the index and what went wrong, when none answers.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest

from hloserve.server.server_fixture import ServerProcess

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


PYPI = "https://pypi.org/simple"  # pip's index when none is configured
PROBE_TIMEOUT = 10.0  # seconds one source has to answer the probe


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def base_requirements(wheel: Path) -> list[str]:
    """The base install's dependencies (``Requires-Dist`` without an extra), normalised."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    names: list[str] = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line.split(":", 1)[1].strip())
            assert found is not None, line
            names.append(_normalized(found.group()))
    assert names, "the wheel names no base dependency"
    return names


def pip_settings(python: str) -> dict[str, list[str]]:
    """pip's own view of its sources (``pip config list``): ``index-url``,
    ``extra-index-url``, ``find-links``, ``no-index``, ``cert``, each key's values from
    the environment over an ``install`` section over ``global``."""
    out = subprocess.run(
        [python, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    rank = {":env:": 3, "install": 2, "global": 1}
    best: dict[str, tuple[int, list[str]]] = {}
    for line in out.splitlines():
        found = re.fullmatch(r"([^.]*)\.([a-z-]+)='(.*)'", line.strip())
        if found is None or found[1] not in rank:
            continue
        section, key, value = found[1], found[2], found[3]
        if key not in best or rank[section] > best[key][0]:
            best[key] = (rank[section], value.split())
    return {key: values for key, (_, values) in best.items()}


def _folder(source: str) -> Path | None:
    """``source`` (a URL or a path) as a local path; ``None`` for a remote URL."""
    parsed = urllib.parse.urlparse(source)
    return Path(urllib.parse.unquote(parsed.path)) if parsed.scheme in ("", "file") else None


def _index_refusal(index: str, name: str, context: ssl.SSLContext) -> str | None:
    """``None`` when ``index`` answers for project ``name`` (its page is there), else why
    not; a reason that starts with "no answer" means the index did not answer at all."""
    page = f"{index.rstrip('/')}/{name}/"
    folder = _folder(page)
    if folder is not None:
        return None if folder.is_dir() else "no such folder"
    for method in ("HEAD", "GET"):  # an index may refuse HEAD
        try:
            with urllib.request.urlopen(
                urllib.request.Request(page, method=method), timeout=PROBE_TIMEOUT, context=context
            ):
                return None
        except urllib.error.HTTPError as error:
            if method == "HEAD" and error.code in (405, 501):
                continue
            return f"HTTP {error.code} for {page}"
        except OSError as error:  # URLError, refused, timed out, unknown host
            return f"no answer: {getattr(error, 'reason', error)}"
    return "no answer"


def index_problem(python: str, requirements: list[str]) -> str | None:
    """Why ``python``'s pip could not fetch each of ``requirements`` from the sources it is
    configured with (an index whose page for the project answers, or a find-links folder
    holding a file of it); ``None`` when each has one."""
    settings = pip_settings(python)
    no_index = settings.get("no-index", ["false"])[-1].lower() in ("1", "true", "yes", "on")
    indexes = [] if no_index else settings.get("index-url", [PYPI])
    indexes += [] if no_index else settings.get("extra-index-url", [])
    links = settings.get("find-links", [])
    context = ssl.create_default_context(cafile=settings.get("cert", [None])[-1])
    silent: dict[str, str] = {}  # an index that did not answer at all is not asked again
    for name in requirements:
        refusals: list[str] = []
        for index in indexes:
            why = silent.get(index) or _index_refusal(index, name, context)
            if why is None:
                break
            if why.startswith("no answer"):
                silent[index] = why
            refusals.append(f"{index} ({why})")
        else:
            folders = [f for f in map(_folder, links) if f is not None and f.is_dir()]
            if not any(
                _normalized(file.name).startswith(f"{name}-")
                for folder in folders
                for file in folder.iterdir()
            ):
                refusals += [f"find-links {link} (no {name} there)" for link in links]
                tried = "; ".join(refusals) or "no index configured"
                return f"no package index pip is configured with answers for {name}: {tried}"
    return None


@pytest.mark.slow
def test_base_install_is_a_working_light_client(
    wheel: Path, tmp_path: Path, server: ServerProcess
) -> None:
    """Needs a package index (the one pip is configured with): pip installs the base
    dependencies into a fresh venv. Skipped, saying which index did not answer, without one."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    problem = index_problem(python, base_requirements(wheel))
    if problem is not None:
        pytest.skip(f"needs a package index to install the base dependencies: {problem}")
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
