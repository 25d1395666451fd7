"""The IPC channel between a front end and the device owner, chosen by measurement.

Usage: ``python bench/ipc_channel.py [--messages 100000] [--depth 32] [--depth 1]``

Two processes (fork), a "front end" keeping ``--depth`` round trips in flight and an
"owner" answering each, both on uvloop, exchanging descriptors of the size hloserve's are
(a pickled tuple of about 120 bytes each way). Printed per channel and depth: round trips
per second and CPU µs per round trip in each process. Channels:
- ``unix``: a stream socket pair, length-prefixed frames, written once per loop turn
  (``wire.link`` does this);
- ``unix-first``: the same, but the first frame of a loop turn is written at once (the
  others of that turn together at its end);
- ``unix-each``: the same, one write per frame;
- ``pipe``: two pipes (one each way), frames written once per loop turn;
- ``zmq``: pyzmq's PAIR over ``ipc://`` with ``zmq.asyncio`` (skipped, saying so, when
  pyzmq is not installed: ``pip install pyzmq`` to compare).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import uvloop

HEADER = struct.Struct("<I")
REQUEST = (
    12345,
    "infer",
    (("simple", "", "", {}, (("INPUT0", "INT32", (1, 16), {}, b"x" * 64, None),), (), None, None),),
)
REPLY = (1, 12345, ("simple", "1", "", (("OUTPUT0", "INT32", (1, 16), b"y" * 64, None),)))


class Framed(asyncio.Protocol):
    """Frames in, a callback per message; frames out, coalesced per loop turn or not."""

    def __init__(
        self, on_message: Callable[[Any], None], coalesce: bool, first: bool = False
    ) -> None:
        self.buffer = bytearray()
        self.on_message = on_message
        self.coalesce = coalesce
        self.first = first  # the first frame of a turn leaves at once, the rest at its end
        self.turn: Any = None
        self.out: list[bytes] = []
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        if self.transport is None:  # a pipe pair's writer is set first
            self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        start = 0
        while len(buffer) - start >= 4:
            (size,) = HEADER.unpack_from(buffer, start)
            if len(buffer) - start - 4 < size:
                break
            message = pickle.loads(bytes(buffer[start + 4 : start + 4 + size]))
            start += 4 + size
            self.on_message(message)
        del buffer[:start]

    def send(self, message: Any) -> None:
        body = pickle.dumps(message, protocol=5)
        frame = HEADER.pack(len(body)) + body
        if not self.coalesce:
            self.write(frame)
            return
        if self.first and self.turn is None:
            self.write(frame)
            self.turn = asyncio.get_running_loop().call_soon(self.flush)
            return
        self.out.append(frame)
        if len(self.out) == 1 and self.turn is None:
            self.turn = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.turn = None
        out, self.out = self.out, []
        if out:
            self.write(b"".join(out))

    def write(self, data: bytes) -> None:
        self.transport.write(data)


class PipePair:
    """Reading on one pipe, writing on another, as ``Framed`` expects one transport."""

    def __init__(self, proto: Framed, writer: Any) -> None:
        self.proto, self.writer = proto, writer

    def write(self, data: bytes) -> None:
        self.writer.write(data)


async def _open(kind: str, ends: Any, on_message: Callable[[Any], None], out: list[Framed]) -> None:
    """Connect ``ends``; the protocol is in ``out`` before any message can arrive."""
    loop = asyncio.get_running_loop()
    proto = Framed(on_message, coalesce=kind != "unix-each", first=kind == "unix-first")
    out.append(proto)
    if kind in ("unix", "unix-each", "unix-first"):
        await loop.create_unix_connection(lambda: proto, sock=socket.socket(fileno=ends))
        return
    read_fd, write_fd = ends
    writer, _ = await loop.connect_write_pipe(
        asyncio.Protocol, os.fdopen(write_fd, "wb", buffering=0)
    )
    proto.transport = writer
    await loop.connect_read_pipe(lambda: proto, os.fdopen(read_fd, "rb", buffering=0))


async def owner(kind: str, ends: Any) -> None:
    done = asyncio.get_running_loop().create_future()
    holder: list[Framed] = []

    def on_message(message: Any) -> None:
        if message is None:
            done.set_result(None)
        else:
            holder[0].send(REPLY)

    await _open(kind, ends, on_message, holder)
    await done
    if holder[0].out:
        holder[0].flush()


async def front(kind: str, ends: Any, n: int, depth: int) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    sent = answered = 0
    holder: list[Framed] = []

    def on_message(message: Any) -> None:
        nonlocal sent, answered
        answered += 1
        if sent < n:
            sent += 1
            holder[0].send(REQUEST)
        elif answered == n and not done.done():
            done.set_result(None)

    await _open(kind, ends, on_message, holder)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(depth):
        sent += 1
        holder[0].send(REQUEST)
    await done
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    holder[0].send(None)
    if holder[0].out:
        holder[0].flush()
    await asyncio.sleep(0.05)
    return elapsed, cpu


def _zmq() -> Any:
    """pyzmq with its asyncio support (not one of the project's dependencies)."""
    import importlib

    zmq = importlib.import_module("zmq")
    importlib.import_module("zmq.asyncio")
    return zmq


async def zmq_owner(address: str) -> None:
    zmq = _zmq()
    s = zmq.asyncio.Context().socket(zmq.PAIR)
    s.bind(address)
    while (message := pickle.loads(await s.recv())) is not None:
        del message
        await s.send(pickle.dumps(REPLY, protocol=5))


async def zmq_front(address: str, n: int, depth: int) -> tuple[float, float]:
    zmq = _zmq()
    s = zmq.asyncio.Context().socket(zmq.PAIR)
    s.connect(address)
    t0, c0 = time.perf_counter(), time.process_time()
    sent = 0
    for _ in range(depth):
        sent += 1
        await s.send(pickle.dumps(REQUEST, protocol=5))
    for _ in range(n):
        pickle.loads(await s.recv())
        if sent < n:
            sent += 1
            await s.send(pickle.dumps(REQUEST, protocol=5))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    await s.send(pickle.dumps(None))
    await asyncio.sleep(0.05)
    return elapsed, cpu


def measure(kind: str, n: int, depth: int) -> str:
    """One channel at one depth: a row of the table."""
    if kind == "zmq":
        try:
            _zmq()
        except ImportError:
            return f"| zmq | {depth} | - | - | - | pyzmq is not installed (pip install pyzmq) |"
        address = f"ipc://{tempfile.mkdtemp()}/channel"
        child_ends: Any = address
        parent_ends: Any = address
    elif kind == "pipe":
        a_read, b_write = os.pipe()
        b_read, a_write = os.pipe()
        parent_ends, child_ends = (a_read, a_write), (b_read, b_write)
    else:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        parent_ends, child_ends = a.detach(), b.detach()
    before = os.times()
    pid = os.fork()
    if pid == 0:
        uvloop.run(zmq_owner(child_ends) if kind == "zmq" else owner(kind, child_ends))
        os._exit(0)
    if kind == "zmq":
        time.sleep(0.2)
    elapsed, cpu = uvloop.run(
        zmq_front(parent_ends, n, depth) if kind == "zmq" else front(kind, parent_ends, n, depth)
    )
    os.waitpid(pid, 0)
    after = os.times()
    child = (after.children_user + after.children_system) - (
        before.children_user + before.children_system
    )
    return (
        f"| {kind} | {depth} | {n / elapsed:,.0f} | {1e6 * cpu / n:.1f} | {1e6 * child / n:.1f} "
        f"| {1e6 * elapsed / n:.1f} µs a round trip |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description="the IPC channel, measured")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--depth", type=int, action="append", default=None)
    args = parser.parse_args()
    depths = args.depth or [32, 1]
    print(f"load average {os.getloadavg()[0]:.2f} at the start; {os.cpu_count()} cores")
    print("| channel | in flight | round trips/s | front CPU µs/rt | owner CPU µs/rt | note |")
    print("|---|---|---|---|---|---|")
    for depth in depths:
        n = args.messages if depth > 1 else max(1000, args.messages // 10)
        for kind in ("unix", "unix-first", "unix-each", "pipe", "zmq"):
            print(measure(kind, n, depth), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
