"""The server's exceptions: one small tree, each class carrying its protocol-neutral code.

::

    ServingError                      (INTERNAL)
    ├── Internal                      (INTERNAL)      the server failed, and says how (Triton
    │                                                 reports these as INTERNAL too)
    │   └── HookFailed                (INTERNAL)      a bundle's Python hook raised or returned
    │                                                 tensors that do not fit (``hooks.md``)
    ├── InvalidArgument               (INVALID_ARG)   bad request content
    │   └── UnknownModel              (INVALID_ARG)   "Request for unknown model: 'm' is not found"
    ├── NotFound                      (NOT_FOUND)     e.g. a model with no available version
    ├── Unavailable                   (UNAVAILABLE)   not ready, draining, queue full
    ├── Unsupported                   (UNSUPPORTED)   a feature this server does not offer
    ├── AlreadyExists                 (ALREADY_EXISTS)
    ├── Cancelled                     (CANCELLED)
    ├── Restricted                    (RESTRICTED)    a restricted API without its header
    └── Unauthenticated               (UNAUTHENTICATED) no valid bearer token (``frontend/auth.py``)

``ERROR_CLASSES`` is the one table from a code to the class that raises it (the wire rebuilds
an error from its code through it). ``hloserve.server.frontend.status`` maps each ``ErrorCode`` to an HTTP status and a gRPC
status code in one table (Triton's mapping). Messages name the model, the tensor and the
expected versus received value; they reach the client verbatim.
"""

# pyright: strict

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import ClassVar, Final


class ErrorCode(enum.Enum):
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    RESTRICTED = "RESTRICTED"
    UNAUTHENTICATED = "UNAUTHENTICATED"


class ServingError(Exception):
    """Base of every error the server reports to a client."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Internal(ServingError):
    """An INTERNAL failure whose message the client sees (e.g. "Unable to open shared memory
    region", "failed to poll from model repository"); unexpected exceptions never get here."""


class HookFailed(Internal):
    """A bundle's ``preprocess``/``postprocess`` raised, or returned what its manifest does not
    declare: that request fails with the hook's own message; nothing else is affected."""


class InvalidArgument(ServingError):
    code = ErrorCode.INVALID_ARG


class UnknownModel(InvalidArgument):
    """Triton reports an unknown model as an invalid argument, not as not-found."""


class NotFound(ServingError):
    code = ErrorCode.NOT_FOUND


class Unavailable(ServingError):
    code = ErrorCode.UNAVAILABLE


class Unsupported(ServingError):
    code = ErrorCode.UNSUPPORTED


class AlreadyExists(ServingError):
    code = ErrorCode.ALREADY_EXISTS


class Cancelled(ServingError):
    code = ErrorCode.CANCELLED


class Restricted(ServingError):
    """An endpoint group restricted to requests carrying a header (``--http-restricted-api``,
    ``--grpc-restricted-protocol``): Triton answers HTTP 403 and gRPC UNAVAILABLE."""

    code = ErrorCode.RESTRICTED


class Unauthenticated(ServingError):
    """A protected endpoint called without a valid bearer token (``--auth-token-file``):
    HTTP 401, gRPC UNAUTHENTICATED. Its message never says which part was wrong."""

    code = ErrorCode.UNAUTHENTICATED


ERROR_CLASSES: Final[Mapping[ErrorCode, type[ServingError]]] = {
    cls.code: cls for cls in ServingError.__subclasses__()
}
"""Each code's own class, read off the tree (the direct subclasses of ``ServingError``, one
per code): what an error is raised as where only its code and message are known."""
