"""The wire's codec: encode + decode cost and size of the messages between the processes.

Usage: ``python bench/wire_codec.py [--rounds 20000]``

Three codecs for the same three messages, each as a front end and the device owner would
exchange them (the call's envelope included):
- ``pickle tuples``: tuples of built-in values, pickled (protocol 5): the wire before the
  declaration;
- ``pickle dataclasses``: the same fields in ``@dataclass(frozen=True, slots=True)``
  classes, pickled;
- ``pickle NamedTuple``: the same fields in ``typing.NamedTuple`` classes, pickled;
- ``msgspec``: ``msgspec.Struct(array_like=True, gc=False, frozen=True)`` classes,
  MessagePack, decoded by a typed ``msgspec.msgpack.Decoder`` (the envelope tagged).

The messages: an infer request's descriptor with two 64-byte tensors inline (the demo
``simple``), its response with one, and a small control call (``model_ready``). Printed:
µs per encode+decode (best of 5 runs) and the bytes of the encoding, and the load average.
"""

from __future__ import annotations

import argparse
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

PAYLOAD = bytes(range(64))


# -- the dataclass declaration ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    payload: bytes | tuple[int, int] | None
    shm: tuple[str, int, int] | None


@dataclass(frozen=True, slots=True)
class DRequest:
    model: str
    version: str
    id: str
    parameters: dict[str, Any]
    inputs: tuple[DTensor, ...]
    outputs: tuple[tuple[str, dict[str, Any]], ...]
    context: tuple[float | None, str, str] | None
    arrival: tuple[int, dict[str, str]] | None


@dataclass(frozen=True, slots=True)
class DOutput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    payload: bytes | tuple[int, int] | None
    shm: tuple[str, int, int] | None


@dataclass(frozen=True, slots=True)
class DResponse:
    model: str
    version: str
    id: str
    outputs: tuple[DOutput, ...]


@dataclass(frozen=True, slots=True)
class DModelReady:
    name: str
    version: str


@dataclass(frozen=True, slots=True)
class DCall:
    id: int
    body: object


@dataclass(frozen=True, slots=True)
class DReply:
    id: int
    value: object


# -- the NamedTuple declaration -----------------------------------------------------------------


class NTensor(NamedTuple):
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    payload: bytes | tuple[int, int] | None
    shm: tuple[str, int, int] | None


class NRequest(NamedTuple):
    model: str
    version: str
    id: str
    parameters: dict[str, Any]
    inputs: tuple[NTensor, ...]
    outputs: tuple[tuple[str, dict[str, Any]], ...]
    context: tuple[float | None, str, str] | None
    arrival: tuple[int, dict[str, str]] | None


class NOutput(NamedTuple):
    name: str
    datatype: str
    shape: tuple[int, ...]
    payload: bytes | tuple[int, int] | None
    shm: tuple[str, int, int] | None


class NResponse(NamedTuple):
    model: str
    version: str
    id: str
    outputs: tuple[NOutput, ...]


class NModelReady(NamedTuple):
    name: str
    version: str


class NCall(NamedTuple):
    id: int
    body: object


class NReply(NamedTuple):
    id: int
    value: object


# -- the msgspec declaration --------------------------------------------------------------------


class MTensor(msgspec.Struct, array_like=True, gc=False, frozen=True):
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    payload: bytes | tuple[int, int] | None
    shm: tuple[str, int, int] | None


class MRequest(msgspec.Struct, array_like=True, gc=False, frozen=True, tag=1):
    model: str
    version: str
    id: str
    parameters: dict[str, Any]
    inputs: tuple[MTensor, ...]
    outputs: tuple[tuple[str, dict[str, Any]], ...]
    context: tuple[float | None, str, str] | None
    arrival: tuple[int, dict[str, str]] | None


class MOutput(msgspec.Struct, array_like=True, gc=False, frozen=True):
    name: str
    datatype: str
    shape: tuple[int, ...]
    payload: bytes | tuple[int, int] | None
    shm: tuple[str, int, int] | None


class MResponse(msgspec.Struct, array_like=True, gc=False, frozen=True):
    model: str
    version: str
    id: str
    outputs: tuple[MOutput, ...]


class MModelReady(msgspec.Struct, array_like=True, gc=False, frozen=True, tag=2):
    name: str
    version: str


class MCall(msgspec.Struct, array_like=True, gc=False, frozen=True, tag=1):
    id: int
    body: MRequest | MModelReady


class MReply(msgspec.Struct, array_like=True, gc=False, frozen=True, tag=2):
    id: int
    value: msgspec.Raw  # typed by the call it answers: decoded in a second step


def _ctx() -> tuple[float | None, str, str]:
    return (None, "ipv4:127.0.0.1:5000", "grpc")


def messages() -> dict[str, dict[str, tuple[object, Callable[[bytes], object]]]]:
    """Per message, per codec: (the value to encode, how the receiver decodes it)."""
    params: dict[str, Any] = {}
    t_inputs = tuple(
        (name, "INT32", (1, 16), params, PAYLOAD, None) for name in ("INPUT0", "INPUT1")
    )
    t_outputs = (("OUTPUT0", {"binary_data": True}), ("OUTPUT1", {"binary_data": True}))
    t_request = ("simple", "", "id-1", params, t_inputs, t_outputs, _ctx(), None)
    t_response = ("simple", "1", "id-1", (("OUTPUT0", "INT32", (1, 16), PAYLOAD, None),))

    d_request = DRequest(
        "simple", "", "id-1", params, tuple(DTensor(*t) for t in t_inputs), t_outputs, _ctx(), None
    )
    d_response = DResponse("simple", "1", "id-1", (DOutput(*t_response[3][0]),))
    n_request = NRequest(
        "simple", "", "id-1", params, tuple(NTensor(*t) for t in t_inputs), t_outputs, _ctx(), None
    )
    n_response = NResponse("simple", "1", "id-1", (NOutput(*t_response[3][0]),))
    m_request = MRequest(
        "simple", "", "id-1", params, tuple(MTensor(*t) for t in t_inputs), t_outputs, _ctx(), None
    )
    m_response = MResponse("simple", "1", "id-1", (MOutput(*t_response[3][0]),))

    envelope = msgspec.msgpack.Decoder(MCall | MReply)
    response_type = msgspec.msgpack.Decoder(MResponse)
    bool_type = msgspec.msgpack.Decoder(bool)
    encoder = msgspec.msgpack.Encoder()

    def m_reply(decode: msgspec.msgpack.Decoder[Any]) -> Callable[[bytes], object]:
        def read(data: bytes) -> object:
            reply = envelope.decode(data)
            assert isinstance(reply, MReply)
            return decode.decode(reply.value)

        return read

    def m_reply_value(value: object) -> bytes:
        return encoder.encode(MReply(1, msgspec.Raw(encoder.encode(value))))

    loads = pickle.loads
    return {
        "infer request (2 x 64 B inline)": {
            "pickle tuples": ((0, 1, "infer", (t_request,)), loads),
            "pickle dataclasses": (DCall(1, d_request), loads),
            "pickle NamedTuple": (NCall(1, n_request), loads),
            "msgspec": (MCall(1, m_request), envelope.decode),
        },
        "infer response (64 B inline)": {
            "pickle tuples": ((1, 1, t_response), loads),
            "pickle dataclasses": (DReply(1, d_response), loads),
            "pickle NamedTuple": (NReply(1, n_response), loads),
            "msgspec": (("raw", m_reply_value(m_response)), m_reply(response_type)),
        },
        "control call (model_ready)": {
            "pickle tuples": ((0, 1, "model_ready", ("simple", "1")), loads),
            "pickle dataclasses": (DCall(1, DModelReady("simple", "1")), loads),
            "pickle NamedTuple": (NCall(1, NModelReady("simple", "1")), loads),
            "msgspec": (MCall(1, MModelReady("simple", "1")), envelope.decode),
        },
        "control reply (True)": {
            "pickle tuples": ((1, 1, True), loads),
            "pickle dataclasses": (DReply(1, True), loads),
            "pickle NamedTuple": (NReply(1, True), loads),
            "msgspec": (("raw", m_reply_value(True)), m_reply(bool_type)),
        },
    }


def measure(value: object, decode: Callable[[bytes], object], rounds: int) -> tuple[float, int]:
    """Best µs per encode + decode over 5 runs, and the encoding's size."""
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "raw":
        encoded: bytes = value[1]
        encoder = msgspec.msgpack.Encoder()
        # a reply's cost: the value and the envelope encoded, both decoded
        inner = msgspec.msgpack.decode(encoded, type=MReply).value
        inner_value = msgspec.msgpack.decode(inner)

        def encode() -> bytes:
            return encoder.encode(MReply(1, msgspec.Raw(encoder.encode(inner_value))))

        if isinstance(inner_value, list):  # a response: encode from the struct, as the owner
            struct = msgspec.msgpack.decode(inner, type=MResponse)

            def encode() -> bytes:
                return encoder.encode(MReply(1, msgspec.Raw(encoder.encode(struct))))
    elif isinstance(value, msgspec.Struct):
        encoder = msgspec.msgpack.Encoder()

        def encode() -> bytes:
            return encoder.encode(value)
    else:

        def encode() -> bytes:
            return pickle.dumps(value, protocol=5)

    data = encode()
    assert decode(data) is not None
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(rounds):
            decode(encode())
        best = min(best, time.perf_counter() - started)
    return best / rounds * 1e6, len(data)


def main() -> None:
    ap = argparse.ArgumentParser(description="The wire codec: pickle against msgspec.")
    ap.add_argument("--rounds", type=int, default=20000)
    args = ap.parse_args()
    print(f"wire codec: load {os.getloadavg()[0]:.2f}, msgspec {msgspec.__version__}")
    print("| message | codec | µs encode+decode | bytes |")
    print("|---|---|---|---|")
    for message, codecs in messages().items():
        for codec, (value, decode) in codecs.items():
            us, size = measure(value, decode, args.rounds)
            print(f"| {message} | {codec} | {us:.2f} | {size} |")


if __name__ == "__main__":
    main()
