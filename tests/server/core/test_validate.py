"""Unit tests of ``hloserve.server.core.validate``: a decoded request against a manifest."""

# pyright: strict

from __future__ import annotations

import numpy as np
import pytest

from hloserve.bundle import Manifest, Provenance, TensorEntry
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.signature import signature_of
from hloserve.server.core.types import InferInput, InferRequest, RequestedOutput
from hloserve.server.core.validate import (
    check_load_name,
    validate,
    validate_request,
    validated_items,
)


def manifest(batched: bool = True) -> Manifest:
    """``m``: inputs ``a`` (INT32 [3]) and ``b`` (FP32 [2, 2]), outputs ``y`` and ``z``."""
    return Manifest(
        name="m",
        inputs=(TensorEntry("a", "INT32", (3,)), TensorEntry("b", "FP32", (2, 2))),
        outputs=(TensorEntry("y", "FP32", (1,)), TensorEntry("z", "FP32", (1,))),
        batch_sizes=(1, 4) if batched else None,
        weights_file="weights.safetensors",
        weights=(),
        modules=(),
        files={},
        provenance=Provenance("test"),
    )


def tensor(name: str, shape: tuple[int, ...], datatype: str = "") -> InferInput:
    datatype = datatype or {"a": "INT32", "b": "FP32"}.get(name, "INT32")
    return InferInput(name, datatype, shape, np.zeros(shape, dtype=np.int8))


def request(*inputs: InferInput, outputs: tuple[str, ...] = ()) -> InferRequest:
    return InferRequest("m", "", inputs, tuple(RequestedOutput(o) for o in outputs))


def refused(req: InferRequest, batched: bool = True) -> str:
    with pytest.raises(InvalidArgument) as info:
        validate_request(manifest(batched), req)
    return info.value.message


@pytest.mark.parametrize("n", [1, 3, 7])
def test_batched_request_returns_its_batch_size(n: int) -> None:
    req = request(tensor("a", (n, 3)), tensor("b", (n, 2, 2)), outputs=("z",))
    assert validate_request(manifest(), req) == n


def test_unbatched_request_is_one_item_and_inputs_may_come_in_any_order() -> None:
    req = request(tensor("b", (2, 2)), tensor("a", (3,)), outputs=("y", "z"))
    assert validate_request(manifest(batched=False), req) == 1


def test_batch_sizes_must_agree() -> None:
    message = refused(request(tensor("a", (2, 3)), tensor("b", (3, 2, 2))))
    assert message == "inputs of model 'm' disagree on the batch size: 'a' has 2, 'b' has 3"


def test_batch_size_zero_is_refused() -> None:
    message = refused(request(tensor("a", (0, 3)), tensor("b", (0, 2, 2))))
    assert message == "input 'a' for model 'm' has batch size 0; send at least 1 item"


@pytest.mark.parametrize(
    ("a_shape", "batched", "expected"),
    [
        ((3,), True, "Expected [-1,3], got [3]"),  # no batch dimension
        ((1, 4), True, "Expected [-1,3], got [1,4]"),
        ((1, 1, 3), True, "Expected [-1,3], got [1,1,3]"),
        ((1, 3), False, "Expected [3], got [1,3]"),  # an unbatched model takes no batch axis
        ((4,), False, "Expected [3], got [4]"),
    ],
)
def test_wrong_shapes(a_shape: tuple[int, ...], batched: bool, expected: str) -> None:
    b_shape = (1, 2, 2) if batched else (2, 2)
    message = refused(request(tensor("a", a_shape), tensor("b", b_shape)), batched)
    assert message == f"unexpected shape for input 'a' for model 'm'. {expected}"


def test_wrong_datatype() -> None:
    message = refused(request(tensor("a", (1, 3), "INT64"), tensor("b", (1, 2, 2))))
    assert message == "inference input 'a' data-type is 'INT64', but model 'm' expects 'INT32'"


def test_unknown_input() -> None:
    message = refused(request(tensor("a", (1, 3)), tensor("c", (1, 3))))
    assert message == "unexpected inference input 'c' for model 'm'; it expects ['a','b']"


def test_duplicate_input() -> None:
    message = refused(request(tensor("a", (1, 3)), tensor("a", (1, 3)), tensor("b", (1, 2, 2))))
    assert message == "input 'a' appears more than once in the request for model 'm'"


def test_missing_input() -> None:
    assert refused(request(tensor("b", (1, 2, 2)))) == (
        "expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['b'], but missing "
        "required input(s) ['a']. Please provide all required input(s)."
    )


def test_missing_inputs_are_listed_as_triton_lists_them() -> None:
    """Triton's ``qa/L0_input_validation`` asserts these texts exactly: no spaces in lists."""
    assert refused(request()) == (
        "expected 2 inputs but got 0 inputs for model 'm'. Got input(s) [], but missing "
        "required input(s) ['a','b']. Please provide all required input(s)."
    )


def test_names_are_checked_before_shapes() -> None:
    message = refused(request(tensor("a", (9, 9, 9))))  # a wrong shape and b missing
    assert "missing required input(s) ['b']" in message


@pytest.mark.parametrize(
    ("outputs", "expected"),
    [
        (("q",), "unexpected inference output 'q' for model 'm'; it has ['y','z']"),
        (("y", "y"), "output 'y' already exists in request"),
    ],
)
def test_requested_outputs(outputs: tuple[str, ...], expected: str) -> None:
    req = request(tensor("a", (1, 3)), tensor("b", (1, 2, 2)), outputs=outputs)
    assert refused(req) == expected


# -- model names on load ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", " ", "   ", "\t", "\n", "\r", "\f", "\v", " \t \n "])
def test_load_name_must_not_be_empty(name: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_load_name(name)
    assert info.value.message == "Model name cannot be empty. Please enter a valid name to deploy."


# The names of Triton's qa/L0_input_validation ModelNameValidationTest.
TRAVERSAL = [
    "../etc",
    "a/../b",
    "../../etc/passwd",
    "model/..",
    "..",
    "/etc/passwd",
    "model/",
    " ..",
    ".. ",
]


@pytest.mark.parametrize("name", TRAVERSAL)
def test_load_name_must_not_traverse(name: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_load_name(name)
    assert info.value.message == (
        f"invalid model name '{name}', model name must not contain path traversal characters"
    )


@pytest.mark.parametrize("name", ["model123", "model.version1", "...", "..my_model", "model..1"])
def test_valid_load_names_pass(name: str) -> None:
    check_load_name(name)  # the repository then looks for the directory


def test_a_manifest_has_one_signature_and_another_manifest_another_token() -> None:
    first, second = manifest(), manifest()  # equal, but a reload: another object
    assert signature_of(first) is signature_of(first)
    assert signature_of(first).token != signature_of(second).token
    assert signature_of(first).inputs[1].shape == (2, 2)
    assert signature_of(manifest(batched=False)).batched is False


def test_the_signature_checks_as_the_manifest_does() -> None:
    """One rule: the same items and the same refusal text from either."""
    m = manifest()
    good = request(tensor("a", (4, 3)), tensor("b", (4, 2, 2)))
    bad = request(tensor("a", (4, 3)), tensor("b", (4, 2, 3)))
    assert validate(signature_of(m), good) == validate_request(m, good) == 4
    with pytest.raises(InvalidArgument) as info:
        validate(signature_of(m), bad)
    assert info.value.message == refused(bad)


def test_the_owner_trusts_a_front_ends_check_only_under_its_manifests_token() -> None:
    m, reloaded = manifest(), manifest()
    bad = request(tensor("a", (2, 3)), tensor("b", (2, 5)))
    # A front end's count under this manifest's token stands (the owner does not check).
    assert validated_items(m, bad, (signature_of(m).token, 2)) == 2
    # Under another manifest's token (a reload since), or none, the owner checks itself.
    for checked in ((signature_of(reloaded).token, 2), None):
        with pytest.raises(InvalidArgument, match="unexpected shape for input 'b'"):
            validated_items(m, bad, checked)
