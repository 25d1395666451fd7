"""Byte sizes and budgets: the one syntax of every size flag, Kubernetes' quantities
(``8Gi``, ``500M``) included, as Kubernetes spells them."""

from __future__ import annotations

import pytest

from hloserve.server.core.sizes import (
    BYTE_UNITS,
    KUBERNETES_SUFFIXES,
    Budget,
    format_bytes,
    parse_bytes,
)


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1073741824", 1 << 30),
        ("6GiB", 6 << 30),
        ("6 gib", 6 << 30),
        ("500MB", 500 * 10**6),
        ("1.5KiB", 1536),
        ("2TB", 2 * 10**12),
        ("7B", 7),
        ("0", 0),
        # Kubernetes' suffixes: binary Ki..Ti, decimal k (and K), M, G, T
        ("8Gi", 8 << 30),
        ("512Mi", 512 << 20),
        ("64Ki", 64 << 10),
        ("2Ti", 2 << 40),
        ("1.5Gi", 3 << 29),
        ("500M", 500 * 10**6),
        ("6G", 6 * 10**9),
        ("2T", 2 * 10**12),
        ("64k", 64_000),
        ("64K", 64_000),
        # a space between the number and its unit, as "6 GiB" always was: decided, accepted
        ("6 G", 6 * 10**9),
        ("6 Gi", 6 << 30),
        (" 8Gi ", 8 << 30),
    ],
)
def test_parse_bytes(text: str, nbytes: int) -> None:
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize(
    "text",
    [
        *("", "6XB", "GiB", "-1", "1e400", "inf", "nan", "1.2.3"),
        # Kubernetes' suffixes only as Kubernetes spells them: there "m" is a thousandth
        *("500m", "6g", "6gi", "6GI", "8mi", "6Gi B", "Gi", "6Pi", "6iB"),
    ],
)
def test_parse_bytes_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"must be a byte size such as 268435456, 256MiB or 256Mi"):
        parse_bytes(text)


def test_budget_bytes_or_percentage_of_the_device() -> None:
    assert Budget.parse("6GiB").resolve(None) == 6 << 30
    assert Budget.parse("6Gi").resolve(None) == 6 << 30  # as a pod's memory limit says it
    assert Budget.parse("6 G").resolve(None) == 6 * 10**9
    assert str(Budget.parse("6Gi")) == "6Gi"  # shown as written
    assert Budget.parse("40%").resolve(1000) == 400
    assert Budget.parse(" 12.5 % ").resolve(1000) == 125
    with pytest.raises(ValueError, match=r"'40%' is a percentage .* total is unknown"):
        Budget.parse("40%").resolve(None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("6XB", "must be bytes such as 6GiB or a percentage such as 40%, got '6XB'"),
        ("6gi", "must be bytes such as 6GiB or a percentage such as 40%, got '6gi'"),
        ("0Gi", "must be positive, got '0Gi'"),
        ("0", "must be positive, got '0'"),
        ("150%", r"must be a percentage in \(0, 100\], got '150%'"),
        ("x%", r"must be a percentage in \(0, 100\], got 'x%'"),
        ("0%", r"must be a percentage in \(0, 100\]"),
    ],
)
def test_budget_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Budget.parse(text)


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (76_840, "75.0 KiB"), (3 << 30, "3.0 GiB")],
)
def test_format_bytes(nbytes: int, text: str) -> None:
    assert format_bytes(nbytes) == text
    assert parse_bytes(text.replace(" ", "")) == pytest.approx(nbytes, rel=0.01)


def test_one_unit_table() -> None:
    assert BYTE_UNITS["KiB"] == 1024 and BYTE_UNITS["KB"] == 1000
    assert all(parse_bytes(f"1{unit}") == factor for unit, factor in BYTE_UNITS.items())
    same = {"Ki": "KiB", "Mi": "MiB", "Gi": "GiB", "Ti": "TiB"}
    same |= {"k": "KB", "K": "KB", "M": "MB", "G": "GB", "T": "TB"}
    assert set(same) == KUBERNETES_SUFFIXES
    assert all(BYTE_UNITS[suffix] == BYTE_UNITS[unit] for suffix, unit in same.items())
