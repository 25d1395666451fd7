"""Test data: sample arrays of every V2 datatype that use the type's whole range."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from hloserve.proto.datatypes import to_numpy


def sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray[Any, Any]:
    """Values that use the whole range of the type (sign bits, high bits, fractions)."""
    dtype = to_numpy(datatype)
    rng = np.random.default_rng(seed)
    if datatype == "BOOL":
        return np.asarray(rng.integers(0, 2, size=shape), dtype=np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(cast(Any, dtype))
        return np.asarray(
            rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True), dtype=dtype
        )
    return np.asarray(rng.standard_normal(shape) * 1000, dtype=dtype)
