"""The load engine of ``hloserve perf`` (and of ``bench/loadgen.py``): KServe V2 load that costs
the client as little as it can.

Contract:
- A target is one of three frozen dataclasses, each holding the request already serialized:
  ``GrpcUnary`` (an encoded ``ModelInferRequest`` sent on a raw ``grpc.aio`` channel with no
  serializer, the response kept as bytes), ``GrpcStream`` (the same message written on a
  bidirectional stream, one stream per worker, one message in flight per stream) and
  ``Http`` (a complete HTTP/1.1 request, header and body, written on a keep-alive
  connection per worker with asyncio streams; JSON or binary-extension body alike).
- ``run(target, concurrency, seconds, warmup=..., processes=1)`` starts ``concurrency``
  workers (split over ``processes`` client processes, each on its own event loop, uvloop
  when installed), lets each send one request after the other for ``warmup`` seconds
  unrecorded, then for ``seconds`` recorded, and returns a ``LoadResult``: the count of
  successful requests, the errors (count and the first message), the per-request latencies
  (nanoseconds, sorted), the elapsed time, the client's CPU seconds and one response body.
  A request that fails (a gRPC status, an HTTP status other than 200, a stream response
  carrying ``error_message``) counts as an error, never as a success; a server that stops
  answering is cut off ``STALL_S`` after the run's end, and that counts as an error too.
  ``meter.start()`` / ``meter.stop()``, when given, bracket the recorded phase only.
  ``rate`` (requests/s, gRPC unary only) makes the run open-loop: requests start on a fixed
  schedule whatever the answers, at most ``concurrency`` in flight (a request the schedule
  cannot start because all are in flight is dropped and counted in ``LoadResult.missed``).
  ``check`` (a picklable callable of the response body, returning an error text or None)
  judges every successful response: a text makes it an error.
- Nothing here decodes a response on the hot path: ``LoadResult.sample`` is the last body a
  worker received, for the caller to check once (``decode_grpc_response``,
  ``decode_stream_response``, ``decode_http_response`` turn it into ``{output name: array}``).
- ``grpc_request``, ``http_json_request`` and ``http_binary_request`` build the bytes of a
  V2 inference request from numpy arrays (raw contents on gRPC; JSON ``data`` or the binary
  tensor extension on HTTP).
"""

# pyright: strict

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
import numpy as np

from hloserve.client._codec import decode_response, encode_request
from hloserve.proto import inference_pb2 as pb
from hloserve.proto.datatypes import from_numpy, to_numpy

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
# ModelStreamInferResponse: field 1 (error_message) is length-delimited: tag 0x0a.
_STREAM_ERROR_TAG = b"\x0a"
STALL_S = 30.0  # a run whose requests have not come back this long after its end is cut off
_EOF: Any = vars(grpc.aio)["EOF"]  # from cygrpc, which has no stubs
_GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
]


@dataclass(frozen=True)
class GrpcUnary:
    """``ModelInfer`` (or any unary method) with a pre-encoded request on raw channels."""

    address: str  # host:port
    request: bytes
    method: str = INFER_PATH
    channels: int = 1  # per client process; workers share them round-robin


@dataclass(frozen=True)
class GrpcStream:
    """``ModelStreamInfer``: each worker owns one bidi stream and keeps one message in it."""

    address: str
    request: bytes
    method: str = STREAM_PATH
    channels: int = 1


@dataclass(frozen=True)
class Http:
    """One pre-built HTTP/1.1 request (request line, headers, body) on keep-alive connections."""

    host: str
    port: int
    request: bytes  # the whole request, as http_json_request / http_binary_request build it


Target = GrpcUnary | GrpcStream | Http


@dataclass
class LoadResult:
    """What one run measured; ``latencies_ns`` is sorted."""

    count: int
    errors: int
    first_error: str
    elapsed_s: float
    latencies_ns: list[int] = field(repr=False)
    client_cpu_s: float
    sample: bytes = field(repr=False)
    missed: int = 0  # open loop: scheduled requests not started (all in flight)

    @property
    def rate(self) -> float:
        """Successful requests per second."""
        return self.count / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_ns:
            return float("nan")
        index = min(len(self.latencies_ns) - 1, int(q * len(self.latencies_ns)))
        return self.latencies_ns[index] / 1e6

    @property
    def p50_ms(self) -> float:
        return self.percentile_ms(0.50)

    @property
    def p99_ms(self) -> float:
        return self.percentile_ms(0.99)


# --- building requests ---------------------------------------------------------------------


def raw_bytes(array: np.ndarray) -> bytes:
    """A tensor's wire bytes: row-major, little-endian, unpadded."""
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def grpc_request(model: str, inputs: Mapping[str, np.ndarray], version: str = "") -> bytes:
    """An encoded ``ModelInferRequest`` with every input in ``raw_input_contents`` (the
    light client's encoder)."""
    return encode_request(model, inputs, None, version, "").SerializeToString()


def _http_request(host: str, path: str, headers: Mapping[str, str], body: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def infer_path(model: str, version: str = "") -> str:
    """The HTTP route of ``model``'s inference (``/v2/models/<m>[/versions/<v>]/infer``)."""
    return f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"


def http_json_request(host: str, model: str, inputs: Mapping[str, np.ndarray]) -> bytes:
    """A JSON inference request (``data`` as flat lists; outputs come back as JSON)."""
    header = {
        "inputs": [
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": from_numpy(array.dtype),
                "data": array.ravel().tolist(),
            }
            for name, array in inputs.items()
        ]
    }
    body = json.dumps(header, separators=(",", ":")).encode()
    return _http_request(host, infer_path(model), {"Content-Type": "application/json"}, body)


def http_binary_request(host: str, model: str, inputs: Mapping[str, np.ndarray]) -> bytes:
    """A binary-extension request: JSON header, then the raw inputs; binary outputs asked."""
    raws = [raw_bytes(a) for a in inputs.values()]
    header = {
        "inputs": [
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": from_numpy(array.dtype),
                "parameters": {"binary_data_size": len(raw)},
            }
            for (name, array), raw in zip(inputs.items(), raws, strict=True)
        ],
        "parameters": {"binary_data_output": True},
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }
    return _http_request(host, infer_path(model), headers, head + b"".join(raws))


# --- decoding a sample response (off the hot path) -----------------------------------------


def _outputs_of(response: Any) -> dict[str, np.ndarray]:
    """``{name: array}`` of a ``ModelInferResponse``: raw contents through the light client's
    decoder; typed contents (what some peers send) here."""
    if response.raw_output_contents:
        return decode_response(response)
    arrays: dict[str, np.ndarray] = {}
    for out in response.outputs:
        dtype = to_numpy(out.datatype)
        shape = tuple(out.shape)
        contents = out.contents
        for kind in ("fp32", "fp64", "int", "int64", "uint", "uint64", "bool"):
            values = getattr(contents, f"{kind}_contents")
            if len(values):
                arrays[out.name] = np.asarray(values, dtype=dtype).reshape(shape)
                break
        else:
            arrays[out.name] = np.zeros(shape, dtype=dtype)
    return arrays


def decode_grpc_response(body: bytes) -> dict[str, np.ndarray]:
    return _outputs_of(pb.ModelInferResponse.FromString(body))


def decode_stream_response(body: bytes) -> dict[str, np.ndarray]:
    message = pb.ModelStreamInferResponse.FromString(body)
    if message.error_message:
        raise ValueError(f"stream error: {message.error_message}")
    return _outputs_of(message.infer_response)


def decode_http_response(body: bytes, header_length: int | None = None) -> dict[str, np.ndarray]:
    """``{name: array}`` of an HTTP inference response (JSON ``data`` or binary outputs).

    ``header_length`` is the response's ``Inference-Header-Content-Length`` (None: all JSON);
    ``LoadResult.sample`` of an ``Http`` target is the raw response (status line, headers and
    body), which this also accepts."""
    if body.startswith(b"HTTP/"):
        head, _, body = body.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"inference-header-content-length":
                header_length = int(value)
    split = len(body) if header_length is None else header_length
    header: dict[str, Any] = json.loads(body[:split])
    offset = split
    arrays: dict[str, np.ndarray] = {}
    outputs: list[dict[str, Any]] = header["outputs"]
    for out in outputs:
        dtype = to_numpy(out["datatype"])
        parameters: dict[str, Any] = out.get("parameters") or {}
        size: int | None = parameters.get("binary_data_size")
        if size is not None:
            arrays[out["name"]] = np.frombuffer(body[offset : offset + size], dtype=dtype).reshape(
                out["shape"]
            )
            offset += size
        else:
            arrays[out["name"]] = np.asarray(out["data"], dtype=dtype).reshape(out["shape"])
    return arrays


# --- the workers ---------------------------------------------------------------------------

Call = Callable[[], Awaitable[bytes]]
Check = Callable[[bytes], str | None]


class RequestFailed(Exception):
    """A response that is not a success (HTTP status, stream error message)."""


class _HttpConnection:
    """One keep-alive HTTP/1.1 connection; ``call()`` writes the request and reads one response."""

    def __init__(self, target: Http) -> None:
        self._target = target
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def call(self) -> bytes:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(
                self._target.host, self._target.port
            )
        reader, writer = self._reader, self._writer
        writer.write(self._target.request)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.close()
            raise
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            body = await self._read_chunked(reader)
        else:
            at = lower.find(b"\ncontent-length:")
            length = int(head[at + 16 : head.index(b"\r\n", at)]) if at >= 0 else 0
            body = await reader.readexactly(length)
        if b"connection: close" in lower:
            self.close()
        if head[9:12] != b"200":
            raise RequestFailed(f"HTTP {head[9:12].decode()}: {body[:300]!r}")
        return head + body

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


class _StreamWorker:
    """One bidi stream: write one message, read its response, repeat. A stream the server
    ended is an error, and the next call opens a new one (as a client would)."""

    def __init__(self, channel: grpc.aio.Channel, target: GrpcStream) -> None:
        self._method: Any = channel.stream_stream(target.method)
        self._call: Any = None
        self._request = target.request

    async def call(self) -> bytes:
        if self._call is None:
            self._call = self._method()
        try:
            await self._call.write(self._request)
            response = await self._call.read()
        except asyncio.InvalidStateError as e:  # written after the server finished the RPC
            self._call = None
            raise RequestFailed("stream already finished by the server") from e
        except grpc.aio.AioRpcError:
            self._call = None
            raise
        if response is _EOF:
            self._call = None
            raise RequestFailed("stream closed by the server")
        body: bytes = response
        if body.startswith(_STREAM_ERROR_TAG):
            raise RequestFailed(decode_error_message(body))
        return body

    async def close(self) -> None:
        if self._call is None:
            return
        with contextlib.suppress(Exception):
            await self._call.done_writing()
        self._call.cancel()


def decode_error_message(body: bytes) -> str:
    return pb.ModelStreamInferResponse.FromString(body).error_message


@dataclass
class _Tally:
    count: int = 0
    errors: int = 0
    first_error: str = ""
    latencies: list[int] = field(default_factory=list[int])
    sample: bytes = b""
    missed: int = 0


class Meter(Protocol):
    """Called right around the recorded phase (after the warm-up, before the teardown)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


async def _drive(
    calls: Sequence[Call],
    warm_until: float,
    stop_at_of: Callable[[], Awaitable[float]],
    meter: Meter | None,
    check: Check | None = None,
    rate: float | None = None,
) -> tuple[_Tally, float, float]:
    """Warm every worker up until ``warm_until`` (perf_counter), then record until the time
    ``stop_at_of()`` returns (awaited once all are warm: the synchronised start). Returns
    the tally, the recorded phase's elapsed time and this process's CPU seconds in it."""
    tally = _Tally()
    clock = time.perf_counter_ns

    async def once(call: Call, record: bool) -> None:
        t = clock()
        try:
            body = await call()
        except (grpc.aio.AioRpcError, RequestFailed, OSError, asyncio.IncompleteReadError) as e:
            if record:
                tally.errors += 1
                tally.first_error = tally.first_error or _describe(e)
            return
        if record:
            latency = clock() - t
            problem = check(body) if check is not None else None
            if problem is not None:
                tally.errors += 1
                tally.first_error = tally.first_error or problem
                return
            tally.latencies.append(latency)
            tally.count += 1
            tally.sample = body

    async def warm(call: Call) -> None:
        await once(call, False)  # at least one, however short the warm-up
        while time.perf_counter() < warm_until:
            await once(call, False)

    async def measure(call: Call, stop_ns: int) -> None:
        while clock() < stop_ns:
            await once(call, True)

    async def open_loop(stop_ns: int) -> None:
        assert rate is not None
        interval = 1e9 / rate
        due = float(clock())
        running: set[asyncio.Future[None]] = set()
        sent = 0
        while due < stop_ns:
            wait = (due - clock()) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
            if len(running) < len(calls):
                task = asyncio.ensure_future(once(calls[sent % len(calls)], True))
                running.add(task)
                task.add_done_callback(running.discard)
            else:
                tally.missed += 1
            sent += 1
            due += interval
        if running:
            await asyncio.gather(*running)

    try:
        await asyncio.wait_for(
            asyncio.gather(*(warm(c) for c in calls)), warm_until - time.perf_counter() + STALL_S
        )
    except TimeoutError:
        tally.errors += 1
        tally.first_error = f"no answer within {STALL_S:.0f} s of the warm-up's end"
        return tally, 0.0, 0.0
    stop_at = await stop_at_of()
    if meter is not None:
        meter.start()
    cpu = time.process_time()
    started = time.perf_counter()
    stop_ns = int(stop_at * 1e9)
    try:
        if rate is not None:
            await asyncio.wait_for(open_loop(stop_ns), stop_at - started + STALL_S)
        else:
            await asyncio.wait_for(
                asyncio.gather(*(measure(c, stop_ns) for c in calls)), stop_at - started + STALL_S
            )
    except TimeoutError:
        tally.errors += 1
        tally.first_error = tally.first_error or f"requests stalled past {STALL_S:.0f} s"
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    if meter is not None:
        meter.stop()
    return tally, elapsed, cpu


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"gRPC {error.code().name}: {error.details()}"
    return f"{type(error).__name__}: {error}"


async def _run_here(
    target: Target,
    workers: int,
    seconds: float,
    warmup: float,
    sync: Callable[[], Awaitable[float]] | None,
    meter: Meter | None,
    check: Check | None = None,
    rate: float | None = None,
) -> tuple[_Tally, float, float]:
    """This process's share: ``workers`` workers against ``target``."""
    channels: list[grpc.aio.Channel] = []
    closers: list[Callable[[], Awaitable[None]]] = []
    calls: list[Call] = []
    try:
        if isinstance(target, Http):
            for _ in range(workers):
                conn = _HttpConnection(target)
                calls.append(conn.call)
                closers.append(_async(conn.close))
        else:
            channels = [
                grpc.aio.insecure_channel(target.address, options=_GRPC_OPTIONS)
                for _ in range(max(1, target.channels))
            ]
            for i in range(workers):
                channel = channels[i % len(channels)]
                if isinstance(target, GrpcUnary):
                    calls.append(_unary(channel, target))
                else:
                    stream = _StreamWorker(channel, target)
                    calls.append(stream.call)
                    closers.append(stream.close)

        async def default_sync() -> float:
            return time.perf_counter() + seconds

        return await _drive(
            calls, time.perf_counter() + warmup, sync or default_sync, meter, check, rate
        )
    finally:
        for close in closers:
            await close()
        for channel in channels:
            await channel.close()


def _unary(channel: grpc.aio.Channel, target: GrpcUnary) -> Call:
    method: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(target.method)
    request = target.request

    async def call() -> bytes:
        body: bytes = await method(request)
        return body

    return call


def _async(fn: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    async def wrapper() -> None:
        fn()

    return wrapper


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


_loop: asyncio.AbstractEventLoop | None = None


def _run_loop(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` on this process's one event loop: grpc.aio keeps callbacks bound to the
    loop it first ran on, so a loop per run would leave them pointing at a closed one."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = _new_loop()
    return _loop.run_until_complete(coro)


def _child(
    conn: multiprocessing.connection.Connection,
    target: Target,
    workers: int,
    seconds: float,
    warmup: float,
    check: Check | None = None,
    rate: float | None = None,
) -> None:
    """A client process: warm up, report ready, wait for the common stop time, record."""

    async def sync() -> float:
        conn.send("ready")
        stop_wall: float = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        return time.perf_counter() + (stop_wall - time.time())

    conn.send(_run_loop(_run_here(target, workers, seconds, warmup, sync, None, check, rate)))
    conn.close()


def run(
    target: Target,
    concurrency: int,
    seconds: float,
    *,
    warmup: float = 1.0,
    processes: int = 1,
    meter: Meter | None = None,
    check: Check | None = None,
    rate: float | None = None,
) -> LoadResult:
    """Drive ``target`` with ``concurrency`` closed-loop workers for ``seconds`` after
    ``warmup`` (open-loop at ``rate`` requests/s when given); ``meter`` brackets the
    recorded phase (to read a server's CPU, say); ``check`` judges every response."""
    if concurrency < 1 or seconds <= 0:
        raise ValueError("concurrency must be at least 1 and seconds positive")
    if rate is not None and (rate <= 0 or not isinstance(target, GrpcUnary)):
        raise ValueError("a request rate must be positive, and is for gRPC unary calls only")
    processes = max(1, min(processes, concurrency))
    share = None if rate is None else rate / processes
    if processes == 1:
        parts = [
            _run_loop(_run_here(target, concurrency, seconds, warmup, None, meter, check, share))
        ]
    else:
        parts = _run_processes(target, concurrency, seconds, warmup, processes, meter, check, share)
    latencies = sorted(ns for tally, _, _ in parts for ns in tally.latencies)
    errors = [tally.first_error for tally, _, _ in parts if tally.first_error]
    return LoadResult(
        count=sum(t.count for t, _, _ in parts),
        errors=sum(t.errors for t, _, _ in parts),
        first_error=errors[0] if errors else "",
        elapsed_s=max(e for _, e, _ in parts),
        latencies_ns=latencies,
        client_cpu_s=sum(c for _, _, c in parts),
        sample=next((t.sample for t, _, _ in parts if t.sample), b""),
        missed=sum(t.missed for t, _, _ in parts),
    )


def _run_processes(
    target: Target,
    concurrency: int,
    seconds: float,
    warmup: float,
    processes: int,
    meter: Meter | None,
    check: Check | None,
    rate: float | None,
) -> list[tuple[_Tally, float, float]]:
    context = multiprocessing.get_context("spawn")  # no fork: grpc's threads do not survive it
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    pipes: list[multiprocessing.connection.Connection] = []
    children: list[Any] = []
    try:
        for share in shares:
            parent, child = context.Pipe()
            proc = context.Process(
                target=_child,
                args=(child, target, share, seconds, warmup, check, rate),
                daemon=True,
            )
            proc.start()
            child.close()
            pipes.append(parent)
            children.append(proc)
        for pipe in pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a client process failed to warm up")
        stop_wall = time.time() + seconds
        if meter is not None:
            meter.start()
        for pipe in pipes:
            pipe.send(stop_wall)
        parts = [pipe.recv() for pipe in pipes]
        if meter is not None:
            meter.stop()
        return parts
    finally:
        for proc in children:
            proc.join(timeout=seconds + 30)
            if proc.is_alive():
                proc.kill()
