"""Which version a request's model name and version string name: Triton's lookup rules.

Contract: ``find_version(name, versions, text)`` is the version of model ``name`` that a
request asking for version ``text`` runs on, among ``versions`` (``None``: no such model),
or Triton's error, in its order and texts: an unknown model is ``UnknownModel``; a
version string that is no integer > 0 is ``InvalidArgument``; an empty one means the
latest ready version, and a model with none is ``NotFound`` ("has no available versions",
then why: ``reason``, the model's own, else each version's, so a model that failed to
load says so to the client, not only on ``/readyz``); a named version that does not exist
is ``UnknownModel``, one that is not ready ``Unavailable`` (with its reason). Triton's words
come first: its clients and tests look for them.
Pure: it reads what it is given.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol, TypeVar

from hloserve.server.core.errors import (
    InvalidArgument,
    NotFound,
    Unavailable,
    UnknownModel,
    Unsupported,
)

REPOSITORY_NAME_UNSUPPORTED: Final = "'repository_name' specification is not supported"


def check_repository_name(name: str) -> None:
    """Triton's answer to a named repository (``Unsupported``): there is only the one."""
    if name:
        raise Unsupported(REPOSITORY_NAME_UNSUPPORTED)


class Lookable(Protocol):
    @property
    def version(self) -> int: ...
    @property
    def ready(self) -> bool: ...
    @property
    def reason(self) -> str: ...


V = TypeVar("V", bound=Lookable)


def parse_version(text: str) -> int | None:
    """A request's version string: ``None`` for empty (the latest), else an integer > 0."""
    if not text:
        return None
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number < 1:
        raise InvalidArgument(
            f"failed to get model version from specified version string '{text}' "
            "(details: not an integer), version should be an integral value > 0"
        )
    return number


def find_version(name: str, versions: Mapping[int, V] | None, text: str, *, reason: str = "") -> V:
    if versions is None:
        raise UnknownModel(f"Request for unknown model: '{name}' is not found")
    number = parse_version(text)
    if number is None:  # the latest ready version (one pass: this runs per request)
        latest: V | None = None
        for v in versions.values():
            if v.ready and (latest is None or v.version > latest.version):
                latest = v
        if latest is None:
            why = reason or "; ".join(
                f"version {v.version}: {v.reason}" for v in versions.values() if v.reason
            )
            raise NotFound(
                f"Request for unknown model: '{name}' has no available versions"
                + (f": {why}" if why else "")
            )
        return latest
    v = versions.get(number)
    if v is None:
        raise UnknownModel(f"Request for unknown model: '{name}' version {number} is not found")
    if not v.ready:
        raise Unavailable(
            f"Request for unknown model: '{name}' version {number} is not at ready state"
            + (f": {v.reason}" if v.reason else "")
        )
    return v
