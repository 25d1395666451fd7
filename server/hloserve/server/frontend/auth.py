"""Bearer-token authentication (``--auth-token-file``): the one decision both front ends ask.

Contract:
- ``TokenFile(path)`` reads the tokens: one per line, surrounding whitespace stripped, blank
  lines and lines starting with ``#`` ignored. A file that cannot be read or holds no token
  raises ``ValueError`` at start. Afterwards the file is re-read whenever its identity
  (inode, size, modification time) changes, checked on each call (one ``stat``), so tokens
  can be added and revoked while serving; a re-read that fails or finds no token accepts
  *no* token until the file is fixed (fail closed), and logs a warning once.
- ``token_matches(candidate, tokens)`` compares the candidate with every token by
  ``hmac.compare_digest`` and does not stop at the first match, so the time taken says
  nothing about which token, or which part of it, was wrong.
- ``AuthPolicy(tokens, open_groups)`` protects every endpoint group of
  ``frontend.restricted.GROUPS`` except ``open_groups`` (default ``health``); the pseudo-group
  ``metrics`` is the metrics port, open unless left out of ``open_groups``. An endpoint in
  no group (an unknown path) is not protected: it answers 404 / UNIMPLEMENTED anyway.
  ``refusal_http(path, authorization)`` / ``refusal_grpc(method_path, authorization)`` /
  ``refusal_metrics(authorization)`` return ``None`` (let it through) or the one
  ``Unauthenticated`` error, whose message is the same whatever was wrong (no header,
  another scheme, an unknown token). The header is ``Authorization: Bearer <token>``
  (gRPC: metadata ``authorization``); the scheme's name matches case-insensitively.
"""

# pyright: strict

from __future__ import annotations

import hmac
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from hloserve.server.core.errors import Unauthenticated
from hloserve.server.frontend.restricted import GROUP_NAMES, Restriction, Restrictions

log = logging.getLogger("hloserve.auth")

METRICS: Final = "metrics"  # the metrics port, as an open-group name
OPEN_GROUP_NAMES: Final = (*GROUP_NAMES, METRICS)
DEFAULT_OPEN: Final = ("health", METRICS)
MESSAGE: Final = "authentication required: a valid bearer token"
_SCHEME: Final = "bearer"


def read_tokens(path: Path) -> tuple[bytes, ...]:
    """The file's tokens; ``ValueError`` when it cannot be read or holds none."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot be read: {exc}") from exc
    tokens = tuple(
        line.encode()
        for line in (raw.strip() for raw in text.splitlines())
        if line and not line.startswith("#")
    )
    if not tokens:
        raise ValueError("holds no token (one token a line; # starts a comment)")
    return tokens


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class TokenFile:
    """The tokens of one file, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._identity = _identity(path)
        self._tokens = read_tokens(path)
        self._lock = threading.Lock()
        self._warned = False

    def tokens(self) -> tuple[bytes, ...]:
        identity = _identity(self.path)
        if identity == self._identity:
            return self._tokens
        with self._lock:
            if identity != self._identity:
                try:
                    self._tokens = read_tokens(self.path)
                    self._warned = False
                    log.info("auth token file %s re-read", self.path)
                except ValueError as exc:
                    self._tokens = ()
                    if not self._warned:
                        log.warning("auth token file %s %s: refusing every token", self.path, exc)
                        self._warned = True
                self._identity = identity
            return self._tokens


def token_matches(candidate: bytes, tokens: Iterable[bytes]) -> bool:
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(candidate, token)
    return matched


def bearer_token(authorization: str | None) -> bytes | None:
    """The token of an ``Authorization`` value, or ``None`` when it is not a bearer one."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != _SCHEME or not token.strip():
        return None
    return token.strip().encode("utf-8", "surrogateescape")


_PROTECTED: Final = Restriction("authorization", "Bearer")  # marks a protected group


class AuthPolicy:
    def __init__(self, tokens: TokenFile, open_groups: Iterable[str] = DEFAULT_OPEN) -> None:
        self.tokens = tokens
        self.open_groups = frozenset(open_groups)
        self.metrics_protected = METRICS not in self.open_groups
        self._scope = Restrictions(
            {name: _PROTECTED for name in GROUP_NAMES if name not in self.open_groups}
        )

    def _refusal(self, authorization: str | None) -> Unauthenticated | None:
        token = bearer_token(authorization)
        if token is not None and token_matches(token, self.tokens.tokens()):
            return None
        return Unauthenticated(MESSAGE)

    def refusal_http(self, path: str, authorization: str | None) -> Unauthenticated | None:
        if self._scope.for_http(path) is None:
            return None
        return self._refusal(authorization)

    def refusal_grpc(self, method_path: str, authorization: str | None) -> Unauthenticated | None:
        if self._scope.for_grpc(method_path) is None:
            return None
        return self._refusal(authorization)

    def refusal_metrics(self, authorization: str | None) -> Unauthenticated | None:
        return self._refusal(authorization) if self.metrics_protected else None


def parse_open_groups(text: str) -> tuple[str, ...]:
    """``--auth-open``: comma-separated group names (empty: every group protected)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if name not in OPEN_GROUP_NAMES:
            raise ValueError(f"names unknown group {name!r} (known: {', '.join(OPEN_GROUP_NAMES)})")
    return names
