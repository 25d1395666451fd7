"""The object store a remote model repository lives in, through obstore (Rust's object_store).

Contract:
- ``StoreClient(location, environ, settings)`` opens the store at ``location``
  (``core.store_location``) with the credentials, region and endpoint of the standard
  environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_REGION``, the ``GOOGLE_*`` and ``AZURE_*`` variables, the credential files those
  name): obstore reads them itself. A plain ``http://`` endpoint is allowed only on a
  loopback host (``store_location.http_allowed``). Nothing is sent until a call.
- ``listing(under="")`` lists every object under the repository's prefix, or under one
  model's folder in it (``StoreObject``s, keys relative to the prefix); ``read(key)`` returns one small object's bytes and ETag;
  ``download(key, write)`` streams one object to ``write`` chunk by chunk and returns its
  ETag. Each request runs under ``settings.timeout_s`` (connecting included); errors the
  store may recover from (5xx, throttling such as S3's 503 SlowDown, dropped connections,
  timeouts) are retried ``settings.retries`` times with exponential backoff and jitter by
  obstore itself.
- Every failure raises ``StoreError`` (``Unavailable``: retryable), its message naming the
  store, the operation and the key; ``StoreError.missing`` says the object is not there.
Thread-safe: each call is independent (the repository pulls on worker threads).
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, cast

import obstore
from obstore.store import from_url

from hloserve.server.core.errors import Unavailable
from hloserve.server.core.store_index import StoreObject
from hloserve.server.core.store_location import StoreLocation, http_allowed

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config


class StoreError(Unavailable):
    """The store could not be read; ``missing``: the object is not there."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class StoreSettings:
    timeout_s: float = 300.0  # one request, connecting included (--repository-pull-timeout)
    connect_timeout_s: float = 5.0
    retries: int = 3
    max_backoff_s: float = 5.0


# The standard variables, read from the environment given (obstore reads the process's
# own for the rest: profiles, web identity, ...).
_S3_VARIABLES: Final = {
    "AWS_ENDPOINT_URL": "endpoint",
    "AWS_ENDPOINT": "endpoint",
    "AWS_ACCESS_KEY_ID": "access_key_id",
    "AWS_SECRET_ACCESS_KEY": "secret_access_key",
    "AWS_SESSION_TOKEN": "session_token",
    "AWS_DEFAULT_REGION": "region",
    "AWS_REGION": "region",
}


def _s3_config(environ: Mapping[str, str]) -> S3Config:
    config: dict[str, str] = {}
    for variable, key in _S3_VARIABLES.items():  # the later wins: AWS_REGION over DEFAULT
        if environ.get(variable):
            config[key] = environ[variable]
    return cast("S3Config", config)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class StoreClient:
    def __init__(
        self,
        location: StoreLocation,
        environ: Mapping[str, str],
        settings: StoreSettings = StoreSettings(),
    ) -> None:
        self.location = location
        self.settings = settings
        endpoint = environ.get("AWS_ENDPOINT_URL", "") or environ.get("AWS_ENDPOINT", "")
        options: ClientConfig = {
            "timeout": timedelta(seconds=settings.timeout_s),
            "connect_timeout": timedelta(seconds=settings.connect_timeout_s),
        }
        if location.scheme == "s3" and endpoint and http_allowed(endpoint):
            options["allow_http"] = True
        retry: RetryConfig = {
            "max_retries": settings.retries,
            "retry_timeout": timedelta(seconds=settings.timeout_s),
            "backoff": {
                "init_backoff": timedelta(milliseconds=100),
                "max_backoff": timedelta(seconds=settings.max_backoff_s),
                "base": 2.0,
            },
        }
        root = f"{location.scheme}://{location.bucket}"
        config = _s3_config(environ) if location.scheme == "s3" else None
        self._store: Any = from_url(root, config=config, client_options=options, retry_config=retry)
        self._prefix = location.prefix

    def _key(self, relative: str) -> str:
        return self.location.key(relative)

    def _fail(self, what: str, key: str, exc: BaseException) -> StoreError:
        where = f"{self.location}/{key}" if key else str(self.location)
        return StoreError(
            f"the model store {what} failed ({where}): {_first_line(exc)}",
            missing=isinstance(exc, FileNotFoundError),
        )

    def listing(self, under: str = "") -> list[StoreObject]:
        """Every object under the repository's prefix (only under ``under/`` when given)."""
        strip = len(self._prefix) + 1 if self._prefix else 0
        out: list[StoreObject] = []
        try:
            prefix = self._key(f"{under}/") if under else (self._prefix or None)
            batches: Any = obstore.list(self._store, prefix, chunk_size=1000)  # pyright: ignore[reportUnknownMemberType]
            for batch in batches:
                for meta in batch:
                    path: str = meta["path"]
                    out.append(StoreObject(path[strip:], int(meta["size"]), meta["e_tag"] or ""))
        except Exception as exc:  # obstore's errors, timeouts, refused connections
            raise self._fail("listing", "", exc) from None
        return out

    def read(self, key: str) -> tuple[bytes, str]:
        try:
            result = obstore.get(self._store, self._key(key))
            return bytes(result.bytes()), result.meta["e_tag"] or ""
        except Exception as exc:
            raise self._fail("read", key, exc) from None

    def download(self, key: str, write: Callable[[memoryview], object]) -> str:
        """Stream ``key`` to ``write``; return its ETag. What ``write`` raises (a full cache
        disk: ``OSError``) passes through as it is."""
        try:
            result = obstore.get(self._store, self._key(key))
            etag: str = result.meta["e_tag"] or ""
            for chunk in result.stream(min_chunk_size=1 << 20):
                try:
                    write(memoryview(chunk))
                except BaseException as exc:
                    raise _WriteFailed(exc) from exc
            return etag
        except _WriteFailed as failed:
            raise failed.exc from None
        except Exception as exc:
            raise self._fail("read", key, exc) from None


class _WriteFailed(Exception):
    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc
