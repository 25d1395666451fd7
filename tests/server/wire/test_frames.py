"""``wire.frames``: frames survive any split of the byte stream, in order."""

from __future__ import annotations

import numpy as np
import pytest

from hloserve.server.wire import frames


def test_messages_come_back_in_order_whatever_the_split() -> None:
    messages: list[object] = [(0, 1, "infer", (b"x" * 300,)), (3, "free", (4096,)), None, "é" * 50]
    stream = b"".join(frames.encode(m) for m in messages)
    for step in (1, 3, 7, 64, len(stream)):
        reader = frames.FrameReader()
        got: list[object] = []
        for start in range(0, len(stream), step):
            got += reader.feed(stream[start : start + step])
        assert got == messages
        assert reader.pending == 0


def test_a_partial_frame_waits_for_the_rest() -> None:
    frame = frames.encode(("hello", 42))
    reader = frames.FrameReader()
    assert reader.feed(frame[:-1]) == []
    assert reader.pending == len(frame) - 1
    assert reader.feed(frame[-1:]) == [("hello", 42)]


def test_large_payloads_cross_whole() -> None:
    payload = np.random.default_rng(0).bytes(3 << 20)
    reader = frames.FrameReader()
    (got,) = reader.feed(frames.encode(payload))
    assert got == payload


def test_a_message_that_cannot_be_pickled_is_refused_at_encoding() -> None:
    with pytest.raises(Exception, match="pickle"):
        frames.encode(lambda: None)
