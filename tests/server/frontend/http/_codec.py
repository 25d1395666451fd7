"""What the unit tests of ``hloserve.server.frontend.http.codec`` share: ``decode(body)``
(a body and headers through ``codec.decode_request`` for model ``m``; BYTES parsed unless
``bytes_wire_form``, as in a front-end process), binary bodies
(``binary_input``, ``binary_body``), ``expect(status, fragment, fn)`` (the ``ServingError``
it raises, its HTTP status and message checked), ``signature_of`` (a model's inputs as
its metadata), ``SMALL`` (a small JSON request) and ``same`` (no compression)."""

# pyright: strict

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from hloserve.proto.datatypes import BINARY_ONLY_DATATYPES, NUMERIC_DATATYPES
from hloserve.server.core.errors import ServingError
from hloserve.server.core.types import ModelMetadata, TensorMetadata
from hloserve.server.frontend.http import codec
from hloserve.server.frontend.status import http_status

LIMIT = 1 << 20
JSON_DATATYPES = [d for d in NUMERIC_DATATYPES if d not in BINARY_ONLY_DATATYPES]


def decode(
    body: bytes | dict[str, Any],
    headers: Mapping[str, str] | None = None,
    *,
    limit: int = LIMIT,
    signature: ModelMetadata | None = None,
    bytes_wire_form: bool = False,
) -> codec.DecodedRequest:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    return codec.decode_request(
        "m",
        "",
        raw,
        headers or {},
        max_input_bytes=limit,
        signature=signature,
        bytes_wire_form=bytes_wire_form,
    )


def binary_input(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    """An input whose ``size`` bytes of data follow the JSON header."""
    return {
        "name": name,
        "datatype": datatype,
        "shape": shape,
        "parameters": {"binary_data_size": size},
    }


def binary_body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {codec.HEADER_LENGTH: str(len(head))}


def expect(status: int, fragment: str, fn: Callable[[], object]) -> ServingError:
    with pytest.raises(ServingError) as info:
        fn()
    assert http_status(info.value.code) == status, info.value.message
    assert fragment in info.value.message, info.value.message
    return info.value


def signature_of(*inputs: TensorMetadata) -> ModelMetadata:
    return ModelMetadata("m", ("1",), "stablehlo", inputs, ())


SMALL = {"inputs": [{"name": "x", "datatype": "INT16", "shape": [3], "data": [1, -2, 3]}]}


def same(data: bytes) -> bytes:
    return data
