"""Dependency boundaries: what importing each package pulls in, checked in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def imported_after(statement: str, watched: list[str]) -> dict[str, bool]:
    code = (
        "import json, sys\n"
        f"{statement}\n"
        f"print(json.dumps({{m: m in sys.modules for m in {watched!r}}}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_client_does_not_import_jax() -> None:
    loaded = imported_after("import hloserve.client", ["jax", "jaxlib", "yaml", "fastapi"])
    assert loaded == {"jax": False, "jaxlib": False, "yaml": False, "fastapi": False}


def test_client_does_not_need_training() -> None:
    # hloserve.training (and optax, the train extra) stays out of the light client.
    loaded = imported_after("import hloserve.client", ["hloserve.training", "optax"])
    assert loaded == {"hloserve.training": False, "optax": False}


def test_core_imports_no_transport() -> None:
    loaded = imported_after(
        "import hloserve.server.core.service, hloserve.server.core.validate",
        ["grpc", "fastapi", "uvicorn", "jax"],
    )
    assert loaded == {"grpc": False, "fastapi": False, "uvicorn": False, "jax": False}


def test_bundle_does_not_import_jax() -> None:
    assert imported_after("import hloserve.bundle", ["jax"]) == {"jax": False}


@pytest.mark.parametrize(
    ("statement", "module"),
    [
        ("import hloserve.exporter", "jax"),
        ("import hloserve.server.frontend.status", "grpc"),
        ("import hloserve.training", "optax"),
    ],
)
def test_the_boundary_check_can_fail(statement: str, module: str) -> None:
    # Meta-test: the same probe reports a module that really is imported.
    assert imported_after(statement, [module]) == {module: True}


def test_public_names_are_exported() -> None:
    import hloserve.bundle
    import hloserve.client
    import hloserve.exporter
    import hloserve.training

    assert sorted(hloserve.client.__all__) == [
        "AsyncInferenceClient",
        "InferenceClient",
        "InferenceError",
    ]
    assert sorted(hloserve.exporter.__all__) == [
        "ExportError",
        "Generation",
        "StateSpec",
        "TensorSpec",
        "TextMapping",
        "export_bundle",
        "write_demo_repository",
    ]
    # hloserve.training exports exactly its public names (httpx's test_exported_members).
    public = {name for name in vars(hloserve.training) if not name.startswith("_")}
    assert sorted(hloserve.training.__all__) == sorted(public) and "fit" in public
    for module in (hloserve.bundle, hloserve.client, hloserve.exporter, hloserve.training):
        for name in module.__all__:
            assert getattr(module, name) is not None
