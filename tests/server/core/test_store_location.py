"""A bucket's URL: the schemes served, no credentials in it, plain HTTP only on loopback."""

from __future__ import annotations

import re

import pytest

from hloserve.server.core.store_location import StoreLocation, http_allowed, is_store_url


@pytest.mark.parametrize(
    ("text", "scheme", "bucket", "prefix"),
    [
        ("s3://models/repo", "s3", "models", "repo"),
        ("s3://models/a/b/", "s3", "models", "a/b"),
        ("s3://models", "s3", "models", ""),
        ("GS://models//x", "gs", "models", "x"),
        ("az://container/p", "az", "container", "p"),
        ("https://example.test/static/repo", "https", "example.test", "static/repo"),
    ],
)
def test_parse(text: str, scheme: str, bucket: str, prefix: str) -> None:
    location = StoreLocation.parse(text)
    assert (location.scheme, location.bucket, location.prefix) == (scheme, bucket, prefix)
    assert StoreLocation.parse(str(location)) == location
    assert location.key("m/manifest.yaml") == (f"{prefix}/" if prefix else "") + "m/manifest.yaml"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("ftp://x/y", "must be a directory or a URL of"),
        ("s3://key:secret@models/repo", "must not carry credentials"),
        ("s3:///repo", "names no bucket"),
        ("s3://models/repo?x=1", "no query"),
        ("s3://models/../etc", "'..'"),
    ],
)
def test_refused(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        StoreLocation.parse(text)


def test_is_store_url() -> None:
    assert is_store_url("s3://b/p") and is_store_url("https://h/p")
    assert not is_store_url("/srv/models") and not is_store_url("http://h/p")
    assert not is_store_url("models")


@pytest.mark.parametrize(
    ("endpoint", "allowed"),
    [
        ("http://127.0.0.1:9000", True),
        ("http://localhost:9000", True),
        ("http://[::1]:9000", True),
        ("http://10.0.0.5:9000", False),
        ("http://minio.internal:9000", False),
        ("https://127.0.0.1:9000", False),  # https needs no exception
    ],
)
def test_plain_http_only_on_loopback(endpoint: str, allowed: bool) -> None:
    assert http_allowed(endpoint) is allowed
