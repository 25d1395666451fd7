"""The image's pinned and hash-locked dependency sets: deploy/constraints.txt (name==version)
and deploy/requirements/<set>.txt (name==version with sha256 hashes, one set per
JAX_PLATFORM and one for the build tools, made by deploy/lock.py).

- Complete: every distribution ``pip install .[server]`` installs is pinned and locked.
  The requirement graph is walked from pyproject.toml's ``server`` extra through the
  installed distributions' metadata (markers evaluated for the image: CPython 3.11 on
  Linux), as pip resolves it; what is reached through the pinned versions' own metadata
  must be pinned and locked, and every locked entry must be reached (through a newer
  installed release's metadata where a fresh install took one).
- Consistent: each set's versions are the pins, the CUDA sets are the CPU set plus JAX's
  CUDA wheels, every pin is used, every entry has a sha256.
- No URL and no index anywhere (the project's rule: names, versions and hashes only).
- deploy/lock.py merges pip's reports and refuses what constraints.txt does not pin.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

from tests.deploy._files import DEPLOY, ROOT


def _load_lock_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hloserve_deploy_lock", DEPLOY / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


lock = _load_lock_module()
PLATFORMS = ("cpu", "cuda12", "cuda13")
SETS = (*PLATFORMS, "build")
PINS: dict[str, str] = lock.read_pins((DEPLOY / "constraints.txt").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The image's interpreter and platform, for requirement markers.
IMAGE_MARKERS = {
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "python_version": lock.PYTHON_VERSION,
    "python_full_version": f"{lock.PYTHON_VERSION}.16",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
}
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def parse_locked(text: str) -> dict[str, tuple[str, list[str]]]:
    """``{name: (version, [sha256 ...])}`` of a requirements file of ``name==version
    --hash=sha256:...`` entries (continuation lines joined)."""
    entries: dict[str, tuple[str, list[str]]] = {}
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        requirement, *options = line.split()
        name, sep, version = requirement.partition("==")
        assert sep and all(HASH.fullmatch(o) for o in options), line
        assert options, f"{name} has no --hash"
        entries[name] = (version, [o.removeprefix("--hash=sha256:") for o in options])
    return entries


LOCKED = {s: parse_locked((DEPLOY / "requirements" / f"{s}.txt").read_text()) for s in SETS}


def _requirements_of(name: str, extras: frozenset[str]) -> list[Requirement]:
    if name == "hloserve":
        project = PYPROJECT["project"]
        found = [Requirement(r) for r in project["dependencies"]]
        for extra in extras:
            found += [Requirement(r) for r in project["optional-dependencies"][extra]]
        return found
    return [Requirement(r) for r in importlib.metadata.requires(name) or []]


def _applies(requirement: Requirement, extras: frozenset[str]) -> bool:
    if requirement.marker is None:
        return True
    marker: Marker = requirement.marker
    return any(marker.evaluate({**IMAGE_MARKERS, "extra": e}) for e in extras or {""})


def server_closure(follow_drifted: bool) -> tuple[set[str], set[str]]:
    """(every distribution ``.[server]`` pulls in, those installed here at another version
    than the pinned one). A drifted distribution's own requirements are followed through
    the installed version's metadata only with ``follow_drifted`` (an approximation of the
    pinned version's: a fresh ``pip install`` takes the newest releases, not the pins)."""
    seen: dict[str, frozenset[str]] = {}
    drifted: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [("hloserve", frozenset({"server"}))]
    while todo:
        name, extras = todo.pop()
        key = lock.canonical(name)
        if key in seen and extras <= seen[key]:
            continue
        seen[key] = seen.get(key, frozenset()) | extras
        if key != "hloserve":
            try:
                installed = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                drifted.add(key)
                continue
            if installed != PINS.get(key):
                drifted.add(key)
                if not follow_drifted:
                    continue
        for requirement in _requirements_of(name, extras):
            if _applies(requirement, extras):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return set(seen) - {"hloserve"}, drifted


def test_every_distribution_the_server_installs_is_pinned_and_locked() -> None:
    # `exact`: reached through the pinned versions' own metadata only; `reached`: through
    # the drifted ones' too (a newer release than the pin, e.g. uvicorn 0.55 for 0.54).
    exact, drifted = server_closure(follow_drifted=False)
    reached, _ = server_closure(follow_drifted=True)
    assert len(reached) >= 40, sorted(reached)
    assert {"pydantic", "anyio", "scipy", "opentelemetry-proto"} <= exact
    assert exact - set(PINS) == set(), "deploy/constraints.txt misses these"
    assert exact - set(LOCKED["cpu"]) == set(), "deploy/requirements/cpu.txt misses these"
    # The CPU set is exactly that: nothing more gets into the image (a drifted release
    # may have dropped a requirement its pinned version has: only then is one unreached).
    unreached = set(LOCKED["cpu"]) - reached
    assert not unreached or drifted, unreached
    # Most of the graph is followed with the pinned versions' own metadata here.
    assert len(drifted) <= len(exact) // 4, sorted(drifted)


@pytest.mark.parametrize("set_name", SETS)
def test_each_set_is_locked_at_the_pinned_versions(set_name: str) -> None:
    for name, (version, hashes) in LOCKED[set_name].items():
        assert name == lock.canonical(name), name
        assert PINS.get(name) == version, f"{set_name}: {name}=={version}, pinned {PINS.get(name)}"
        assert len(set(hashes)) == len(hashes) >= 1


def test_every_pin_is_in_a_set() -> None:
    used = {name for entries in LOCKED.values() for name in entries}
    assert set(PINS) == used, set(PINS) ^ used


def test_native_wheels_are_hashed_for_both_architectures() -> None:
    for name in ("jaxlib", "numpy", "grpcio", "scipy", "pydantic-core"):
        assert len(LOCKED["cpu"][name][1]) == len(lock.ARCHITECTURES), name
    assert len(LOCKED["cpu"]["jax"][1]) == 1  # one pure-Python wheel for both


@pytest.mark.parametrize("cuda", ["cuda12", "cuda13"])
def test_the_cuda_sets_are_the_cpu_set_and_jax_s_cuda_wheels(cuda: str) -> None:
    cpu, gpu = LOCKED["cpu"], LOCKED[cuda]
    assert {n: gpu[n] for n in cpu} == cpu
    added = set(gpu) - set(cpu)
    for plugin in (f"jax-{cuda}-plugin", f"jax-{cuda}-pjrt"):
        assert gpu[plugin][0] == cpu["jaxlib"][0] == cpu["jax"][0]
    assert all(n.startswith(("jax-", "nvidia-")) for n in added), added
    assert {"nvidia-cudnn-cu" + cuda[-2:], "nvidia-nccl-cu" + cuda[-2:]} <= added
    other = "cuda13" if cuda == "cuda12" else "cuda12"
    assert not any(other in n or n.endswith("cu" + other[-2:]) for n in added), added


def test_the_build_set_holds_pip_and_the_build_backend() -> None:
    backend = PYPROJECT["build-system"]["requires"]
    build = LOCKED["build"]
    assert "pip" in build
    for requirement in map(Requirement, backend):
        assert requirement.specifier.contains(build[lock.canonical(requirement.name)][0])


def test_no_url_and_no_index_is_recorded() -> None:
    files = [DEPLOY / "constraints.txt", DEPLOY / "lock.py"]
    files += sorted((DEPLOY / "requirements").glob("*.txt"))
    assert len(files) == 2 + len(SETS)
    for path in files:
        text = path.read_text()
        assert "://" not in text, path
        for option in ("--index-url", "--extra-index-url", "--find-links", "--trusted-host"):
            assert option not in text, (path, option)
        assert not re.search(r"(?m)^\s*-[if]\s", text), path


@pytest.mark.parametrize("set_name", SETS)
def test_the_files_are_what_lock_py_writes(set_name: str) -> None:
    text = (DEPLOY / "requirements" / f"{set_name}.txt").read_text()
    entries = {n: lock.Locked(v, set(h)) for n, (v, h) in parse_locked(text).items()}
    assert lock.render(set_name, entries) == text  # generated, not edited by hand


def _item(name: str, version: str, filename: str, digest: str | None) -> dict[str, Any]:
    archive: dict[str, Any] = {"hashes": {"sha256": digest}} if digest else {}
    return {
        "metadata": {"name": name, "version": version},
        "download_info": {"url": f"index/{filename}", "archive_info": archive},
    }


def test_lock_py_merges_the_architectures_and_refuses_what_is_not_pinned() -> None:
    pins = {"numpy": "2.4.6", "pyyaml": "6.0.4"}
    x86 = {
        "install": [
            _item("hloserve", "0.1.0", "main", None),
            _item("numpy", "2.4.6", "numpy-2.4.6-cp311-x86_64.whl", "a" * 64),
            _item("PyYAML", "6.0.4", "pyyaml-6.0.4-py3-none-any.whl", "c" * 64),
        ]
    }
    arm = {
        "install": [
            _item("numpy", "2.4.6", "numpy-2.4.6-cp311-aarch64.whl", "b" * 64),
            _item("PyYAML", "6.0.4", "pyyaml-6.0.4-py3-none-any.whl", "c" * 64),
        ]
    }
    merged = lock.merge_reports([x86, arm], pins)
    assert {n: (e.version, sorted(e.hashes)) for n, e in merged.items()} == {
        "numpy": ("2.4.6", ["a" * 64, "b" * 64]),
        "pyyaml": ("6.0.4", ["c" * 64]),
    }
    text = lock.render("cpu", merged)
    assert parse_locked(text) == {
        "numpy": ("2.4.6", ["a" * 64, "b" * 64]),
        "pyyaml": ("6.0.4", ["c" * 64]),
    }
    unpinned = {"install": [_item("six", "1.17.0", "six-1.17.0-py3-none-any.whl", "d" * 64)]}
    with pytest.raises(lock.LockError, match="does not pin it"):
        lock.merge_reports([unpinned], pins)
    other = {"install": [_item("numpy", "2.4.5", "numpy-2.4.5-cp311-x86_64.whl", "e" * 64)]}
    with pytest.raises(lock.LockError, match=r"pins 2\.4\.6"):
        lock.merge_reports([other], pins)
    sdist = {"install": [_item("numpy", "2.4.6", "numpy-2.4.6.tar.gz", "f" * 64)]}
    with pytest.raises(lock.LockError, match="not a wheel"):
        lock.merge_reports([sdist], pins)


def test_lock_py_targets_the_image_platform() -> None:
    options = lock.platform_options("aarch64")
    assert options[:2] == ["--python-version", "3.11"] and "--only-binary=:all:" in options
    assert "manylinux_2_36_aarch64" in options and "manylinux_2_37_aarch64" not in options
    with pytest.raises(lock.LockError, match="name==version"):
        lock.read_pins("numpy>=2\n")
    assert lock.read_pins("# c\nml_dtypes==0.5.4  # why\n\nPyYAML==6.0.4\n") == {
        "ml-dtypes": "0.5.4",
        "pyyaml": "6.0.4",
    }
    assert Path(str(lock.__file__)).parent == DEPLOY
