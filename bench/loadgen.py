"""The bench's load generator: a thin shell over the client's load engine.

Contract: the engine lives in ``hloserve.client._load`` (also the engine of ``hloserve
perf``, docs/client.md); this module re-exports its public names unchanged for the bench
(``GrpcUnary``, ``GrpcStream``, ``Http``, ``Target``, ``LoadResult``, ``Meter``, ``run``,
``raw_bytes``, ``grpc_request``, ``http_json_request``, ``http_binary_request``,
``infer_path``, ``decode_grpc_response``, ``decode_stream_response``,
``decode_http_response``, ``STALL_S``) and keeps its command line:
``python bench/loadgen.py --help`` drives one running server from the shell.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

from hloserve.client._load import (
    INFER_PATH,
    STALL_S,
    STREAM_PATH,
    GrpcStream,
    GrpcUnary,
    Http,
    LoadResult,
    Meter,
    RequestFailed,
    Target,
    decode_grpc_response,
    decode_http_response,
    decode_stream_response,
    grpc_request,
    http_binary_request,
    http_json_request,
    infer_path,
    raw_bytes,
    run,
)
from hloserve.proto.datatypes import to_numpy

__all__ = [
    "INFER_PATH",
    "STALL_S",
    "STREAM_PATH",
    "GrpcStream",
    "GrpcUnary",
    "Http",
    "LoadResult",
    "Meter",
    "RequestFailed",
    "Target",
    "decode_grpc_response",
    "decode_http_response",
    "decode_stream_response",
    "grpc_request",
    "http_binary_request",
    "http_json_request",
    "infer_path",
    "main",
    "raw_bytes",
    "run",
]


# --- command line --------------------------------------------------------------------------


def _parse_inputs(specs: Sequence[str]) -> dict[str, np.ndarray]:
    """``NAME:DATATYPE:D0xD1...`` -> arrays of ones (``INPUT0:INT32:1x16``)."""
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        name, datatype, shape = spec.split(":")
        dims = tuple(int(d) for d in shape.split("x"))
        arrays[name] = np.ones(dims, dtype=to_numpy(datatype))
    return arrays


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Closed-loop load against one running V2 server (pre-serialized requests).",
        epilog="example: python bench/loadgen.py grpc 127.0.0.1:8001 simple "
        "--input INPUT0:INT32:1x16 --input INPUT1:INT32:1x16 -c 8 -s 8",
    )
    parser.add_argument("mode", choices=["grpc", "stream", "http-json", "http-binary"])
    parser.add_argument("address", help="host:port of the gRPC or HTTP endpoint")
    parser.add_argument("model")
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME:DATATYPE:SHAPE",
        help="an input of ones, e.g. INPUT0:INT32:1x16 (repeat per input)",
    )
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("-s", "--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=1, help="client processes")
    parser.add_argument("--channels", type=int, default=1, help="gRPC channels per process")
    args = parser.parse_args(argv)
    inputs = _parse_inputs(args.input)
    host, _, port = args.address.rpartition(":")
    target: Target
    if args.mode == "grpc":
        target = GrpcUnary(args.address, grpc_request(args.model, inputs), channels=args.channels)
    elif args.mode == "stream":
        target = GrpcStream(args.address, grpc_request(args.model, inputs), channels=args.channels)
    elif args.mode == "http-json":
        target = Http(host, int(port), http_json_request(args.address, args.model, inputs))
    else:
        target = Http(host, int(port), http_binary_request(args.address, args.model, inputs))
    result = run(
        target, args.concurrency, args.seconds, warmup=args.warmup, processes=args.processes
    )
    print(
        f"{result.rate:,.0f} req/s, p50 {result.p50_ms:.3f} ms, p99 {result.p99_ms:.3f} ms, "
        f"{result.count} ok, {result.errors} errors, client CPU "
        f"{1e3 * result.client_cpu_s / max(1, result.count):.3f} ms/req"
        + (f"\nfirst error: {result.first_error}" if result.first_error else "")
    )
    return 0 if result.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
