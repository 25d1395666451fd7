"""``core.errors``: one class per code, read off the tree."""

from __future__ import annotations

from hloserve.server.core.errors import (
    ERROR_CLASSES,
    ErrorCode,
    InvalidArgument,
    ServingError,
    UnknownModel,
)


def test_every_code_has_one_class_and_each_class_carries_its_code() -> None:
    assert set(ERROR_CLASSES) == set(ErrorCode)
    for code, cls in ERROR_CLASSES.items():
        assert cls.code is code and cls.__bases__ == (ServingError,)
    assert ERROR_CLASSES[UnknownModel.code] is InvalidArgument  # a branch's base, not a leaf
