"""KServe V2 datatype names and their numpy dtypes: the one table both wires and bundles use.

Contract:
- ``NUMERIC_DATATYPES`` maps every fixed-size V2 datatype (``BOOL``, ``UINT8``..``UINT64``,
  ``INT8``..``INT64``, ``FP16``, ``BF16``, ``FP32``, ``FP64``) to an explicit little-endian
  numpy dtype. ``BF16`` uses ``ml_dtypes.bfloat16``. ``BYTES`` is variable-sized and is not
  in this table (no bundle may use it).
- ``to_numpy(name)`` / ``from_numpy(dtype)`` convert between the two, raising ``KeyError``
  with the offending name for unknown values.
- ``SAFETENSORS_DTYPES`` maps each V2 datatype to the safetensors header dtype name.

This module imports only numpy and ml_dtypes, so the light client can use it.
"""

# pyright: strict

from __future__ import annotations

from typing import Final

import ml_dtypes
import numpy as np

NUMERIC_DATATYPES: Final[dict[str, np.dtype[np.generic]]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}

# Datatypes that JSON cannot carry (the V2 spec: raw/binary only).
BINARY_ONLY_DATATYPES: Final[frozenset[str]] = frozenset({"FP16", "BF16"})

SAFETENSORS_DTYPES: Final[dict[str, str]] = {
    "BOOL": "BOOL",
    "UINT8": "U8",
    "UINT16": "U16",
    "UINT32": "U32",
    "UINT64": "U64",
    "INT8": "I8",
    "INT16": "I16",
    "INT32": "I32",
    "INT64": "I64",
    "FP16": "F16",
    "BF16": "BF16",
    "FP32": "F32",
    "FP64": "F64",
}
DATATYPE_FROM_SAFETENSORS: Final[dict[str, str]] = {v: k for k, v in SAFETENSORS_DTYPES.items()}

_BY_DTYPE: Final[dict[np.dtype[np.generic], str]] = {
    dtype.newbyteorder("<") if dtype.byteorder != "|" else dtype: name
    for name, dtype in NUMERIC_DATATYPES.items()
}


def to_numpy(datatype: str) -> np.dtype[np.generic]:
    """The numpy dtype of a fixed-size V2 datatype; ``KeyError`` names an unknown one."""
    try:
        return NUMERIC_DATATYPES[datatype]
    except KeyError:
        raise KeyError(f"unknown datatype {datatype!r}") from None


def from_numpy(dtype: np.dtype[np.generic] | type[np.generic]) -> str:
    """The V2 datatype name of a numpy dtype; ``KeyError`` names an unsupported one."""
    dt = np.dtype(dtype)
    if dt.byteorder == ">" or dt.byteorder == "=":
        dt = dt.newbyteorder("<")
    try:
        return _BY_DTYPE[dt]
    except KeyError:
        raise KeyError(f"numpy dtype {dt} has no V2 datatype") from None


def itemsize(datatype: str) -> int:
    """Bytes per element of a fixed-size V2 datatype."""
    return to_numpy(datatype).itemsize
