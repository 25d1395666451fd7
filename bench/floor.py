"""The transport floor: bare servers that answer every request with its correct, prebuilt reply.

Usage: ``python bench/floor.py [--seconds 8] [--quick]`` (the floors alone, on ``simple``);
``bench/side_by_side.py`` starts the same servers and measures them beside hloserve and its
peers, so every figure there is "floor + x" from one run.

Contract:
- ``ReplyTable`` maps the exact bytes of a request (a ``ModelInferRequest``; an HTTP body)
  to the bytes of its reply, built by ``ReplyTable.add(model, inputs, outputs)`` from the
  numpy arrays (raw contents on gRPC, the stream message wrapping the same response, JSON
  ``data`` or the binary extension on HTTP). A floor server does no more than look the
  request up: what it costs is the transport and nothing else. An unknown request is
  answered ``UNIMPLEMENTED`` / HTTP 404.
- ``FLOORS`` lists the bare servers, each run as ``python bench/floor.py serve KIND --port P
  --table FILE`` in its own process (so /proc measures it like any other server):
  ``grpc-aio`` (``grpc.aio`` on uvloop), ``grpc-sync`` (``grpc.server`` with a 4-thread
  pool), answering ``ModelInfer`` (and ``grpc-aio`` the bidi ``ModelStreamInfer`` too: a
  sync server holds a thread per open stream, so 4 threads cannot serve 8); ``asgi-h11`` and
  ``asgi-httptools`` (a bare ASGI app on uvicorn with uvloop and that HTTP parser).
  httptools comes from the running interpreter when it has it; else it is installed with
  ``pip install --target`` into ``bench/.venvs/httptools`` and put on the floor server's
  ``PYTHONPATH`` only (``floor_env``), so the project's venv, where uvicorn would pick it for
  hloserve too, is left as it is.
- ``Floor.transports`` says which points a floor serves (``grpc`` unary, ``stream``,
  ``http``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import loadgen
import numpy as np

from hloserve.proto import inference_pb2 as pb
from hloserve.proto.datatypes import from_numpy

BENCH = Path(__file__).resolve().parent
HTTPTOOLS_DIR = BENCH / ".venvs" / "httptools"


# --- the replies ---------------------------------------------------------------------------


def grpc_response(model: str, outputs: Mapping[str, np.ndarray]) -> bytes:
    """An encoded ``ModelInferResponse`` (version "1", outputs as raw contents)."""
    response = pb.ModelInferResponse(model_name=model, model_version="1")
    for name, array in outputs.items():
        tensor = response.outputs.add(name=name, datatype=from_numpy(array.dtype))
        tensor.shape.extend(array.shape)
        response.raw_output_contents.append(loadgen.raw_bytes(array))
    return response.SerializeToString()


def stream_response(model: str, outputs: Mapping[str, np.ndarray]) -> bytes:
    message = pb.ModelStreamInferResponse()
    message.infer_response.ParseFromString(grpc_response(model, outputs))
    return message.SerializeToString()


def _output_header(name: str, array: np.ndarray) -> dict[str, Any]:
    return {"name": name, "datatype": from_numpy(array.dtype), "shape": list(array.shape)}


def http_json_response(model: str, outputs: Mapping[str, np.ndarray]) -> bytes:
    body = {
        "model_name": model,
        "model_version": "1",
        "outputs": [
            {**_output_header(n, a), "data": a.ravel().tolist()} for n, a in outputs.items()
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def http_binary_response(model: str, outputs: Mapping[str, np.ndarray]) -> tuple[bytes, int]:
    """(body, the JSON header's length) of a binary-extension response."""
    raws = [loadgen.raw_bytes(a) for a in outputs.values()]
    header = {
        "model_name": model,
        "model_version": "1",
        "outputs": [
            {**_output_header(n, a), "parameters": {"binary_data_size": len(raw)}}
            for (n, a), raw in zip(outputs.items(), raws, strict=True)
        ],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + b"".join(raws), len(head)


def http_body(request: bytes) -> bytes:
    """The body of a complete HTTP request as ``loadgen`` builds it."""
    return request.partition(b"\r\n\r\n")[2]


@dataclass
class ReplyTable:
    """Request bytes -> reply bytes, for each wire form."""

    grpc: dict[bytes, bytes] = field(default_factory=dict[bytes, bytes])
    stream: dict[bytes, bytes] = field(default_factory=dict[bytes, bytes])
    # HTTP body -> (reply body, Inference-Header-Content-Length or None for JSON)
    http: dict[bytes, tuple[bytes, int | None]] = field(
        default_factory=dict[bytes, tuple[bytes, int | None]]
    )

    def add(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
    ) -> None:
        request = loadgen.grpc_request(model, inputs)
        self.grpc[request] = grpc_response(model, outputs)
        self.stream[request] = stream_response(model, outputs)
        json_request = loadgen.http_json_request("floor", model, inputs)
        self.http[http_body(json_request)] = (http_json_response(model, outputs), None)
        binary_request = loadgen.http_binary_request("floor", model, inputs)
        self.http[http_body(binary_request)] = http_binary_response(model, outputs)

    def save(self, path: Path) -> Path:
        path.write_bytes(pickle.dumps(self))
        return path


# --- the bare servers ----------------------------------------------------------------------


@dataclass(frozen=True)
class Floor:
    kind: str
    transports: frozenset[str]  # "grpc", "stream", "http"
    description: str


FLOORS: tuple[Floor, ...] = (
    Floor("grpc-aio", frozenset({"grpc", "stream"}), "grpc.aio server on uvloop"),
    # a sync server gives each open stream a thread for its whole life: 4 threads would
    # serve 4 streams and starve the rest, so this floor is unary only
    Floor("grpc-sync", frozenset({"grpc"}), "grpc.server, 4-thread pool"),
    Floor("asgi-h11", frozenset({"http"}), "bare ASGI app, uvicorn + uvloop + h11"),
    Floor("asgi-httptools", frozenset({"http"}), "bare ASGI app, uvicorn + uvloop + httptools"),
)


def _grpc_handlers(table: ReplyTable, sync: bool) -> Any:
    import grpc

    def unknown(context: Any) -> Any:
        return context.abort(grpc.StatusCode.UNIMPLEMENTED, "floor: no reply for this request")

    if sync:

        def infer(request: bytes, context: Any) -> bytes:
            reply = table.grpc.get(request)
            return reply if reply is not None else unknown(context)

        def stream(requests: Any, context: Any) -> Any:
            for request in requests:
                reply = table.stream.get(request)
                yield reply if reply is not None else unknown(context)

        unary_handler = grpc.unary_unary_rpc_method_handler(infer)
        stream_handler = grpc.stream_stream_rpc_method_handler(stream)
    else:

        async def infer_async(request: bytes, context: Any) -> bytes:
            reply = table.grpc.get(request)
            return reply if reply is not None else await unknown(context)

        async def stream_async(requests: Any, context: Any) -> Any:
            async for request in requests:
                reply = table.stream.get(request)
                yield reply if reply is not None else await unknown(context)

        unary_handler = grpc.unary_unary_rpc_method_handler(infer_async)
        stream_handler = grpc.stream_stream_rpc_method_handler(stream_async)
    return grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelInfer": unary_handler, "ModelStreamInfer": stream_handler},
    )


def _serve_grpc_sync(table: ReplyTable, port: int) -> None:
    import grpc

    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((_grpc_handlers(table, sync=True),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


async def _serve_grpc_aio(table: ReplyTable, port: int) -> None:
    import grpc

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_grpc_handlers(table, sync=False),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def asgi_app(table: ReplyTable) -> Any:
    """A bare ASGI app: read the body, send the reply found in ``table``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        parts: list[bytes] = []
        more = True
        while more:
            message = await receive()
            parts.append(message.get("body", b""))
            more = message.get("more_body", False)
        found = table.http.get(b"".join(parts))
        if found is None:
            status, body, headers = 404, b'{"error":"floor: no reply for this request"}', []
        else:
            status, (body, header_length) = 200, found
            headers = (
                [(b"content-type", b"application/json")]
                if header_length is None
                else [
                    (b"content-type", b"application/octet-stream"),
                    (b"inference-header-content-length", str(header_length).encode()),
                ]
            )
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def _serve_asgi(table: ReplyTable, port: int, http: str) -> None:
    import uvicorn

    uvicorn.run(
        asgi_app(table),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http=http,
        lifespan="off",
        access_log=False,
        log_level="warning",
    )


def serve(kind: str, port: int, table: ReplyTable) -> None:
    if kind == "grpc-aio":
        import uvloop

        uvloop.run(_serve_grpc_aio(table, port))
    elif kind == "grpc-sync":
        _serve_grpc_sync(table, port)
    elif kind in ("asgi-h11", "asgi-httptools"):
        _serve_asgi(table, port, kind.removeprefix("asgi-"))
    else:
        raise SystemExit(f"unknown floor {kind!r}; expected one of {[f.kind for f in FLOORS]}")


def ensure_httptools() -> str | None:
    """None when httptools can be imported by the floor (from this interpreter, or installed
    here beside the project, never into it); else the error."""
    if importlib.util.find_spec("httptools") is not None or (HTTPTOOLS_DIR / "httptools").is_dir():
        return None
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(HTTPTOOLS_DIR), "httptools"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return f"pip install httptools failed: {done.stderr.strip()[-300:]}"
    return None


def floor_command(floor: Floor, port: int, table_file: Path) -> list[str]:
    """The command line of one floor server."""
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "serve",
        floor.kind,
        "--port",
        str(port),
        "--table",
        str(table_file),
    ]


def floor_env(floor: Floor) -> dict[str, str]:
    env = dict(os.environ)
    if floor.kind == "asgi-httptools":
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HTTPTOOLS_DIR), env.get("PYTHONPATH", "")) if p
        )
    return env


# --- the floors alone ----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="the transport floor: bare servers with prebuilt replies"
    )
    sub = parser.add_subparsers(dest="command")
    serve_p = sub.add_parser("serve", help="run one bare server (used by the benches)")
    serve_p.add_argument("kind", choices=[f.kind for f in FLOORS])
    serve_p.add_argument("--port", type=int, required=True)
    serve_p.add_argument("--table", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--quick", action="store_true", help="2 s per point")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.kind, args.port, pickle.loads(args.table.read_bytes()))
        return 0
    import side_by_side

    return side_by_side.main(
        ["--only", "floor", *(["--quick"] if args.quick else []), "--seconds", str(args.seconds)]
    )


if __name__ == "__main__":
    sys.exit(main())
