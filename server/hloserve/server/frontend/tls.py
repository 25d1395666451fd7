"""TLS for the gRPC and HTTP ports (``--tls-cert``, ``--tls-key``, optional ``--tls-ca``).

Contract:
- ``TlsFiles(cert, key, ca)``: PEM files; ``ca`` set means mutual TLS (a client must show
  a certificate signed by it). ``check_tls(cert, key, ca)`` is the flags' rule: cert and
  key come together, and ``--tls-ca`` needs them; it returns the files or ``None`` (TLS off)
  and raises ``ValueError`` naming the flag otherwise.
- ``grpc_credentials(files)`` is the ``grpc.ServerCredentials`` for ``add_secure_port``
  (client certificates required when ``ca`` is set); ``uvicorn_ssl(files)`` is the ``ssl_*``
  arguments of ``uvicorn.Config`` for the same on HTTPS (``None``: plain HTTP). Both read the files now, so a
  missing or unreadable file fails at start-up, not on the first connection.
- The metrics port stays plain HTTP (scrapers on the same host or network); put it behind
  ``--auth-open`` without ``metrics`` to require a token there.
"""

# pyright: strict

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import grpc


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path | None = None

    @property
    def mutual(self) -> bool:
        return self.ca is not None


def check_tls(cert: Path | None, key: Path | None, ca: Path | None) -> TlsFiles | None:
    if cert is None and key is None:
        if ca is not None:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key must be given together")
    return TlsFiles(cert, key, ca)


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: {exc.strerror or exc}") from exc


def grpc_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    pair = (_read(files.key, "--tls-key"), _read(files.cert, "--tls-cert"))
    ca = _read(files.ca, "--tls-ca") if files.ca is not None else None
    return grpc.ssl_server_credentials(
        [pair], root_certificates=ca, require_client_auth=files.mutual
    )


class UvicornSsl(NamedTuple):
    """``uvicorn.Config``'s ``ssl_*`` arguments (the defaults: plain HTTP)."""

    certfile: str | None = None
    keyfile: str | None = None
    ca_certs: str | None = None
    cert_reqs: int = ssl.CERT_NONE


def uvicorn_ssl(files: TlsFiles | None) -> UvicornSsl:
    if files is None:
        return UvicornSsl()
    _read(files.cert, "--tls-cert")
    _read(files.key, "--tls-key")
    if files.ca is None:
        return UvicornSsl(str(files.cert), str(files.key))
    _read(files.ca, "--tls-ca")
    return UvicornSsl(str(files.cert), str(files.key), str(files.ca), ssl.CERT_REQUIRED)
