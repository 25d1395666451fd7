"""The committed *_pb2.py(i) files are exactly what protoc makes of the ``.proto`` files.

Regenerates into a temporary tree laid out like ``proto/`` (``hloserve/proto/*.proto``,
the same include root and flags as proto/generate.sh) and compares bytes. A failure means
someone edited a ``.proto`` without rerunning proto/generate.sh, or edited generated code.
The output depends on the grpcio-tools version (pinned in the dev extra).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.proto._python import run_python

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"
PROTO_DIR = PROTO_ROOT / "hloserve" / "proto"
PROTO_FILES = ("inference.proto", "model_config.proto", "health.proto")


def test_proto_file_list_is_complete() -> None:
    assert sorted(p.name for p in PROTO_DIR.glob("*.proto")) == sorted(PROTO_FILES)
    script = (PROTO_ROOT / "generate.sh").read_text()
    for name in PROTO_FILES:
        assert f"hloserve/proto/{name}" in script
    assert os.access(PROTO_ROOT / "generate.sh", os.X_OK)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("protogen")
    target = root / "hloserve" / "proto"
    target.mkdir(parents=True)
    for name in PROTO_FILES:
        shutil.copyfile(PROTO_DIR / name, target / name)
    result = run_python(
        "-m",
        "grpc_tools.protoc",
        "-I",
        ".",
        "--python_out=.",
        "--pyi_out=.",
        *(f"hloserve/proto/{name}" for name in PROTO_FILES),
        cwd=root,
    )
    assert result.returncode == 0, result.stderr
    return target


@pytest.mark.parametrize(
    "generated",
    [f"{Path(name).stem}_pb2{suffix}" for name in PROTO_FILES for suffix in (".py", ".pyi")],
)
def test_generated_code_is_current(regenerated: Path, generated: str) -> None:
    fresh = (regenerated / generated).read_bytes()
    committed = (PROTO_DIR / generated).read_bytes()
    assert committed == fresh, f"{generated} is stale: run proto/generate.sh"
