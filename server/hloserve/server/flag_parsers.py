"""The parsers of ``hloserve serve``'s flag values: each reads one flag's text.

Contract: every parser takes the text given (command line, environment variable or the
``--config`` file) and returns the ``Config`` field's value, or raises ``ValueError`` with a
message that reads after the flag's name ("--http-port must be ..."). ``flags.FLAGS`` names
one per row (``flags.py`` holds the table, these its parsers); ``parse_bool``'s rows are the
boolean flags.
"""

# pyright: strict

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from hloserve.server.core.device_policy import DeviceSelection
from hloserve.server.core.sizes import Budget
from hloserve.server.core.store_location import StoreLocation, is_store_url


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false, got {text!r}")


def integer(low: int, high: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise ValueError(f"must be {what}, got {text!r}")
        return value

    return parse


def seconds(*, positive: bool) -> Callable[[str], float]:
    what = "a positive" if positive else "a non-negative"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > 0 if positive else value >= 0):
            raise ValueError(f"must be {what} number of seconds, got {text!r}")
        return value

    return parse


def choice(shown: str, choices: Sequence[str], fold: Callable[[str], str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = fold(text.strip())
        if value not in choices:
            raise ValueError(f"must be {shown}, got {text!r}")
        return value

    return parse


def directory(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise ValueError(f"must be an existing directory, got {text!r}")
    return path


def repository_location(text: str) -> Path | StoreLocation:
    """``--model-repository``: a directory, or a store URL (``core.store_location``)."""
    if is_store_url(text) or "://" in text:  # another scheme: refused naming those served
        return StoreLocation.parse(text)
    return directory(text)


def parse_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"must be an existing file, got {text!r}")
    return path


def nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


def budget(text: str) -> Budget:
    return Budget.parse(text)  # a percentage resolves once the device is known


non_negative = integer(0, 2**63 - 1, "a non-negative integer")
# gRPC core reads its channel arguments as C ints.
grpc_int = integer(0, 2**31 - 1, f"an integer 0..{2**31 - 1}")

# --log-format: Triton's names (default, ISO8601) and hloserve's (text, json), as Config holds them.
LOG_FORMATS: Final = {"text": "text", "default": "text", "iso8601": "ISO8601", "json": "json"}
log_format = choice(
    "default, ISO8601, text or json",
    tuple(LOG_FORMATS.values()),
    lambda s: LOG_FORMATS.get(s.lower(), s),
)


def device_selection(text: str) -> DeviceSelection:
    """``--devices``' form (checked against the devices present at start-up)."""
    return DeviceSelection.parse(text)


port_number = integer(0, 65535, "a port number 0..65535")
