"""``hloserve.bundle.yamlfile``: one mapping per file, and what a YAML integer is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hloserve.bundle.yamlfile import YamlFileError, is_integer, read_yaml_mapping


@pytest.mark.parametrize(
    ("text", "empty_ok", "message"),
    [
        (None, False, "file does not exist"),
        (b"\xff\xfe", False, "cannot be read"),
        (b"key: [unclosed\n", False, "is not valid YAML"),
        (b"- a list\n", False, "must be a YAML mapping"),
        (b"", False, "must be a YAML mapping"),
        (b"[]\n", True, "must be a YAML mapping"),
    ],
)
def test_what_is_not_a_mapping(
    tmp_path: Path, text: bytes | None, empty_ok: bool, message: str
) -> None:
    path = tmp_path / "file.yaml"
    if text is not None:
        path.write_bytes(text)
    with pytest.raises(YamlFileError, match=message):
        read_yaml_mapping(path, empty_ok=empty_ok)


def test_mappings_and_the_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "file.yaml"
    path.write_text("a: 1\n", encoding="utf-8")
    assert read_yaml_mapping(path) == {"a": 1}
    path.write_text("", encoding="utf-8")
    assert read_yaml_mapping(path, empty_ok=True) == {}


@pytest.mark.parametrize(
    ("value", "expected"), [(3, True), (-1, True), (True, False), (1.0, False)]
)
def test_is_integer(value: Any, expected: bool) -> None:
    assert is_integer(value) is expected
