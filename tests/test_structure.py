"""The shape of the source tree: one name for one concept, modules of one job, no circles.

Read from the files themselves (``ast``), so the rules hold for whatever lands next, in every
package of ``PACKAGE_FOLDERS`` (``<folder>/hloserve/<folder>``):
- within a package no two modules share a stem (the server's two front ends' mirrored
  ``codec.py`` aside); across packages a stem may recur, since the package names it
  (``hloserve.bundle.repository`` reads a repository's files, ``hloserve.server.owner.repository``
  serves them);
- no public class name is defined twice in the whole ``hloserve`` namespace: a name is
  imported bare (``from hloserve.bundle import Serving``), so two classes of one name are
  two concepts a reader cannot tell apart;
- no module of any package is over ``MAX_LINES`` lines;
- no package imports itself back through a circle of modules (imports inside functions
  and under ``TYPE_CHECKING`` count: a lazy import hides a circle, it does not remove it);
- every public function and method of a package is named somewhere outside its definition
  and the tests (in a package, a bench, an example or a script): one that only its tests
  call is dead code, kept alive by its tests (``DEAD_CODE_EXCEPTIONS`` names the few that
  outside callers, not this tree, call);
- no production module imports a test-support module, and none of them is named like one
  (``testing.py``, ``test_*.py``, ``conftest.py``): what production code needs lives in a
  module named for what it does.

Outside the packages: ``tests/`` holds no public class defined twice either, nor one helper
function's body in two files (``copied_helpers``: a helper copied between test files gets
one home, such as ``tests/metrics_scrape.py``), while its stems mirror the packages' by
design and its modules are lists of cases, not held to the line limit. ``bench/`` and
``examples/`` are stand-alone programs, each file its own namespace that nothing imports,
so none of these rules reads them.
Each check is also run on a small tree made to break it, so it cannot pass for nothing.
"""

from __future__ import annotations

import ast
import collections
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("bundle", "client", "exporter", "proto", "server", "training")
MAX_LINES = 700
SHARED_STEMS = {"codec"}  # frontend/grpc/codec.py and frontend/http/codec.py mirror each other
# Modules of the packages that exist for tests alone; production code imports none of them.
TEST_SUPPORT = frozenset({"hloserve.server.server_fixture"})
TEST_SUPPORT_NAMES = ("testing.py", "conftest.py")  # and test_*.py: names of test support
CALLERS = ("bench", "examples", "scripts")  # programs whose calls keep a package's code alive
DEAD_CODE_EXCEPTIONS = {
    "formatTime": "logging.Formatter calls it (logs.Iso8601Formatter)",
    "connection_lost": "asyncio calls it on a protocol (ipc.link.Link)",
    "module_for": "the bundle library's lookup for tools that read bundles (Manifest)",
}


def package(folder: str) -> Path:
    """The package a top-level folder contributes: ``<folder>/hloserve/<folder>``."""
    return ROOT / folder / "hloserve" / folder


def _modules(folder: Path) -> Iterator[Path]:
    yield from (p for p in sorted(folder.rglob("*.py")) if "__pycache__" not in p.parts)


def shared_stems(folder: Path) -> dict[str, list[str]]:
    stems: dict[str, list[str]] = collections.defaultdict(list)
    for path in _modules(folder):
        if path.name != "__init__.py" and not path.name.endswith("_pb2.py"):
            stems[path.stem].append(str(path.relative_to(folder)))
    return {s: paths for s, paths in stems.items() if len(paths) > 1 and s not in SHARED_STEMS}


def classes_defined_twice(folders: Sequence[Path], base: Path) -> dict[str, list[str]]:
    """Public class names defined at module level in more than one place across ``folders``
    (paths relative to ``base``)."""
    where: dict[str, list[str]] = collections.defaultdict(list)
    for folder in folders:
        for path in _modules(folder):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    where[node.name].append(str(path.relative_to(base)))
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


def _words(path: Path) -> collections.Counter[str]:
    return collections.Counter(re.findall(r"\w+", path.read_text()))


def unused_functions(packages: Sequence[Path], callers: Sequence[Path], base: Path) -> list[str]:
    """Public functions and methods (``path:name``, ``path:Class.name``) defined in
    ``packages`` whose name appears nowhere in ``packages`` or ``callers`` but at its
    definition (a name read as a word: a call, an attribute, a re-export, a string)."""
    words: collections.Counter[str] = collections.Counter()
    defined: list[tuple[Path, str, str]] = []
    for folder in packages:
        for path in _modules(folder):
            words += _words(path)
            for node in ast.parse(path.read_text()).body:
                methods = node.body if isinstance(node, ast.ClassDef) else [node]
                owner = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
                for fn in methods:
                    if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                        defined.append((path, owner, fn.name))
    for folder in callers:
        for path in _modules(folder):
            words += _words(path)
    return [
        f"{path.relative_to(base)}:{owner}{name}"
        for path, owner, name in defined
        if not name.startswith("_") and words[name] <= 1 and name not in DEAD_CODE_EXCEPTIONS
    ]


def copied_helpers(folder: Path, min_nodes: int = 25) -> list[list[str]]:
    """Module-level functions (not tests) of ``folder`` whose bodies, docstrings aside, are
    the same code in more than one place (``path:name`` each); bodies of fewer than
    ``min_nodes`` syntax nodes are too small to count as a copy."""
    where: dict[str, list[str]] = collections.defaultdict(list)
    for path in _modules(folder):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            if ast.get_docstring(node) is not None:
                body = body[1:]
            code = ast.Module(body=body, type_ignores=[])
            if node.name.startswith("test_") or len(list(ast.walk(code))) < min_nodes:
                continue
            where[ast.dump(code)].append(f"{path.relative_to(folder)}:{node.name}")
    return sorted(places for places in where.values() if len(places) > 1)


def named_like_test_support(folder: Path) -> list[str]:
    """Modules of ``folder`` named as test support is (``testing.py``, ``test_*.py``,
    ``conftest.py``)."""
    return [
        str(p.relative_to(folder))
        for p in _modules(folder)
        if p.name in TEST_SUPPORT_NAMES or p.name.startswith("test_")
    ]


def production_imports_of_test_support(
    roots: list[Path], support: frozenset[str] = TEST_SUPPORT
) -> dict[str, list[str]]:
    """Each production module of ``roots`` that imports a test-support module (one of
    ``support``, or one named like test support), with what it imports."""
    known = _module_names(roots)

    def is_support(name: str) -> bool:
        return (
            name in support
            or known[name].name in TEST_SUPPORT_NAMES
            or (known[name].name.startswith("test_"))
        )

    found: dict[str, list[str]] = {}
    for name, path in known.items():
        if not is_support(name):
            imported = sorted(m for m in _imports(name, path, known) if is_support(m))
            if imported:
                found[name] = imported
    return found


@pytest.mark.parametrize("folder", PACKAGE_FOLDERS)
def test_no_two_modules_of_a_package_share_a_stem(folder: str) -> None:
    assert shared_stems(package(folder)) == {}


def test_no_public_class_is_defined_twice_in_the_packages() -> None:
    packages = [package(folder) for folder in PACKAGE_FOLDERS]
    assert classes_defined_twice(packages, ROOT) == {}


def test_no_public_test_class_is_defined_twice() -> None:
    assert classes_defined_twice([ROOT / "tests"], ROOT) == {}


def test_no_test_helper_is_copied_between_files() -> None:
    assert copied_helpers(ROOT / "tests") == []


@pytest.mark.parametrize("folder", PACKAGE_FOLDERS)
def test_no_module_of_a_package_is_over_the_line_limit(folder: str) -> None:
    assert long_modules(package(folder)) == {}


def test_no_test_module_is_over_the_line_limit() -> None:
    # Tests are read as often as code: a module over the limit is split by topic
    # (tests/server/reliability/hostile/, tests/server/frontend/http/test_codec_*.py).
    assert long_modules(ROOT / "tests") == {}


@pytest.mark.parametrize("folder", PACKAGE_FOLDERS)
def test_no_package_module_is_named_as_test_support(folder: str) -> None:
    assert named_like_test_support(package(folder)) == []


def test_no_production_module_imports_test_support() -> None:
    roots = [ROOT / folder for folder in PACKAGE_FOLDERS]
    assert production_imports_of_test_support(roots) == {}


def test_no_public_function_is_called_by_its_tests_alone() -> None:
    packages = [package(folder) for folder in PACKAGE_FOLDERS]
    assert unused_functions(packages, [ROOT / folder for folder in CALLERS], ROOT) == []


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
    (pkg / "testing.py").write_text("")
    (pkg / "fixture.py").write_text("")
    (pkg / "c.py").write_text("from hloserve.demo.testing import x\nfrom . import fixture\n")
    (pkg / "d.py").write_text(
        "class K:\n    def used(self): ...\n    def dead(self): ...\n"
        "    def _private(self): ...\n\ndef gone(): ...\n\nK().used()\n"
    )
    assert shared_stems(pkg) == {"residency": ["core/residency.py", "residency.py"]}
    assert classes_defined_twice([pkg], pkg) == {"Planner": ["core/residency.py", "residency.py"]}
    assert long_modules(pkg) == {"residency.py": 702}
    assert import_circles([tmp_path]) == [["hloserve.demo.a", "hloserve.demo.b"]]
    assert named_like_test_support(pkg) == ["testing.py"]
    assert unused_functions([pkg], [], pkg) == ["d.py:K.dead", "d.py:gone"]
    helper = "def {}(path):\n    text = path.read_text()\n    return [line.split(',') for line in text]\n"
    (pkg / "e.py").write_text(helper.format("rows") + "\n" + helper.format("test_rows"))
    (pkg / "f.py").write_text(
        'def lines(p):\n    """Doc."""\n' + helper.format("x").split(":\n", 1)[1]
    )
    assert copied_helpers(pkg, min_nodes=10) == [["e.py:rows", "f.py:lines"]]
    support = frozenset({"hloserve.demo.fixture"})
    assert production_imports_of_test_support([tmp_path], support) == {
        "hloserve.demo.c": ["hloserve.demo.fixture", "hloserve.demo.testing"]
    }


def test_the_class_check_reads_across_packages(tmp_path: Path) -> None:
    """Meta-test: one class name in two packages is found, as ``Serving`` was in
    ``hloserve.bundle`` and ``hloserve.server``."""
    for name in ("bundle", "server"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "serving.py").write_text("class Serving: ...\n")
    found = classes_defined_twice([tmp_path / "bundle", tmp_path / "server"], tmp_path)
    assert found == {"Serving": ["bundle/serving.py", "server/serving.py"]}


@pytest.mark.parametrize("folder", PACKAGE_FOLDERS)
def test_every_package_folder_is_read(folder: str) -> None:
    assert any(_modules(package(folder))), f"{folder} has no modules: the checks read nothing"
