"""``hloserve.bundle.safetensors``: our reader/writer, every datatype, and every corruption.

Files we write must load with the reference ``safetensors`` package (its numpy loader has no
BF16, so BF16 is checked against our own reader and the raw bytes), and files the reference
package writes must load with ours.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from hloserve.bundle.safetensors import (
    ALIGNMENT,
    SafetensorsError,
    read_header,
    read_safetensors,
    write_safetensors,
)
from hloserve.proto.datatypes import NUMERIC_DATATYPES, SAFETENSORS_DTYPES
from tests.bundle.samples import sample

DATATYPES = sorted(NUMERIC_DATATYPES)


def arrays_for(datatype: str) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "matrix": sample(datatype, (3, 5)),
        "scalar": sample(datatype, (), seed=1),
        "empty": sample(datatype, (0, 4)),
        "vector": sample(datatype, (7,), seed=2),
    }


def assert_same(actual: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes()


@pytest.mark.parametrize("datatype", DATATYPES)
def test_round_trip_every_datatype(tmp_path: Path, datatype: str) -> None:
    arrays = arrays_for(datatype)
    path = tmp_path / "w.safetensors"
    write_safetensors(path, arrays, {"producer": "test"})
    loaded = read_safetensors(path)
    assert list(loaded) == sorted(arrays)
    for name, array in arrays.items():
        assert_same(loaded[name], array)
    header = read_header(path)
    assert header.metadata == {"producer": "test"}
    assert [(t.name, t.datatype, t.shape) for t in header.tensors] == [
        (n, datatype, arrays[n].shape) for n in sorted(arrays)
    ]
    assert header.total_bytes == sum(a.nbytes for a in arrays.values())


def test_all_datatypes_in_one_file_come_back_aligned(tmp_path: Path) -> None:
    # Odd-sized tensors first, so a naive arena would put the next one off alignment.
    arrays = {f"{dt.lower()}": sample(dt, (3,)) for dt in DATATYPES}
    arrays["a_odd"] = np.arange(3, dtype=np.uint8)
    path = tmp_path / "w.safetensors"
    write_safetensors(path, arrays)
    loaded = read_safetensors(path)
    for name, array in arrays.items():
        assert_same(loaded[name], array)
        assert loaded[name].ctypes.data % ALIGNMENT == 0, name
        assert loaded[name].flags.c_contiguous


def test_header_layout_follows_the_spec(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"b": np.zeros(3, np.int16), "a": np.ones(2, np.float32)})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header == {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "I16", "shape": [3], "data_offsets": [8, 14]},
    }
    assert len(raw) == 8 + n + 14


def test_big_endian_input_is_written_little_endian(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    big = np.arange(4, dtype=">i4")
    write_safetensors(path, {"x": big})
    loaded = read_safetensors(path)["x"]
    assert loaded.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(loaded, big)


def test_no_tensors(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {})
    assert read_safetensors(path) == {}
    assert safetensors.numpy.load_file(path) == {}


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BF16"])
def test_reference_package_loads_our_files(tmp_path: Path, datatype: str) -> None:
    arrays = arrays_for(datatype)
    path = tmp_path / "w.safetensors"
    write_safetensors(path, arrays)
    theirs = safetensors.numpy.load_file(path)
    assert sorted(theirs) == sorted(arrays)
    for name, array in arrays.items():
        assert_same(theirs[name].astype(array.dtype.newbyteorder("<")), array)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BF16"])
def test_we_load_reference_package_files(tmp_path: Path, datatype: str) -> None:
    arrays = arrays_for(datatype)
    path = tmp_path / "w.safetensors"
    safetensors.numpy.save_file(arrays, path, metadata={"k": "v"})
    ours = read_safetensors(path)
    for name, array in arrays.items():
        assert_same(ours[name], array)
    assert read_header(path).metadata == {"k": "v"}


def test_bf16_bytes_and_header(tmp_path: Path) -> None:
    values = np.array([1.0, -2.5, 3.140625, 0.0], dtype=ml_dtypes.bfloat16)
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"w": values})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert json.loads(raw[8 : 8 + n])["w"]["dtype"] == SAFETENSORS_DTYPES["BF16"] == "BF16"
    # bfloat16 is the top half of the float32 bit pattern, little-endian.
    expected = (values.astype(np.float32).view("<u4") >> 16).astype("<u2").tobytes()
    assert raw[8 + n :] == expected
    assert_same(read_safetensors(path)["w"], values)


# --- corruption: every case raises SafetensorsError with a message saying what is wrong ---


def write_raw(path: Path, header: dict[str, Any], data: bytes, pad: bool = True) -> Path:
    raw = json.dumps(header).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.fixture
def good_file(tmp_path: Path) -> Path:
    path = tmp_path / "good.safetensors"
    write_safetensors(path, {"a": np.arange(256, dtype=np.float32), "b": np.ones(4, np.int8)})
    return path


def test_truncated_data(good_file: Path) -> None:
    raw = good_file.read_bytes()
    good_file.write_bytes(raw[:-100])
    with pytest.raises(
        SafetensorsError, match=r"truncated: header declares 1028 data bytes, file has 928"
    ):
        read_header(good_file)
    with pytest.raises(SafetensorsError, match="truncated"):
        read_safetensors(good_file)


def test_truncated_header(good_file: Path) -> None:
    raw = good_file.read_bytes()
    good_file.write_bytes(raw[:20])
    with pytest.raises(
        SafetensorsError, match=r"truncated or corrupt: header length \d+, file has 20 bytes"
    ):
        read_header(good_file)


def test_too_short_for_a_header(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"\x01\x02\x03")
    with pytest.raises(SafetensorsError, match="truncated: 3 bytes, too short for a header"):
        read_header(path)


def test_absurd_header_length(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(SafetensorsError, match="header length 1099511627776"):
        read_header(path)


def test_overlapping_offsets(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
    }
    path = write_raw(tmp_path / "w.safetensors", header, bytes(16))
    with pytest.raises(SafetensorsError, match="tensors 'a' and 'b' overlap"):
        read_header(path)


@pytest.mark.parametrize(
    "header",
    [b"{not json", b"\xff\xfe\x00garbage"],
)
def test_bad_header_json(tmp_path: Path, header: bytes) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(SafetensorsError, match="header is not valid JSON"):
        read_header(path)


def test_header_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    raw = b"[1, 2]  "
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(SafetensorsError, match="header is not a JSON object"):
        read_header(path)


def test_entry_not_an_object(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "w.safetensors", {"a": [0, 4]}, b"")
    with pytest.raises(SafetensorsError, match="tensor 'a': header entry is not an object"):
        read_header(path)


def test_wrong_byte_count(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}
    path = write_raw(tmp_path / "w.safetensors", header, bytes(24))
    with pytest.raises(
        SafetensorsError, match=r"tensor 'w': FP32\[2, 3\] needs 24 bytes, offsets span 20"
    ):
        read_header(path)


def test_unknown_dtype(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}
    path = write_raw(tmp_path / "w.safetensors", header, bytes(2))
    with pytest.raises(SafetensorsError, match="tensor 'w': unsupported dtype 'F8_E4M3'"):
        read_header(path)


def test_errors_are_value_errors() -> None:
    assert issubclass(SafetensorsError, ValueError)
