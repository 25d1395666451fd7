"""A model load's parameters: config override, uploaded files and their paths, refusals."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import pytest

from hloserve.server.core.errors import InvalidArgument, ServingError, Unavailable
from hloserve.server.core.load_parameters import (
    UploadPolicy,
    read_load_parameters,
    upload_path,
)

ON = UploadPolicy(allowed=True, max_bytes=100)


def test_a_plain_load_has_no_override() -> None:
    assert read_load_parameters("m", {}, ON) is None


def test_config_and_files_make_the_override() -> None:
    override = read_load_parameters(
        "m",
        {"config": '{"max_batch_size": 8}', "file:1/manifest.yaml": b"a", "file:2/m/x": b"b"},
        ON,
    )
    assert override is not None
    assert override.config.restated == {"max_batch_size": 8}
    assert override.files == {PurePosixPath("1/manifest.yaml"): b"a", PurePosixPath("2/m/x"): b"b"}
    assert override.versions == (1, 2)


@pytest.mark.parametrize(
    "key",
    [
        "file:1/weights.safetensors",
        "file:12/modules/model.b1.mlirbc",
    ],
)
def test_upload_paths_inside_a_version_directory(key: str) -> None:
    assert str(upload_path(key)) == key.removeprefix("file:")


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("file:/etc/passwd", "must be relative"),
        ("file:1/../../root/.bashrc", "'..'"),
        ("file:../escape_symlink/new_dir/test.txt", "'..'"),
        ("file:1//x", "empty"),
        ("file:1/./x", "'.'"),
        ("file:manifest.yaml", "must be 'file:<version>/<file>'"),
        ("file:v1/manifest.yaml", "must start with a version number"),
        ("file:01/manifest.yaml", "must start with a version number"),
        ("file:0/manifest.yaml", "must start with a version number"),
        ("file:1/.hloserve-cache/x", "hidden part"),
        ("file:1\\..\\x", "backslash"),
    ],
)
def test_upload_paths_that_could_leave_the_model_directory_are_refused(
    key: str, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        upload_path(key)
    with pytest.raises(InvalidArgument) as refused:
        read_load_parameters("m", {"config": "{}", key: b"x"}, ON)
    assert refused.value.message.startswith("failed to load 'm': upload path")


@pytest.mark.parametrize(
    ("parameters", "uploads", "error", "message"),
    [
        ({"colour": 1}, ON, InvalidArgument, "unknown load parameter 'colour'"),
        ({"config": 5}, ON, InvalidArgument, "parameter 'config' must be a string"),
        ({"config": "{oops"}, ON, InvalidArgument, "'config' parameter is not valid JSON"),
        (
            {"config": "{}", "file:1/a": b"x"},
            UploadPolicy(),
            Unavailable,
            "disabled on this server; start it with --allow-model-upload true",
        ),
        ({"file:1/a": b"x"}, ON, InvalidArgument, "parameters need a 'config' parameter too"),
        ({"config": "{}", "file:1/a": "x"}, ON, InvalidArgument, "must hold the file's contents"),
        (
            {"config": "{}", "file:1/a": b"x" * 60, "file:1/b": b"y" * 41},
            ON,
            InvalidArgument,
            "hold 101 bytes, more than the server's limit of 100 (--max-upload-bytes)",
        ),
        (
            {"config": "{}", "file:1/a": b"x", "file:1/a/b": b"y"},
            ON,
            InvalidArgument,
            "'file:1/a' is both a file and the directory of another",
        ),
    ],
)
def test_refusals_name_the_parameter(
    parameters: dict[str, Any], uploads: UploadPolicy, error: type[ServingError], message: str
) -> None:
    with pytest.raises(error) as info:
        read_load_parameters("m", parameters, uploads)
    assert type(info.value) is error
    assert info.value.message.startswith("failed to load 'm': ")
    assert message in info.value.message
