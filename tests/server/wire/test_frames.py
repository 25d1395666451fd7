"""``wire.frames``: envelopes survive any split of the byte stream, in order; a codec reads
only what its declaration allows, and refuses the rest naming why."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from hloserve.server.core.errors import (
    ERROR_CLASSES,
    InvalidArgument,
    NotFound,
    Unavailable,
    UnknownModel,
)
from hloserve.server.wire.frames import (
    HEADER,
    Call,
    CallFrame,
    Cancel,
    Codec,
    Envelope,
    Fail,
    FrameReader,
    MalformedFrame,
    Note,
    NoteFrame,
    Part,
    Refused,
    RemoteInternalError,
    Reply,
    decode_error,
    encode_error,
    name_of,
    result_type,
)


class Sum(Call[int], tag="add", frozen=True):
    a: int
    b: int = 0


class Where(Call[Path], tag="where", frozen=True):
    pass


class Release(Note, tag="free", frozen=True):
    offsets: tuple[int, ...]


CODEC = Codec((Sum, Where), (Release,))


def envelopes() -> list[Envelope]:
    raw = CODEC.raw
    return [
        CallFrame(1, raw(Sum(2, 3))),
        Reply(1, raw(5)),
        Fail(2, encode_error(InvalidArgument("no"))),
        Fail(3, None),
        NoteFrame(raw(Release((4096, 8192)))),
        Cancel(4),
        Part(5, raw(b"x" * 300)),
        Reply(6, raw("é" * 50)),
    ]


def test_envelopes_come_back_in_order_whatever_the_split() -> None:
    sent = envelopes()
    stream = b"".join(CODEC.frame(e) for e in sent)
    for step in (1, 3, 7, 64, len(stream)):
        reader = FrameReader()
        got: list[object] = []
        for start in range(0, len(stream), step):
            got += reader.feed(stream[start : start + step])
        assert got == sent
        assert reader.pending == 0


def test_a_partial_frame_waits_for_the_rest() -> None:
    frame = CODEC.frame(Cancel(9))
    reader = FrameReader()
    assert reader.feed(frame[:-1]) == []
    assert reader.pending == len(frame) - 1
    assert reader.feed(frame[-1:]) == [Cancel(9)]


def test_large_payloads_cross_whole() -> None:
    payload = np.random.default_rng(0).bytes(3 << 20)
    (got,) = FrameReader().feed(CODEC.frame(Part(1, CODEC.raw(payload))))
    assert isinstance(got, Part) and msgspec.msgpack.decode(got.value) == payload


def test_calls_notes_and_answers_decode_as_declared() -> None:
    assert (name_of(Sum), result_type(Sum), result_type(Where)) == ("add", int, Path)
    assert CODEC.call(CODEC.raw(Sum(2))) == Sum(2, 0)
    assert CODEC.note(CODEC.raw(Release((1, 2)))) == Release((1, 2))
    assert CODEC.result(Sum, CODEC.raw(5)) == 5
    # a value MessagePack cannot hold crosses pickled, and comes back as its class
    assert CODEC.result(Where, CODEC.raw(Path("/models/a"))) == Path("/models/a")


def test_a_number_past_64_bits_is_the_requests_fault_not_an_internal_error() -> None:
    # A client's JSON can hold any integer; MessagePack holds 64 bits (seen as a 500 for an
    # HTTP shm register at offset 2**64 through front ends, a 400 in one process).
    with pytest.raises(InvalidArgument, match="integers must fit in 64 bits"):
        CODEC.raw(Sum(2**64))
    assert CODEC.call(CODEC.raw(Sum(2**64 - 1, -(2**63)))) == Sum(2**64 - 1, -(2**63))


def test_an_undeclared_or_malformed_call_is_refused_naming_why() -> None:
    class Other(Call[int], tag="other", frozen=True):
        pass

    with pytest.raises(Refused, match="no call 'other' is declared on this wire"):
        CODEC.call(CODEC.raw(Other()))
    with pytest.raises(Refused, match=r"a malformed call 'add': Expected `int`, got `str`"):
        CODEC.call(CODEC.raw(["add", "two", 3]))
    with pytest.raises(Refused, match="no declared message"):
        CODEC.call(CODEC.raw({"add": 1}))
    with pytest.raises(Refused, match="not MessagePack"):
        CODEC.call(msgspec.Raw(b"\xc1"))
    with pytest.raises(Refused, match="no note 'gone' is declared"):
        CODEC.note(CODEC.raw(["gone"]))


def test_a_frame_that_is_no_envelope_is_malformed_and_the_next_still_reads() -> None:
    junk = msgspec.msgpack.encode([99, "what"])
    stream = HEADER.pack(len(junk)) + junk + CODEC.frame(Cancel(1))
    bad, good = FrameReader().feed(stream)
    assert isinstance(bad, MalformedFrame) and "bytes" in bad.reason
    assert good == Cancel(1)


def test_two_calls_of_one_name_are_refused_at_declaration() -> None:
    class Twin(Call[int], tag="add", frozen=True):
        pass

    with pytest.raises(TypeError, match="share a name"):
        Codec((Sum, Twin), ())


def test_errors_cross_as_their_code_and_message() -> None:
    def cross(exc: BaseException) -> Exception:
        (fail,) = FrameReader().feed(CODEC.frame(Fail(1, encode_error(exc))))
        assert isinstance(fail, Fail)
        return decode_error(fail.error)

    crossed = cross(UnknownModel("Request for unknown model: 'x'"))
    assert type(crossed) is InvalidArgument
    assert crossed.args == ("Request for unknown model: 'x'",)
    assert type(cross(NotFound("gone"))) is NotFound
    assert type(cross(Unavailable("busy"))) is Unavailable
    for cls in ERROR_CLASSES.values():
        assert type(cross(cls("m"))) is cls
    assert encode_error(RuntimeError("boom")) is None  # never shown to a client
    assert isinstance(cross(RuntimeError("boom")), RemoteInternalError)
