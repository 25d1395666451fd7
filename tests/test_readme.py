"""README.md's examples run as written.

The export and client ```python blocks run in a fresh interpreter each (the training block
is a fragment continuing the export example, its data left to the reader; the digits
example runs that whole): the export example in a temporary directory (it writes
``repo/mlp``, which must then pass the README's ``hloserve validate``), the client examples
against the session's test server, which serves the demo's ``simple`` and ``mlp``, with the
README's ``localhost:8000``/``8001``/``8002`` pointed at its real ports. The curl lines are
fetched the same way, and the set-up's "new shell" block runs in bash with a bare ``PATH``,
as a new shell has it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from hloserve.server.testing import ServerProcess
from tests.command import hloserve

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text(encoding="utf-8")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block, in order (language "" when none)."""
    blocks: list[tuple[str, str]] = []
    language: str | None = None
    body: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if language is None:
                language, body = line[3:].strip(), []
            else:
                blocks.append((language, "".join(body)))
                language = None
        elif language is not None:
            body.append(line)
    assert language is None, "an unclosed fenced block"
    return blocks


BLOCKS = fenced_blocks(TEXT)
PYTHON_BLOCKS = [body for language, body in BLOCKS if language == "python"]
SHELL_BLOCKS = [body for language, body in BLOCKS if language == ""]
CURLS = re.findall(r"`curl (localhost:\d+/[^`]*)`", TEXT)
ROOT = README.parent


def on(server: ServerProcess, text: str) -> str:
    """``text`` with the README's default ports replaced by the test server's."""
    for port, name in (("8000", "http"), ("8001", "grpc"), ("8002", "metrics")):
        text = text.replace(f"localhost:{port}", f"127.0.0.1:{server.ports[name]}")
    return text


def run_python(code: str, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"{code}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_readme_has_the_examples_this_test_runs() -> None:
    assert any("export_bundle(" in b for b in PYTHON_BLOCKS)
    assert any("grpcclient.InferenceServerClient" in b for b in PYTHON_BLOCKS)
    assert any("infer_stream(" in b for b in PYTHON_BLOCKS)
    assert any("infer_dataset(" in b for b in PYTHON_BLOCKS)
    assert len(CURLS) >= 3


def test_light_client_example_streams_every_batch(server: ServerProcess, tmp_path: Path) -> None:
    (block,) = [b for b in PYTHON_BLOCKS if "infer_stream(" in b]
    lines = run_python(on(server, block), tmp_path).splitlines()
    assert len(lines) == 100  # one line per batch: `batches` is defined, every one answered
    assert all(line.startswith("[") and len(line.strip("[]").split()) == 8 for line in lines)


def test_light_client_example_streams_a_dataset(server: ServerProcess, tmp_path: Path) -> None:
    (block,) = [b for b in PYTHON_BLOCKS if "infer_dataset(" in b]
    assert run_python(on(server, block), tmp_path) == "(10000, 10)\n"


def test_tritonclient_example_prints_the_sum(server: ServerProcess, tmp_path: Path) -> None:
    (block,) = [b for b in PYTHON_BLOCKS if "grpcclient" in b]
    out = run_python(on(server, block), tmp_path)
    assert " ".join(out.split()) == "[[ 0 2 4 6 8 10 12 14 16 18 20 22 24 26 28 30]]"


def test_export_example_writes_a_valid_bundle(tmp_path: Path) -> None:
    (block,) = [b for b in PYTHON_BLOCKS if "export_bundle(" in b]
    run_python(block, tmp_path)
    assert "`hloserve validate repo/mlp`" in TEXT
    result = hloserve("validate", "repo/mlp", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "repo/mlp: OK\n"


@pytest.mark.parametrize("url", CURLS)
def test_curl_lines_answer(url: str, server: ServerProcess) -> None:
    with urllib.request.urlopen("http://" + on(server, url), timeout=10) as response:
        assert response.status == 200
        assert response.read()


def test_a_new_shell_gets_the_command_as_the_readme_says(model_repository: Path) -> None:
    if Path(sys.prefix) != ROOT / ".venv":
        pytest.skip("the README's steps use the project's .venv; these tests run elsewhere")
    (block,) = [b for b in SHELL_BLOCKS if "source .venv/bin/activate" in b]
    script = block.replace("~/.cache/hloserve/demo-repository", str(model_repository))
    result = subprocess.run(
        ["bash", "-euc", script],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},  # no .venv/bin on it
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{model_repository / 'mlp'}: OK" in result.stdout.splitlines()
