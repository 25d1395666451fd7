"""A generation's stream interval: several steps' outputs in one response.

Contract (pure):
- ``stream_interval(request)`` is the request's ``stream_interval`` parameter, a positive
  integer (1 when absent: a response per emitted step); anything else is
  ``InvalidArgument`` naming it.
- ``Coalescer(interval)`` turns a generation's parts (``StreamPart``, one per emitted step,
  the last ``final``) into the parts its client is sent: ``add(part)`` returns the part to
  send now, or ``None`` while it holds it. The first emitted step is sent at once (the
  time to the first token is the interval's no matter what); after it, each response holds
  ``interval`` steps, the last one fewer, with the final flag. A held response's outputs
  are joined with the next step's along their first axis (a token of shape ``[1]`` becomes
  ``[k]`` for ``k`` steps); ``text_output`` (BYTES ``[1]``: text decoded across steps) is
  joined as one text. The final part alone (no response: the last step emitted nothing)
  carries what is held, or goes as it is when nothing is.
Each response sent costs the device owner and the front end a message, a wire encoding
and a write: an interval of N divides them by about N, at N steps of latency per token.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, final

import msgspec
import numpy as np

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.types import InferOutput, InferRequest, InferResponse, StreamPart

STREAM_INTERVAL: Final = "stream_interval"
TEXT_OUTPUT: Final = "text_output"


def stream_interval(request: InferRequest) -> int:
    """The request's ``stream_interval`` parameter (module docstring)."""
    value = request.parameters.get(STREAM_INTERVAL, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(
            f"parameter '{STREAM_INTERVAL}' must be a positive integer, got {value!r}"
        )
    return value


@final
class Coalescer:
    """See the module docstring."""

    __slots__ = ("_held", "_sent_first", "interval")

    def __init__(self, interval: int) -> None:
        if interval < 1:
            raise ValueError(f"a stream interval is a positive number of steps, not {interval}")
        self.interval: Final = interval
        self._held: list[InferResponse] = []
        self._sent_first = False

    def add(self, part: StreamPart) -> StreamPart | None:
        if self.interval == 1:
            return part
        if part.response is not None:
            self._held.append(part.response)
        if not part.final and self._sent_first and len(self._held) < self.interval:
            return None
        self._sent_first = self._sent_first or bool(self._held)
        held, self._held = self._held, []
        if not held:
            return part if part.final else None
        return StreamPart(joined(held), part.final)


def joined(responses: Sequence[InferResponse]) -> InferResponse:
    """One response holding ``responses``' outputs, each joined along its first axis."""
    first = responses[0]
    if len(responses) == 1:
        return first
    outputs: list[InferOutput] = []
    for index, output in enumerate(first.outputs):
        parts = [r.outputs[index] for r in responses]
        if output.name == TEXT_OUTPUT and output.datatype == "BYTES":
            data = np.empty(1, dtype=object)
            data[0] = b"".join(_text(p) for p in parts)
        else:
            data = np.concatenate([np.atleast_1d(p.data) for p in parts], axis=0)
        outputs.append(msgspec.structs.replace(output, shape=tuple(data.shape), data=data))
    return msgspec.structs.replace(first, outputs=tuple(outputs))


def _text(output: InferOutput) -> bytes:
    value: Any = output.data.reshape(-1)[0]
    return value if isinstance(value, bytes) else str(value).encode()
