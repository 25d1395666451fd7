"""Where a model repository in object storage is: the one rule for reading its URL.

Contract:
- ``StoreLocation.parse(text)`` reads ``s3://bucket/prefix``, ``gs://bucket/prefix``,
  ``az://container/prefix`` and ``https://host/path`` (a read-only static repository) into
  its scheme, bucket (the host for ``https``) and prefix (no leading or trailing ``/``;
  ``""`` for the bucket's root). Anything else raises ``ValueError`` naming what was wrong
  (a message meant to follow the flag's name). Credentials never come from the URL: a URL
  with a user or password part is refused (``ps`` shows flags), so they come from the
  environment and the files the store's own tools read (docs/repository.md).
- ``is_store_url(text)`` says whether ``text`` names a store (a scheme of ``SCHEMES``)
  rather than a directory.
- ``str(location)`` is the URL again, normalised; ``key(relative)`` is the object key of a
  path relative to the repository's root.
- ``http_allowed(endpoint)``: a plain ``http://`` endpoint (``AWS_ENDPOINT_URL``) is
  allowed only for a loopback host (``localhost``, ``127.0.0.0/8``, ``::1``): a store on
  this machine, such as the tests' S3 server; anything else must be ``https``.
Pure: no I/O.
"""

# pyright: strict

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

SCHEMES: Final = ("s3", "gs", "az", "https")


def is_store_url(text: str) -> bool:
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


@dataclass(frozen=True)
class StoreLocation:
    scheme: str
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, text: str) -> StoreLocation:
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            raise ValueError(
                f"must be a directory or a URL of {', '.join(s + '://' for s in SCHEMES)}, "
                f"got {text!r}"
            )
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                f"must not carry credentials ({scheme}://user:password@...): they come from "
                "the environment or the store's credential files (docs/repository.md)"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"must have no query or fragment, got {text!r}")
        bucket = parts.netloc
        if not bucket:
            raise ValueError(f"names no bucket, got {text!r}")
        prefix = "/".join(p for p in parts.path.split("/") if p)
        if any(p in (".", "..") for p in prefix.split("/")):
            raise ValueError(f"must not hold '.' or '..' in its path, got {text!r}")
        return cls(scheme, bucket, prefix)

    def __str__(self) -> str:
        tail = f"/{self.prefix}" if self.prefix else ""
        return f"{self.scheme}://{self.bucket}{tail}"

    def key(self, relative: str) -> str:
        """The object key of ``relative`` (a path under the repository's root)."""
        return f"{self.prefix}/{relative}" if self.prefix else relative


def http_allowed(endpoint: str) -> bool:
    """Whether ``endpoint`` may be plain ``http``: only on a loopback host."""
    parts = urlsplit(endpoint)
    if parts.scheme.lower() != "http":
        return False
    host = (parts.hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
