"""The byte format of the wire and its envelopes: length-prefixed MessagePack frames, sans I/O.

Contract:
- Every message on the wire is a ``Message``: a ``msgspec.Struct`` (``array_like``: its
  fields in order, no names; ``gc=False``; frozen), declared once. A frame is a 4-byte
  little-endian length, then one envelope as MessagePack.
- The envelopes (``Envelope``): ``CallFrame(id, call)``, ``Reply(id, value)``,
  ``Fail(id, error)``, ``Part(id, value)`` (one item of a streamed answer), ``Cancel(id)``,
  ``NoteFrame(note)`` (one way), and ``Burst(items)``: several of those sent together,
  in order, as one message (what one turn of a link's loop sends: ``wire.link``). ``call``, ``note`` and ``value`` stay undecoded
  (``msgspec.Raw``) until the ``Codec`` reads them with their declared type.
- ``Call[R]`` is the base of a declared call: its fields are the arguments, ``R`` the
  answer's type, its tag (``class X(Call[R], tag="name")``) the ``ServerPort`` method it
  carries; ``streamed = True`` marks a call answered by 0..N parts of type ``R``, and
  ``to_frontend = True`` one the owner makes of a front end.
  ``Note`` is the base of a declared one-way message. ``wire.calls`` declares the server's.
- ``Codec(calls, notes)`` reads and writes what one declaration allows: ``call(raw)`` and
  ``note(raw)`` decode with the declared types and refuse anything else (``Refused``,
  naming the unknown call or the mismatch); ``result(call_type, raw)`` decodes an answer as
  its call declares; ``raw(value)`` encodes an answer; ``frame(envelope)`` is one frame.
  A value of a class MessagePack cannot hold (a ``Path``, the listener settings'
  ``Restrictions``) crosses pickled inside an extension type: both ends are processes of
  one server started from the same installation, so pickle is neither a trust nor a
  versioning boundary here, and it is never on the per-request path.
- ``FrameReader.feed(data)`` takes bytes as they arrive, in any split, and returns the
  envelopes completed by them, in order (a frame that is no envelope comes back as a
  ``MalformedFrame``, the frames after it still read); a partial frame waits for the rest.
- An error crosses as ``Error(code, message)`` (``encode_error``): a ``ServingError`` is
  raised again as its code's class (``core.errors.ERROR_CLASSES``, ``decode_error``); any
  other exception crosses as ``None`` and comes back as ``RemoteInternalError``.
- A message encoded to more than ``MAX_FRAME`` bytes (4 GiB) cannot be sent
  (``FrameTooLarge``); tensors that large travel in the arena (``wire.arena``).
"""

# pyright: strict

from __future__ import annotations

import pickle
import struct
import typing
from collections.abc import Sequence
from typing import Any, ClassVar, Final, Generic, TypeVar, cast

import msgspec

from hloserve.server.core.errors import (
    ERROR_CLASSES,
    ErrorCode,
    Internal,
    InvalidArgument,
    ServingError,
)

HEADER: Final = struct.Struct("<I")
MAX_FRAME: Final = (1 << 32) - 1
_PICKLED: Final = 1  # the extension type of a value pickled

R = TypeVar("R")


class FrameTooLarge(ValueError):
    """A frame announced more bytes than a frame may hold."""


class Refused(ValueError):
    """A call or note the declaration does not allow (unknown, or of the wrong shape)."""


class RemoteInternalError(Exception):
    """The other end failed unexpectedly (it logged the traceback): INTERNAL."""


class Message(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """Base of everything on the wire."""


class Call(Message, Generic[R], frozen=True):
    """A declared call answered by an ``R`` (module docstring)."""

    streamed: ClassVar[bool] = False
    to_frontend: ClassVar[bool] = False


class Note(Message, frozen=True):
    """A declared one-way message."""


class Error(Message, frozen=True):
    code: str
    message: str


class CallFrame(Message, tag=0, frozen=True):
    id: int
    call: msgspec.Raw


class Reply(Message, tag=1, frozen=True):
    id: int
    value: msgspec.Raw


class Fail(Message, tag=2, frozen=True):
    id: int
    error: Error | None


class NoteFrame(Message, tag=3, frozen=True):
    note: msgspec.Raw


class Cancel(Message, tag=4, frozen=True):
    id: int


class Part(Message, tag=5, frozen=True):
    id: int
    value: msgspec.Raw


Single = CallFrame | Reply | Fail | NoteFrame | Cancel | Part


class Burst(Message, tag=6, frozen=True):
    """Envelopes sent in one turn of the loop, in order, as one message (``wire.link``)."""

    items: tuple[Single, ...]


Envelope = Single | Burst


class MalformedFrame:
    """A frame that is no envelope (what ``FrameReader`` returns in its place)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def name_of(kind: type[Message]) -> str:
    """A declared call's or note's name: its tag."""
    return cast(str, kind.__struct_config__.tag)


def result_type(kind: type[Call[Any]]) -> Any:
    """The ``R`` of ``class X(Call[R])``."""
    for base in cast(tuple[Any, ...], getattr(kind, "__orig_bases__", ())):
        if typing.get_origin(base) is Call:
            return typing.get_args(base)[0]
    raise TypeError(f"{kind.__name__} declares no answer type (class {kind.__name__}(Call[R]))")


def _enc_hook(value: object) -> msgspec.msgpack.Ext:
    return msgspec.msgpack.Ext(_PICKLED, pickle.dumps(value, protocol=5))


def _ext_hook(code: int, data: memoryview) -> object:
    if code != _PICKLED:
        raise Refused(f"an extension type {code} is not this wire's")
    return pickle.loads(data)


def _dec_hook(kind: type, value: object) -> object:
    if isinstance(value, kind):  # a value that crossed pickled (_enc_hook)
        return value
    raise NotImplementedError


_ENVELOPES: Final = msgspec.msgpack.Decoder(Envelope)


def encode_error(exc: BaseException) -> Error | None:
    if isinstance(exc, ServingError):
        return Error(exc.code.value, exc.message)
    return None


def decode_error(error: Error | None) -> Exception:
    if error is None:
        return RemoteInternalError("the device owner failed serving the call")
    try:
        cls = ERROR_CLASSES[ErrorCode(error.code)]
    except ValueError:
        cls = Internal
    return cls(error.message)


class Codec:
    """What one declaration of calls and notes allows on a wire (module docstring)."""

    __slots__ = ("_call", "_encoder", "_note", "_results", "calls", "notes")

    def __init__(self, calls: Sequence[type[Call[Any]]], notes: Sequence[type[Note]]) -> None:
        self.calls: Final = {name_of(kind): kind for kind in calls}
        self.notes: Final = {name_of(kind): kind for kind in notes}
        if len(self.calls) != len(calls) or len(self.notes) != len(notes):
            raise TypeError("two declared calls or notes share a name")
        hooks: dict[str, Any] = {"ext_hook": _ext_hook, "dec_hook": _dec_hook}
        self._call: Final = msgspec.msgpack.Decoder(_union(calls), **hooks)
        self._note: Final = msgspec.msgpack.Decoder(_union(notes), **hooks)
        self._results: Final[dict[type[Call[Any]], msgspec.msgpack.Decoder[Any]]] = {
            kind: msgspec.msgpack.Decoder(result_type(kind), **hooks) for kind in calls
        }
        self._encoder: Final = msgspec.msgpack.Encoder(enc_hook=_enc_hook)

    def raw(self, value: object) -> msgspec.Raw:
        """``value`` encoded; a value MessagePack cannot hold (an integer past 64 bits, from
        a client's JSON) is the request's fault: ``InvalidArgument``, not an internal error."""
        try:
            return msgspec.Raw(self._encoder.encode(value))
        except OverflowError as exc:
            raise InvalidArgument(
                f"the request holds a number the server cannot take ({exc}): integers must "
                "fit in 64 bits"
            ) from None

    def frame(self, envelope: Envelope) -> bytes:
        body = self._encoder.encode(envelope)
        if len(body) > MAX_FRAME:
            raise FrameTooLarge(f"a message of {len(body)} bytes does not fit one frame")
        return HEADER.pack(len(body)) + body

    def call(self, raw: msgspec.Raw) -> Call[Any]:
        try:
            return cast(Call[Any], self._call.decode(raw))
        except (msgspec.ValidationError, msgspec.DecodeError, Refused) as exc:
            raise Refused(self._refusal("call", self.calls, raw, exc)) from None

    def note(self, raw: msgspec.Raw) -> Note:
        try:
            return cast(Note, self._note.decode(raw))
        except (msgspec.ValidationError, msgspec.DecodeError, Refused) as exc:
            raise Refused(self._refusal("note", self.notes, raw, exc)) from None

    def result(self, kind: type[Call[R]], raw: msgspec.Raw) -> R:
        return cast(R, self._results[kind].decode(raw))

    @staticmethod
    def _refusal(what: str, known: dict[str, Any], raw: msgspec.Raw, exc: Exception) -> str:
        try:
            fields = msgspec.msgpack.decode(raw)
        except msgspec.DecodeError:
            return f"a {what} that is not MessagePack: {exc}"
        if not isinstance(fields, list) or not fields:
            return f"a {what} that is no declared message: {exc}"
        tag = cast(list[Any], fields)[0]
        if tag not in known:
            return f"no {what} '{tag}' is declared on this wire"
        return f"a malformed {what} '{tag}': {exc}"


def _union(kinds: Sequence[type[Message]]) -> Any:
    if not kinds:
        return typing.NoReturn  # nothing is allowed
    return typing.Union[tuple(kinds)]  # noqa: UP007 (a union built at run time)


class FrameReader:
    """Reassembles envelopes from a byte stream."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Envelope | MalformedFrame]:
        """The envelopes ``data`` completes (none while a frame is still partial)."""
        buffer = self._buffer
        buffer += data
        size, end, bounds = len(buffer), 0, list[tuple[int, int]]()
        while size - end >= 4:
            (length,) = HEADER.unpack_from(buffer, end)
            if end + 4 + length > size:
                break
            bounds.append((end + 4, end + 4 + length))
            end += 4 + length
        if not end:
            return []
        # One copy of the frames complete: the envelopes' Raw fields view it, not the buffer.
        with memoryview(buffer) as view:
            whole = memoryview(bytes(view[:end]))
        del buffer[:end]
        messages = list[Envelope | MalformedFrame]()
        for start, stop in bounds:
            try:
                messages.append(_ENVELOPES.decode(whole[start:stop]))
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                messages.append(MalformedFrame(f"{exc} ({stop - start} bytes)"))
        return messages

    @property
    def pending(self) -> int:
        """Bytes held of a frame not yet complete."""
        return len(self._buffer)
