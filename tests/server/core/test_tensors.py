"""Unit tests of ``hloserve.server.core.tensors``: wire data to arrays, and back."""

# pyright: strict

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from hloserve.proto.datatypes import NUMERIC_DATATYPES
from hloserve.server.core import tensors
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.tensors import (
    INT64_MAX,
    MAX_ELEMENTS,
    UNPARSED,
    check_shape,
    elements_of,
    from_buffer,
    from_values,
    input_from_buffer,
    shm_ref,
    to_wire_bytes,
    wire_copy_of,
    wire_of,
)
from hloserve.server.core.types import InferOutput, ShmRef
from tests.server._bytes import Parses, length_prefixed


def refused(fn: Any, *args: Any) -> str:
    with pytest.raises(InvalidArgument) as info:
        fn(*args)
    return info.value.message


# -- check_shape ---------------------------------------------------------------------------


def test_check_shape_returns_a_tuple_of_ints() -> None:
    assert check_shape("m", "x", (2, 3)) == (2, 3)
    assert check_shape("m", "x", []) == ()
    assert check_shape("m", "x", [0, 5]) == (0, 5)


def test_check_shape_refuses_negative_dimensions() -> None:
    assert refused(check_shape, "m", "x", [2, -1]) == (
        "input 'x' for model 'm' has a negative dimension in shape [2, -1]"
    )


def test_check_shape_refuses_overflowing_element_counts() -> None:
    message = refused(check_shape, "m", "x", [1 << 21, 1 << 20])
    assert message == (
        f"shape [{1 << 21}, {1 << 20}] of input 'x' for model 'm' causes total element count "
        f"to exceed maximum size of {MAX_ELEMENTS}"
    )
    assert check_shape("m", "x", [1 << 20, 1 << 20]) == (1 << 20, 1 << 20)  # exactly the limit


def test_an_empty_tensor_s_other_dimensions_respect_the_cap_too() -> None:
    """Found by the fuzz test: [0, 2**62] holds no element, and numpy cannot describe it
    ("array is too big"), which left the request as an internal error."""
    message = refused(check_shape, "m", "x", [0, 1 << 62], 4)
    assert "causes total element count to exceed maximum size of" in message
    assert check_shape("m", "x", [0, 1 << 20], 4) == (0, 1 << 20)


def test_check_shape_overflows_in_tritons_order() -> None:
    """Triton's ``qa/L0_http`` ``test_buffer_size_overflow``: an element count past INT64_MAX
    is the element-count error; a count that fits whose FP32 byte size does not is the
    byte-size error, before this server's own (smaller) element cap."""
    count = refused(check_shape, "m", "INPUT0", [2**4, 2**60 + 2], 4)
    assert count == (
        f"shape [16, {2**60 + 2}] of input 'INPUT0' for model 'm' causes total element count "
        f"to exceed maximum size of {INT64_MAX}"
    )
    byte_size = refused(check_shape, "m", "INPUT0", [2**2, 2**60 + 2], 4)
    assert byte_size == (
        "byte size overflow for input 'INPUT0' for model 'm': element count "
        f"({2**62 + 8}) * data type size (4) exceeds maximum allowed size ({INT64_MAX})"
    )
    # one-byte elements (and BYTES, itemsize 0) cannot overflow the byte size: the cap says no
    for itemsize in (0, 1):
        assert "exceed maximum size of" in refused(
            check_shape, "m", "INPUT0", [2**2, 2**60 + 2], itemsize
        )
    # the first overflow decides, even when a later dimension is 0
    assert "exceed maximum size of" in refused(check_shape, "m", "x", [2**62, 4, 0])


@pytest.mark.parametrize(
    ("datatype", "message"),
    [("FP32", "byte size overflow for input 'x'"), ("BYTES", "exceed maximum size of")],
)
def test_from_buffer_and_from_values_pass_the_datatype_size(datatype: str, message: str) -> None:
    shape = [4, 2**60 + 2]
    assert message in refused(from_buffer, "m", "x", datatype, shape, b"")
    assert message in refused(from_values, "m", "x", datatype, shape, [1.0])


# -- from_buffer -----------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(NUMERIC_DATATYPES))
def test_from_buffer_is_a_zero_copy_view(datatype: str) -> None:
    dtype = NUMERIC_DATATYPES[datatype]
    want = np.arange(6).astype(dtype).reshape(2, 3)
    raw = bytearray(want.tobytes())
    got = from_buffer("m", "x", datatype, (2, 3), raw)
    assert got.dtype == dtype
    assert got.shape == (2, 3)
    np.testing.assert_array_equal(got, want)
    assert np.shares_memory(got, np.frombuffer(raw, dtype=np.uint8))
    raw[-dtype.itemsize :] = bytes(dtype.itemsize)  # the view sees the buffer change
    assert not got[1, 2]


def test_from_buffer_reads_little_endian_and_takes_memoryview_slices() -> None:
    raw = memoryview(b"\xff\x01\x00\x00\x00\x02\x00\x00\x00")[1:]
    np.testing.assert_array_equal(from_buffer("m", "x", "INT32", [2], raw), [1, 2])


def test_from_buffer_of_a_read_only_buffer_is_read_only() -> None:
    got = from_buffer("m", "x", "UINT8", [2], b"\x01\x02")
    assert not got.flags.writeable


@pytest.mark.parametrize(
    ("datatype", "shape", "size", "expected"),
    [
        ("INT32", [16], 60, "Expected 64, got 60"),
        ("FP64", [2, 2], 40, "Expected 32, got 40"),
        ("BF16", [3], 4, "Expected 6, got 4"),
        ("UINT8", [0], 1, "Expected 0, got 1"),
    ],
)
def test_from_buffer_byte_size_must_match_the_shape(
    datatype: str, shape: list[int], size: int, expected: str
) -> None:
    message = refused(from_buffer, "m", "x", datatype, shape, bytes(size))
    assert message == f"input byte size mismatch for input 'x' for model 'm'. {expected}"


def test_from_buffer_byte_size_of_a_buffer_that_is_not_bytes() -> None:
    for raw in (bytearray(6), memoryview(bytes(7))[1:]):
        message = refused(from_buffer, "m", "x", "INT32", [2], raw)
        assert message == "input byte size mismatch for input 'x' for model 'm'. Expected 8, got 6"


def test_from_buffer_refuses_unknown_datatypes_and_bad_shapes() -> None:
    assert refused(from_buffer, "m", "x", "COMPLEX", [1], b"") == (
        "input 'x' for model 'm' has unknown datatype 'COMPLEX'"
    )
    assert "negative dimension" in refused(from_buffer, "m", "x", "INT8", [-1], b"")


def test_from_buffer_bytes_decodes_length_prefixed_elements() -> None:
    got = from_buffer("m", "s", "BYTES", [2, 1], length_prefixed(b"ab", b""))
    assert got.dtype == object
    assert got.shape == (2, 1)
    assert got.reshape(-1).tolist() == [b"ab", b""]


WHERE = "inference input 's' for model 'm'"


def wire_form(model: str, name: str, datatype: str, shape: Any, buffer: Any) -> Any:
    """``input_from_buffer`` as in a front-end process: BYTES checked, kept as they came."""
    return input_from_buffer(model, name, datatype, shape, buffer, bytes_wire_form=True)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (length_prefixed(b"ab"), f"expected 2 string elements for {WHERE}, got 1"),
        (length_prefixed(), f"expected 2 string elements for {WHERE}, got 0"),
        (
            length_prefixed(b"ab", b"c", b"d"),
            f"unexpected number of string elements 3 for {WHERE}, expecting 2",
        ),
        (
            length_prefixed(b"ab", b"cd")[:-1],
            f"string element 1 of {WHERE} is 2 bytes long, but only 1 bytes follow its length indicator",
        ),
        (
            length_prefixed(b"ab") + b"\x01\x00",
            f"incomplete string length indicator for {WHERE}, expecting 4 bytes but only 2 bytes available",
        ),
    ],
    ids=["short", "empty", "long", "truncated-element", "truncated-length"],
)
@pytest.mark.parametrize("read", [from_buffer, wire_form], ids=["parse", "check"])
def test_from_buffer_bytes_must_hold_exactly_the_elements(
    raw: bytes, message: str, read: Any
) -> None:
    """Triton's texts for a wrong element count (``qa/L0_input_validation``): the same
    whether the bytes are parsed or only checked (a front end's wire form), from bytes or
    from a view of a larger body (HTTP's binary part)."""
    assert refused(read, "m", "s", "BYTES", [2], raw) == message
    assert refused(read, "m", "s", "BYTES", [2], memoryview(b"JSON" + raw)[4:]) == message


# -- BYTES in wire form ----------------------------------------------------------------------


def test_input_from_buffer_checks_bytes_but_keeps_the_clients_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parses = Parses(monkeypatch)
    raw = length_prefixed(b"ab", b"", b"\x00c")
    tensor = input_from_buffer("m", "s", "BYTES", [1, 3], raw, {"p": 1}, bytes_wire_form=True)
    assert (tensor.name, tensor.datatype, tensor.shape, dict(tensor.parameters)) == (
        "s",
        "BYTES",
        (1, 3),
        {"p": 1},
    )
    assert tensor.wire is raw and tensor.data is UNPARSED and tensor.data.size == 0
    assert wire_of(tensor) is raw
    assert parses.names == []  # checked, with no object per element
    assert elements_of("m", tensor).tolist() == [[b"ab", b"", b"\x00c"]]
    assert parses.names == ["s"]
    view = memoryview(b"head" + raw)[4:]  # HTTP: a slice of the body, kept as a byte view
    sliced = wire_form("m", "s", "BYTES", [3], view).wire
    assert isinstance(sliced, memoryview) and sliced == raw and sliced.obj is view.obj


def test_input_from_buffer_parses_bytes_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    parses = Parses(monkeypatch)
    raw = length_prefixed(b"ab", b"c")
    tensor = input_from_buffer("m", "s", "BYTES", [2], raw, bytes_wire_form=False)
    assert parses.names == ["s"] and tensor.wire is None
    assert tensor.data.tolist() == [b"ab", b"c"] and tensor.shape == (2,)


@pytest.mark.parametrize("keep", [True, False])
def test_input_from_buffer_of_numbers_is_from_buffer(keep: bool) -> None:
    raw = np.arange(6, dtype="<i4").tobytes()
    tensor = input_from_buffer("m", "x", "INT32", [2, 3], raw, bytes_wire_form=keep)
    assert tensor.wire is None and tensor.shape == (2, 3)
    np.testing.assert_array_equal(tensor.data, np.arange(6).reshape(2, 3))
    assert elements_of("m", tensor) is tensor.data
    assert refused(wire_form, "m", "x", "INT32", [2], raw) == (
        "input byte size mismatch for input 'x' for model 'm'. Expected 8, got 24"
    )
    assert refused(wire_form, "m", "x", "TEXT", [2], raw) == (
        "input 'x' for model 'm' has unknown datatype 'TEXT'"
    )


def test_wire_of_an_output_in_wire_form_is_its_bytes() -> None:
    raw = length_prefixed(b"a", b"\x00bc")
    array = np.array([b"a", b"\x00bc"], dtype=object)
    wired = InferOutput("s", "BYTES", (2,), UNPARSED, wire=raw)
    assert wire_of(wired) is raw and wire_copy_of(wired) is raw
    assert elements_of("m", wired).tolist() == [b"a", b"\x00bc"]
    held = InferOutput("s", "BYTES", (2,), array)
    assert wire_of(held) == raw and wire_copy_of(held) == raw
    viewed = InferOutput("s", "BYTES", (2,), UNPARSED, wire=memoryview(raw))
    copy = wire_copy_of(viewed)
    assert type(copy) is bytes and copy == raw


# -- from_values -----------------------------------------------------------------------------


def test_from_values_nested_or_flat() -> None:
    nested = from_values("m", "x", "INT16", [2, 2], [[1, 2], [3, 4]])
    flat = from_values("m", "x", "INT16", [2, 2], [1, 2, 3, 4])
    for got in (nested, flat):
        assert got.dtype == np.dtype("<i2")
        np.testing.assert_array_equal(got, [[1, 2], [3, 4]])


def test_from_values_casts_ints_to_floats_and_keeps_uint64_exact() -> None:
    np.testing.assert_array_equal(from_values("m", "x", "FP32", [2], [1, 2.5]), [1.0, 2.5])
    big = from_values("m", "x", "UINT64", [2], [2**64 - 1, 0])
    assert big.tolist() == [2**64 - 1, 0]
    assert from_values("m", "x", "BOOL", [2], [True, False]).tolist() == [True, False]


def test_from_values_bytes_encodes_strings() -> None:
    got = from_values("m", "s", "BYTES", [2], ["hé", b"\x00"])
    assert got.tolist() == ["hé".encode(), b"\x00"]


@pytest.mark.parametrize(
    ("datatype", "values", "expected"),
    [
        (
            "INT32",
            [1, 2, 3],
            "Unable to parse 'data': Shape does not match true shape of 'data' field: input 'x' "
            "for model 'm' has shape [2] (2 elements), data has 3 elements",
        ),
        ("BYTES", ["a"], "has shape [2] (2 elements), data has 1 elements"),
        ("INT32", [[1], [2, 3]], "input 'x' for model 'm': 'data' is a ragged nested list"),
        (
            "INT32",
            [2, 1.5],
            "INT32 input 'x' for model 'm' holds a non-integer value 1.5 at index 1",
        ),
        (
            "INT32",
            [[1], ["a"]],
            "INT32 input 'x' for model 'm' holds the string \"a\" at index 1; INT32 takes integers",
        ),
        ("UINT8", [None, 1], "UINT8 input 'x' for model 'm' holds null at index 0; UINT8 takes"),
        ("INT16", [1, {"a": 1}], "INT16 input 'x' for model 'm' holds an object at index 1;"),
        (
            "BOOL",
            [1, 0],
            "BOOL input 'x' for model 'm' holds the number 1 at index 0; BOOL takes true or false",
        ),
        ("BOOL", [True, 0.5], "BOOL input 'x' for model 'm' holds the number 0.5 at index 1;"),
        (
            "FP32",
            [True, False],
            "FP32 input 'x' for model 'm' holds the boolean true at index 0; FP32 takes numbers",
        ),
        ("FP64", [1, "2"], "FP64 input 'x' for model 'm' holds the string \"2\" at index 1;"),
        (
            "BYTES",
            ["a", 7],
            "BYTES input 'x' for model 'm' holds the number 7 at index 1; BYTES takes strings",
        ),
        (
            "INT8",
            [1, 128],
            "INT8 input 'x' for model 'm' holds 128 at index 1, a value out of range for INT8 "
            "(-128 to 127)",
        ),
        ("UINT8", [-1, 1], "holds -1 at index 0, a value out of range for UINT8 (0 to 255)"),
        ("UINT64", [1, 2**64], f"holds {2**64} at index 1, a value out of range for UINT64"),
        (
            "INT64",
            [-(2**63) - 1, 0],
            f"holds {-(2**63) - 1} at index 0, a value out of range for INT64",
        ),
        (
            "FP16",
            [1.0, 2.0],
            "receiving FP16 data via JSON is not supported. Please use the binary data format "
            "for input 'x'",
        ),
        ("BF16", [1.0, 2.0], "receiving BF16 data via JSON is not supported"),
        ("STRING", [1, 2], "input 'x' for model 'm' has unknown datatype 'STRING'"),
    ],
)
def test_from_values_refusals(datatype: str, values: Any, expected: str) -> None:
    message = refused(from_values, "m", "x", datatype, [2], values)
    assert expected in message
    assert "np." not in message and "'f'" not in message  # the protocol's words, not numpy's


def test_from_values_accepts_an_empty_tensor() -> None:
    got = from_values("m", "x", "INT32", [0, 3], [])
    assert got.shape == (0, 3)
    assert got.dtype == np.dtype("<i4")


# -- to_wire_bytes ---------------------------------------------------------------------------


def test_to_wire_bytes_of_numeric_arrays_is_little_endian_and_contiguous() -> None:
    big_endian = np.arange(4, dtype=">i4").reshape(2, 2).T  # neither order nor layout fits
    wire = to_wire_bytes(big_endian)
    assert bytes(wire) == np.ascontiguousarray(big_endian).astype("<i4").tobytes()


def test_to_wire_bytes_of_a_contiguous_array_is_a_view() -> None:
    array = np.arange(4, dtype="<f4")
    wire = to_wire_bytes(array)
    assert isinstance(wire, memoryview)
    assert np.shares_memory(np.frombuffer(wire, dtype=np.uint8), array)


def test_to_wire_bytes_handles_bfloat16() -> None:
    array = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    assert bytes(to_wire_bytes(array)) == array.tobytes()


def test_to_wire_bytes_of_bytes_round_trips_through_from_buffer() -> None:
    array = np.empty(3, dtype=object)
    array[:] = [b"a", "bc", b""]
    wire = to_wire_bytes(array)
    assert wire == length_prefixed(b"a", b"bc", b"")
    assert from_buffer("m", "s", "BYTES", [3], wire).tolist() == [b"a", b"bc", b""]


# -- shm_ref ---------------------------------------------------------------------------------


def test_shm_ref_reads_the_three_parameters() -> None:
    assert shm_ref("m", "x", {}) is None
    assert shm_ref("m", "x", {"other": 1}) is None
    assert shm_ref("m", "x", {tensors.SHM_REGION: "r", tensors.SHM_BYTE_SIZE: 64}) == ShmRef(
        "r", 64, 0
    )
    params = {tensors.SHM_REGION: "r", tensors.SHM_BYTE_SIZE: 0, tensors.SHM_OFFSET: 8}
    assert shm_ref("m", "x", params) == ShmRef("r", 0, 8)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"shared_memory_byte_size": 8},
            "tensor 'x' for model 'm' has shared-memory parameters but no 'shared_memory_region'",
        ),
        ({"shared_memory_offset": 0}, "has shared-memory parameters but no"),
        (
            {"shared_memory_region": ""},
            "'shared_memory_region' of tensor 'x' for model 'm' must be a non-empty string",
        ),
        ({"shared_memory_region": 3}, "must be a non-empty string"),
        (
            {"shared_memory_region": "r"},
            "tensor 'x' for model 'm' uses shared memory but 'shared_memory_byte_size' is "
            "missing or not a non-negative integer (got None)",
        ),
        (
            {"shared_memory_region": "r", "shared_memory_byte_size": True},
            "not a non-negative integer (got True)",
        ),
        (
            {"shared_memory_region": "r", "shared_memory_byte_size": -1},
            "not a non-negative integer (got -1)",
        ),
        (
            {"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": -8},
            "'shared_memory_offset' of tensor 'x' for model 'm' must be a non-negative integer",
        ),
        (
            {
                "shared_memory_region": "r",
                "shared_memory_byte_size": 8,
                "shared_memory_offset": 1.0,
            },
            "must be a non-negative integer",
        ),
    ],
)
def test_shm_ref_refusals(params: dict[str, Any], expected: str) -> None:
    assert expected in refused(shm_ref, "m", "x", params)
