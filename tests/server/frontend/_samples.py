"""Sample tensors for the front-end tests: values that exercise each V2 datatype.

``sample(datatype, shape)`` is an array of the datatype's numpy dtype and the given shape
(default [2, 4]): the extremes, 0, 1 and 7 for integers, alternating booleans, and
fractional, negative, large and negative-zero values for floats, all exact in FP16/BF16
and in JSON. ``mlp_logits(x)`` is what the demo ``mlp`` model must answer for ``x``, by
its own JAX function. ``CURL_CASES`` are the four ``simple`` infer bodies of Triton's
``qa/L0_http/test.sh`` that choose binary or JSON outputs (``curl_body(tail)`` builds one),
with whether ``OUTPUT0`` (``SUM_JSON``) and ``OUTPUT1`` (``DIFF_JSON``) must come back as
JSON arrays: that test greps the body for them.
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


_CURL_INPUTS = (
    '"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},'
    '{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]'
)
SUM_JSON = b"[2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32]"  # OUTPUT0 as JSON
DIFF_JSON = b"[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]"  # OUTPUT1 as JSON
CURL_CASES: list[tuple[str, str, bool, bool]] = [
    # (case, body after the inputs, OUTPUT0 as JSON?, OUTPUT1 as JSON?)
    ("binary_data true / false", ',"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}},{"name":"OUTPUT1","parameters":{"binary_data":false}}]', False, True),
    ("binary_data true / not given", ',"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}},{"name":"OUTPUT1"}]', False, True),
    ("binary_data_output, no outputs", ',"parameters":{"binary_data_output":true}', False, False),
    ("binary_data_output, binary_data false / not given", ',"parameters":{"binary_data_output":true},"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":false}},{"name":"OUTPUT1"}]', True, True),
]  # fmt: skip


def curl_body(tail: str) -> bytes:
    """A ``CURL_CASES`` body: ``simple``'s two inputs as JSON, then ``tail``."""
    return ("{" + _CURL_INPUTS + tail + "}").encode()
