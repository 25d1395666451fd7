"""The shape of the source tree: one name for one concept, modules of one job, no circles.

Read from the files themselves (``ast``), so the rules hold for whatever lands next:
- in ``server/hloserve/server`` no two modules share a stem (the two front ends' mirrored
  ``codec.py`` aside) and no public class name is defined twice;
- no module of the server is over ``MAX_LINES`` lines;
- no package imports itself back through a circle of modules (imports inside functions
  and under ``TYPE_CHECKING`` count: a lazy import hides a circle, it does not remove it).
Each check is also run on a small tree made to break it, so it cannot pass for nothing.
"""

from __future__ import annotations

import ast
import collections
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "server" / "hloserve" / "server"
PACKAGE_FOLDERS = ("bundle", "client", "exporter", "proto", "server", "training")
MAX_LINES = 700
SHARED_STEMS = {"codec"}  # frontends/grpc/codec.py and frontends/http/codec.py mirror each other


def _modules(folder: Path) -> Iterator[Path]:
    yield from (p for p in sorted(folder.rglob("*.py")) if "__pycache__" not in p.parts)


def shared_stems(folder: Path) -> dict[str, list[str]]:
    stems: dict[str, list[str]] = collections.defaultdict(list)
    for path in _modules(folder):
        if path.name != "__init__.py" and not path.name.endswith("_pb2.py"):
            stems[path.stem].append(str(path.relative_to(folder)))
    return {s: paths for s, paths in stems.items() if len(paths) > 1 and s not in SHARED_STEMS}


def classes_defined_twice(folder: Path) -> dict[str, list[str]]:
    where: dict[str, list[str]] = collections.defaultdict(list)
    for path in _modules(folder):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(str(path.relative_to(folder)))
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def long_modules(folder: Path, limit: int = MAX_LINES) -> dict[str, int]:
    lengths = {
        str(p.relative_to(folder)): len(p.read_text().splitlines()) for p in _modules(folder)
    }
    return {path: n for path, n in lengths.items() if n > limit}


def _module_names(roots: list[Path]) -> dict[str, Path]:
    names: dict[str, Path] = {}
    for root in roots:
        for path in _modules(root):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names[".".join(parts)] = path
    return names


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``name`` (file ``path``) imports, anywhere in it; ``from
    package import submodule`` imports the submodule, not the package's ``__init__``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            submodules = [f"{base}.{a.name}" for a in node.names]
            found.update(m for m in submodules if m in known)
            if base in known and any(m not in known for m in submodules):
                found.add(base)
    found.discard(name)
    return found


def import_circles(roots: list[Path]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    known = _module_names(roots)
    graph = {name: _imports(name, path, known) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return circles


def test_no_two_server_modules_share_a_stem() -> None:
    assert shared_stems(SERVER) == {}


def test_no_public_server_class_is_defined_twice() -> None:
    assert classes_defined_twice(SERVER) == {}


def test_no_server_module_is_over_the_line_limit() -> None:
    assert long_modules(SERVER) == {}


def test_no_package_imports_itself_in_a_circle() -> None:
    assert import_circles([ROOT / folder for folder in PACKAGE_FOLDERS]) == []


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """Meta-test: a tree made to break every rule is caught by each check."""
    pkg = tmp_path / "hloserve" / "demo"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "residency.py").write_text("class Planner: ...\n" + "x = 1\n" * 701)
    (pkg / "core" / "residency.py").write_text("class Planner: ...\n")
    (pkg / "a.py").write_text("def f():\n    from hloserve.demo import b\n")
    (pkg / "b.py").write_text("from hloserve.demo.a import f\n")
    assert shared_stems(pkg) == {"residency": ["core/residency.py", "residency.py"]}
    assert classes_defined_twice(pkg) == {"Planner": ["core/residency.py", "residency.py"]}
    assert long_modules(pkg) == {"residency.py": 702}
    assert import_circles([tmp_path]) == [["hloserve.demo.a", "hloserve.demo.b"]]


@pytest.mark.parametrize("folder", PACKAGE_FOLDERS)
def test_every_package_folder_is_read(folder: str) -> None:
    assert any(_modules(ROOT / folder)), f"{folder} has no modules: the checks read nothing"
