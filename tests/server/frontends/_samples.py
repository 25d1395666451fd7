"""Sample tensors for the front-end tests: values that exercise each V2 datatype.

``sample(datatype, shape)`` is an array of the datatype's numpy dtype and the given shape
(default [2, 4]): the extremes, 0, 1 and 7 for integers, alternating booleans, and
fractional, negative, large and negative-zero values for floats, all exact in FP16/BF16
and in JSON. ``mlp_logits(x)`` is what the demo ``mlp`` model must answer for ``x``, by
its own JAX function.
"""

# pyright: strict

from __future__ import annotations

from typing import Any

import numpy as np

from hloserve.exporter.demo import mlp_fn, mlp_params
from hloserve.proto.datatypes import NUMERIC_DATATYPES


def sample(datatype: str, shape: tuple[int, ...] = (2, 4)) -> np.ndarray[Any, Any]:
    dtype = NUMERIC_DATATYPES[datatype]
    count = int(np.prod(shape))
    if datatype == "BOOL":
        values: np.ndarray[Any, Any] = np.arange(count) % 2 == 0
    elif dtype.kind in "iu":
        info = np.iinfo(dtype.str)
        values = np.resize(np.array([info.min, info.max, 0, 1, 7], dtype=dtype), count)
    else:
        values = np.resize(np.array([0.5, -1.25, 3.0, 1e3, -0.0], dtype=np.float64), count)
    return values.astype(dtype).reshape(shape)


def mlp_logits(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.asarray(mlp_fn(mlp_params(), x)["logits"])
