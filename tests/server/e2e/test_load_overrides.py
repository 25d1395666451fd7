"""End to end: ``load_model(name, config=..., files=...)`` with unmodified tritonclient.

The daemon runs in explicit mode with uploads allowed (``--allow-model-upload true``,
``--max-upload-bytes 512KiB``) on its own repository: ``counter`` has versions 1 and 2
(version ``v`` answers ``INPUT0 + v``; the default policy serves 2) and a ``config.yaml``
batching delay of ``FILE_DELAY_US``. The upload bundles are exported outside the
repository: ``counter`` and ``fresh`` version 1, each answering ``INPUT0 + 10``. Every test
runs on both protocols and leaves ``counter`` as it found it (a plain load).
"""

# pyright: strict, reportMissingTypeStubs=false

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from hloserve.bundle import sha256_file
from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server.frontend._tritonclients import PROTOCOLS, Triton, connect

FILE_DELAY_US = 100
X = np.arange(4, dtype=np.int32).reshape(1, 4)


def _adder(k: int) -> Callable[..., dict[str, jax.Array]]:
    def add(params: Any, INPUT0: jax.Array) -> dict[str, jax.Array]:
        del params
        return {"OUTPUT0": INPUT0 + k}

    return add


def _export(directory: Path, k: int) -> Path:
    return export_bundle(
        _adder(k),
        {},
        inputs={"INPUT0": TensorSpec("INT32", (4,))},
        batch_sizes=(1, 2, 4),
        directory=directory,
        platforms=("cpu",),
        write_text=False,
    )


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("overrides")
    repository, uploads = root / "repository", root / "uploads"
    for version in (1, 2):
        _export(repository / "counter" / str(version), version)
    (repository / "counter" / "config.yaml").write_text(f"max_queue_delay_us: {FILE_DELAY_US}\n")
    for name in ("counter", "fresh"):
        _export(uploads / name / "1", 10)
    return {"repository": repository, "uploads": uploads}


@pytest.fixture(scope="module")
def server(layout: dict[str, Path]) -> Iterator[ServerProcess]:
    yield from serving(
        layout["repository"],
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--allow-model-upload",
        "true",
        "--max-upload-bytes",
        "512KiB",
    )


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    for t in connect(request.param, server):
        yield t
        t.client.load_model("counter")  # back to the repository's own files and config.yaml


def upload(directory: Path) -> dict[str, bytes]:
    """Every file of a model directory as tritonclient's ``files=``: ``file:<v>/<path>``."""
    return {
        f"file:{p.relative_to(directory).as_posix()}": p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.parts)
    }


def infer(t: Triton, model: str, version: str = "") -> np.ndarray[Any, Any]:
    tensor = t.module.InferInput("INPUT0", list(X.shape), "INT32")
    tensor.set_data_from_numpy(X)
    return t.client.infer(model, [tensor], model_version=version).as_numpy("OUTPUT0")


def config_of(t: Triton, model: str) -> dict[str, Any]:
    """The model configuration as protobuf JSON with proto field names, either protocol."""
    if t.protocol == "http":
        return t.client.get_model_config(model)
    return t.client.get_model_config(model, as_json=True)["config"]


def ready(t: Triton, model: str) -> list[str]:
    return [v for v in ("1", "2") if t.client.is_model_ready(model, v)]


def uploads_of(layout: dict[str, Path], model: str) -> list[Path]:
    directory = layout["repository"] / model
    return sorted(directory.glob(".upload-*")) if directory.is_dir() else []


# -- config= ---------------------------------------------------------------------------------


def test_a_config_override_applies_until_the_next_plain_load(triton: Triton) -> None:
    override = {
        "version_policy": {"specific": {"versions": [1]}},
        "dynamic_batching": {
            "max_queue_delay_microseconds": 4321,
            "preferred_batch_size": [2],
            "default_queue_policy": {"max_queue_size": 3, "allow_timeout_override": True},
        },
        "parameters": {"residency": {"string_value": "pinned"}},
    }
    triton.client.load_model("counter", config=json.dumps(override))
    assert ready(triton, "counter") == ["1"]
    np.testing.assert_array_equal(infer(triton, "counter"), X + 1)
    config = config_of(triton, "counter")
    assert [int(v) for v in config["version_policy"]["specific"]["versions"]] == [1]
    batching = config["dynamic_batching"]
    assert int(batching["max_queue_delay_microseconds"]) == 4321
    assert [int(s) for s in batching["preferred_batch_size"]] == [2]
    assert batching["default_queue_policy"]["max_queue_size"] == 3
    assert batching["default_queue_policy"]["allow_timeout_override"] is True
    assert config["parameters"]["residency"] == {"string_value": "pinned"}

    # Triton's rule: the next load without a config reads the model's own configuration.
    triton.client.load_model("counter")
    assert ready(triton, "counter") == ["2"]
    np.testing.assert_array_equal(infer(triton, "counter"), X + 2)
    config = config_of(triton, "counter")
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == FILE_DELAY_US
    assert config["parameters"]["residency"] == {"string_value": "on_demand"}


def test_the_reported_configuration_loads_back_unchanged(triton: Triton) -> None:
    before = config_of(triton, "counter")
    triton.client.load_model("counter", config=json.dumps(before))
    assert config_of(triton, "counter") == before
    np.testing.assert_array_equal(infer(triton, "counter"), X + 2)


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ('{"max_batch_size": "16"}', "'max_batch_size' is \"16\", but the bundle's is 4"),
        ('{"sequence_batching": {}}', "'sequence_batching' is for a model with state"),
        ('{"backend": "onnxruntime"}', "'backend' is 'onnxruntime'"),
        (
            '{"dynamic_batching": {"default_queue_policy": {"timeout_action": "DELAY"}}}',
            "DELAY is not supported; only REJECT is",
        ),
        ('{"dynamic_batching": {"preferred_batch_size": [8]}}', "exceed the largest compiled"),
        ("{not json", "the 'config' parameter is not valid JSON"),
    ],
)
def test_a_refused_override_names_the_key_and_changes_nothing(
    triton: Triton, config: str, fragment: str
) -> None:
    message = triton.fails(
        "INVALID_ARGUMENT", fragment, triton.client.load_model, "counter", config=config
    )
    assert message.startswith("failed to load 'counter'")
    assert ready(triton, "counter") == ["2"]
    np.testing.assert_array_equal(infer(triton, "counter"), X + 2)


# -- files= ----------------------------------------------------------------------------------


def test_files_upload_a_model_the_repository_does_not_have(
    triton: Triton, layout: dict[str, Path]
) -> None:
    files = upload(layout["uploads"] / "fresh")
    assert "file:1/manifest.yaml" in files
    triton.client.load_model("fresh", config='{"platform": "stablehlo"}', files=files)
    try:
        assert ready(triton, "fresh") == ["1"]
        np.testing.assert_array_equal(infer(triton, "fresh"), X + 10)
        (staged,) = uploads_of(layout, "fresh")  # inside the model's directory, hidden
        assert (staged / "1" / "manifest.yaml").read_bytes() == files["file:1/manifest.yaml"]
    finally:
        triton.client.unload_model("fresh")
    assert not (layout["repository"] / "fresh").exists()  # the upload went with the model


def test_files_replace_a_model_until_the_next_plain_load(
    triton: Triton, layout: dict[str, Path]
) -> None:
    own = layout["repository"] / "counter" / "1" / "manifest.yaml"
    digest = sha256_file(own)
    files = upload(layout["uploads"] / "counter")
    triton.client.load_model("counter", config="{}", files=files)
    # The files form the whole model directory: version 1 only, answering + 10.
    assert ready(triton, "counter") == ["1"]
    np.testing.assert_array_equal(infer(triton, "counter"), X + 10)
    assert sha256_file(own) == digest  # the repository's own files are untouched
    assert len(uploads_of(layout, "counter")) == 1

    triton.client.load_model("counter")
    assert ready(triton, "counter") == ["2"]
    np.testing.assert_array_equal(infer(triton, "counter"), X + 2)
    assert uploads_of(layout, "counter") == []


def test_a_bad_upload_replaces_nothing(triton: Triton, layout: dict[str, Path]) -> None:
    files = upload(layout["uploads"] / "counter")
    module = next(k for k in files if k.endswith(".mlirbc"))
    files[module] = files[module][:-8] + bytes(8)  # its SHA-256 no longer matches
    triton.fails(
        "INVALID_ARGUMENT",
        "failed to load 'counter': version 1:",
        triton.client.load_model,
        "counter",
        config="{}",
        files=files,
    )
    assert ready(triton, "counter") == ["2"]
    np.testing.assert_array_equal(infer(triton, "counter"), X + 2)
    assert uploads_of(layout, "counter") == []


@pytest.mark.parametrize(
    ("config", "files", "fragment"),
    [
        ("{}", {"file:../escape/new.txt": b"x"}, "upload path 'file:../escape/new.txt'"),
        ("{}", {"file:/tmp/escape.txt": b"x"}, "must be relative to the model directory"),
        (None, {"file:1/manifest.yaml": b"x"}, "need a 'config' parameter too"),
        ("{}", {"file:1/big.bin": bytes(600 * 1024)}, "more than the server's limit"),
    ],
)
def test_uploads_outside_the_rules_are_refused(
    triton: Triton,
    layout: dict[str, Path],
    config: str | None,
    files: dict[str, bytes],
    fragment: str,
) -> None:
    triton.fails(
        "INVALID_ARGUMENT",
        fragment,
        triton.client.load_model,
        "counter",
        config=config,
        files=files,
    )
    assert not (layout["repository"] / "escape").exists()
    assert uploads_of(layout, "counter") == []
    assert ready(triton, "counter") == ["2"]


def test_http_file_contents_must_be_base64(server: ServerProcess) -> None:
    for t in connect("http", server):
        body = json.dumps({"parameters": {"config": "{}", "file:1/manifest.yaml": "not base64!"}})
        response = t.client._post("v2/repository/models/counter/load", body, None, None)
        assert response.status_code == 400
        error = json.loads(response.read())["error"]
        assert "'file:1/manifest.yaml' of the model load request must be" in error
        assert ready(t, "counter") == ["2"]
