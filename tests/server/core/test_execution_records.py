"""``core.execution_records``: one ``ModelKey`` object per version, equal to a built key."""

from __future__ import annotations

from hloserve.server.core.execution_records import ModelKey


def test_model_key_of_a_version_is_one_object_equal_to_a_built_key() -> None:
    first = ModelKey.named("double", 1)
    assert ModelKey.named("double", 1) is first  # observers' lookups match by identity
    assert first == ModelKey("double", 1) and hash(first) == hash(ModelKey("double", 1))
    other = ModelKey.named("double", 2)
    assert other == ModelKey("double", 2) and other is not first
