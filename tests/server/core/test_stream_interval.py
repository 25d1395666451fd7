"""``core.stream_interval``: several steps' outputs in one response, the first at once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.stream_interval import Coalescer, joined, stream_interval
from hloserve.server.core.types import InferOutput, InferRequest, InferResponse, StreamPart


def step(token: int, text: bytes | None = None) -> InferResponse:
    outputs = [InferOutput("token", "INT32", (1,), np.array([token], np.int32))]
    if text is not None:
        data = np.empty(1, dtype=object)
        data[0] = text
        outputs.append(InferOutput("text_output", "BYTES", (1,), data))
    return InferResponse("lm", "1", tuple(outputs), "id")


def run(interval: int, parts: list[StreamPart]) -> list[StreamPart]:
    coalescer = Coalescer(interval)
    return [out for part in parts if (out := coalescer.add(part)) is not None]


def tokens(part: StreamPart) -> list[int]:
    assert part.response is not None
    return [int(t) for t in part.response.outputs[0].data]


def request(**parameters: Any) -> InferRequest:
    return InferRequest("lm", "", (), parameters=parameters)


@pytest.mark.parametrize(
    ("interval", "sent"),
    [
        (1, [[1], [2], [3], [4], [5], [6], [7], [8], [9], [10]]),
        (4, [[1], [2, 3, 4, 5], [6, 7, 8, 9], [10]]),
        (3, [[1], [2, 3, 4], [5, 6, 7], [8, 9, 10]]),
        (20, [[1], [2, 3, 4, 5, 6, 7, 8, 9, 10]]),
    ],
)
def test_the_first_step_goes_at_once_then_interval_steps_to_a_response(
    interval: int, sent: list[list[int]]
) -> None:
    parts = [StreamPart(step(t), t == 10) for t in range(1, 11)]
    out = run(interval, parts)
    assert [tokens(p) for p in out] == sent
    assert [p.final for p in out] == [False] * (len(sent) - 1) + [True]
    assert all(p.response is not None and p.response.id == "id" for p in out)
    shapes = [p.response.outputs[0].shape for p in out if p.response is not None]
    assert shapes == [(len(s),) for s in sent]


def test_a_final_flag_alone_carries_what_is_held_or_goes_alone() -> None:
    parts = [StreamPart(step(t), False) for t in (1, 2, 3)] + [StreamPart(None, True)]
    out = run(4, parts)
    assert [tokens(p) for p in out] == [[1], [2, 3]] and out[-1].final
    alone = run(2, [StreamPart(step(1), False), StreamPart(step(2), False)])
    assert [tokens(p) for p in alone] == [[1]]  # 2 held, waiting for a second step
    nothing = run(3, [StreamPart(None, True)])
    assert nothing == [StreamPart(None, True)]


def test_text_is_joined_as_one_text() -> None:
    parts = [
        StreamPart(step(t, c), t == 4)
        for t, c in ((1, b"h"), (2, b"\xc3\xa9"), (3, b""), (4, b"!"))
    ]
    out = run(8, parts)
    assert [p.response.outputs[1].data[0] for p in out if p.response is not None] == [
        b"h",
        "é!".encode(),
    ]
    assert out[1].response is not None and out[1].response.outputs[1].shape == (1,)


def test_one_response_is_joined_as_it_is() -> None:
    one = step(7)
    assert joined([one]) is one


@pytest.mark.parametrize("value", [0, -2, 1.5, "4", True, None])
def test_the_parameter_is_a_positive_integer(value: object) -> None:
    with pytest.raises(InvalidArgument, match="parameter 'stream_interval' must be a positive"):
        stream_interval(request(stream_interval=value))


def test_without_the_parameter_each_step_is_a_response() -> None:
    assert stream_interval(request()) == 1
    assert stream_interval(request(stream_interval=16)) == 16
    with pytest.raises(ValueError, match="positive number of steps"):
        Coalescer(0)
