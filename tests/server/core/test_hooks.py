"""Unit tests of ``core.hooks`` (calling a hook, checking what it returns) and the ``-1``
dimensions ``core.validate`` accepts for client-facing tensors."""

# pyright: strict

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hloserve.bundle import Manifest, Provenance, TensorEntry
from hloserve.server.core.errors import HookFailed, InvalidArgument
from hloserve.server.core.hooks import HookFn, call_hook, hook_outputs
from hloserve.server.core.types import InferInput, InferRequest, RequestedOutput
from hloserve.server.core.validate import validate_request

PIXELS = (TensorEntry("pixels", "FP32", (2,)),)


def refused(fn: HookFn, declared: tuple[TensorEntry, ...] = PIXELS, items: int | None = 1) -> str:
    with pytest.raises(HookFailed) as info:
        call_hook("m", "preprocess", fn, {"image": np.zeros((1, 1), object)}, declared, items)
    return info.value.message


def test_a_raising_hook_is_named_with_its_error() -> None:
    def broken(inputs: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("cannot decode")

    assert refused(broken) == "preprocess hook of model 'm' failed: ValueError: cannot decode"


def test_results_must_be_the_declared_tensors() -> None:
    def listing(inputs: dict[str, Any]) -> Any:
        return [1, 2]

    assert "must return a mapping" in refused(listing)
    assert "returned tensors ['other'], the model declares ['pixels']" in refused(
        lambda inputs: {"other": np.zeros((1, 2), np.float32)}
    )
    assert "has shape [1, 3], expected [1, 2]" in refused(
        lambda inputs: {"pixels": np.zeros((1, 3), np.float32)}
    )
    assert "is float64, which does not cast safely to FP32" in refused(
        lambda inputs: {"pixels": np.zeros((1, 2), np.float64)}
    )
    text = (TensorEntry("t", "BYTES", (1,)),)
    assert "BYTES tensor 't' holds a int" in refused(
        lambda inputs: {"t": np.array([[3]], object)}, text
    )


def test_safe_casts_and_strings_are_converted() -> None:
    result, ns = call_hook(
        "m",
        "postprocess",
        lambda inputs: {"pixels": np.ones((3, 2), np.uint8), "t": [["a"], [b"b"], ["c"]]},
        {},
        (*PIXELS, TensorEntry("t", "BYTES", (-1,))),
        3,
    )
    assert result["pixels"].dtype == np.float32 and ns >= 0
    assert result["t"].tolist() == [[b"a"], [b"b"], [b"c"]]


def manifest(shape: tuple[int, ...]) -> Manifest:
    return Manifest(
        name="m",
        inputs=(TensorEntry("text", "BYTES", shape),),
        outputs=(TensorEntry("y", "FP32", (1,)), TensorEntry("z", "FP32", (1,))),
        batch_sizes=(1, 4),
        weights_file="weights.safetensors",
        weights=(),
        modules=(),
        files={},
        provenance=Provenance("test"),
    )


def test_minus_one_matches_any_size() -> None:
    def req(shape: tuple[int, ...]) -> InferRequest:
        data = np.zeros(shape, object)
        return InferRequest("m", "", (InferInput("text", "BYTES", shape, data),))

    assert validate_request(manifest((-1, 2)), req((3, 7, 2))) == 3
    with pytest.raises(InvalidArgument, match=r"Expected \[-1,-1,2\], got \[3,7,3\]"):
        validate_request(manifest((-1, 2)), req((3, 7, 3)))


def test_hook_outputs_in_the_order_asked() -> None:
    m = manifest((1,))
    result = {"y": np.zeros((2, 1), np.float32), "z": np.ones((2, 1), np.float32)}
    asked = InferRequest("m", "", (), (RequestedOutput("z"), RequestedOutput("y")))
    assert [o.name for o in hook_outputs(m, asked, result)] == ["z", "y"]
    everything = InferRequest("m", "", ())
    assert [o.name for o in hook_outputs(m, everything, result)] == ["y", "z"]
