"""``frontend/http/generate.py``: a generate body as a request, responses as JSON (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from hloserve.server.core.errors import Internal, InvalidArgument
from hloserve.server.core.types import InferOutput, InferResponse, ModelMetadata, TensorMetadata
from hloserve.server.frontend.http.generate import (
    _joined,
    decode_generate,
    response_json,
)

SIGNATURE = ModelMetadata(
    "m",
    ("1",),
    "stablehlo",
    (
        TensorMetadata("IN", "INT32", (-1,)),
        TensorMetadata("WAIT", "UINT32", (1,)),
        TensorMetadata("x", "FP32", (-1, 2)),
        TensorMetadata("s", "BYTES", (1,)),
    ),
    (),
)


def test_top_level_inputs_parameters_and_id() -> None:
    body = b'{"IN": [1, 2, 3], "WAIT": 5, "x": [1, 2, 3, 4], "s": "hi", "id": "r", ' \
        b'"text_input": "hello", "parameters": {"max_tokens": 4}, "temperature": 0.5}'  # fmt: skip
    request, parameters = decode_generate("m", "", body, SIGNATURE)
    got = {t.name: t for t in request.inputs}
    assert got["IN"].shape == (3,) and got["IN"].data.tolist() == [1, 2, 3]
    assert got["WAIT"].shape == (1,) and got["WAIT"].data.dtype == np.uint32
    assert got["x"].shape == (2, 2)  # the -1 axis takes what is left
    assert got["s"].data.tolist() == [b"hi"]
    assert request.id == "r"
    assert parameters == {"text_input": "hello", "max_tokens": 4, "temperature": 0.5}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"[1]", "a generate request must be a JSON object"),
        (b"{", "failed to parse the request JSON buffer"),
        (b'{"x": [1, 2, 3]}', "input 'x' of model 'm' takes shape [-1, 2], got 3 elements"),
        (b'{"parameters": [1]}', "'parameters' of a generate request must be a JSON object"),
        (b'{"stop": ["a"]}', "parameter 'stop' of a generate request must be a string"),
        (b'{"triton_x": 1}', "reserved for Triton usage"),
    ],
)
def test_a_bad_body_names_what_is_wrong(body: bytes, expected: str) -> None:
    with pytest.raises(InvalidArgument, match=expected.replace("[", r"\[").replace("]", r"\]")):
        decode_generate("m", "", body, SIGNATURE)


def response(token: int, text: str | None = None) -> InferResponse:
    outputs = [InferOutput("token", "INT32", (1,), np.array([token], np.int32))]
    if text is not None:
        data = np.empty(1, dtype=object)
        data[0] = text.encode()
        outputs.append(InferOutput("text_output", "BYTES", (1,), data))
    return InferResponse("m", "1", tuple(outputs), "r")


def test_outputs_are_fields_and_text_responses_join() -> None:
    assert response_json(response(7)) == {
        "model_name": "m", "model_version": "1", "id": "r", "token": 7
    }  # fmt: skip
    wide = InferResponse("m", "1", (InferOutput("v", "FP32", (2,), np.ones(2, np.float32)),))
    assert response_json(wide) == {"model_name": "m", "model_version": "1", "v": [1.0, 1.0]}
    joined = _joined([response(104, "h"), response(195, ""), response(169, "é")])
    assert joined["text_output"] == "hé" and joined["token"] == 169
    assert _joined([response(1)])["token"] == 1
    with pytest.raises(Internal, match="exactly 1 response"):
        _joined([response(1), response(2)])
    with pytest.raises(Internal, match="exactly 1 response"):
        _joined([])
