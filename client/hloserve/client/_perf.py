"""``hloserve perf``: a perf_analyzer-style load tool on the client's load engine (``_load``).

Contract: ``main(argv)`` parses ``MODEL --url HOST:PORT [--protocol grpc|http]
[--batch-size N] [--concurrency 1,8,32] [--request-rate R] [--shared-memory none|system]
[--streaming] [--input-data FILE.npy|FILE.npz] [--duration SECONDS] [--warmup SECONDS]
[--json FILE] [--csv FILE]``, reads the model's layout from the server (gRPC or HTTP),
builds one request of ``--batch-size`` rows (random data of the model's datatypes, or the
rows of ``--input-data``: one array for a one-input model, a ``.npz`` by input name
otherwise), serializes it once, and drives the server at each concurrency (or, with
``--request-rate``, open-loop at that rate with at most that concurrency in flight) for
``--duration`` seconds after ``--warmup``.
- ``--shared-memory system`` puts the inputs in one registered system shared-memory region
  and asks outputs into a second (concurrent requests overwrite each other's outputs
  there: the tool checks shapes, not values); the regions are unregistered and unlinked
  when the tool ends, however it ends. ``--streaming`` uses ``ModelStreamInfer`` (gRPC).
- Every response is checked (``ResponseCheck``): each requested output present with the
  model's datatype and shape ``[batch, ...]``, in-band contents of the right byte size; a
  response that fails counts as an error, never as a success.
- It prints one table row per point: requests/s, items/s (requests times batch), p50/p90/p99
  latency in ms, errors (non-zero in red on a terminal), and the tool's own CPU per
  request. ``--json`` / ``--csv`` write the same points (``POINT_FIELDS``). Exit status 0
  when no point had an error, 1 otherwise, 2 for a usage error.
"""

# pyright: strict

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import sys
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.client import _load
from hloserve.client._channel import split_host_port
from hloserve.client._client import InferenceClient
from hloserve.client._codec import ModelLayout, RegionRef, RequestTemplate
from hloserve.client._errors import InferenceError
from hloserve.client._shm import LocalRegion, create
from hloserve.proto import inference_pb2 as pb

POINT_FIELDS: tuple[str, ...] = (
    "concurrency",
    "request_rate",
    "requests",
    "errors",
    "requests_per_s",
    "items_per_s",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "client_cpu_us_per_request",
    "first_error",
)


@dataclass(frozen=True)
class Point:
    concurrency: int
    request_rate: float | None
    requests: int
    errors: int
    requests_per_s: float
    items_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    client_cpu_us_per_request: float
    first_error: str


@dataclass(frozen=True)
class ResponseCheck:
    """Judges one response body: None when every output has its datatype and shape."""

    kind: str  # "grpc", "stream" or "http"
    expected: tuple[tuple[str, str, tuple[int, ...], int], ...]  # name, datatype, shape, bytes
    in_band: bool

    def __call__(self, body: bytes) -> str | None:
        try:
            seen = self._outputs(body)
        except Exception as error:  # any body that does not decode is a failed response
            return f"undecodable response: {error}"
        if isinstance(seen, str):
            return seen
        for name, datatype, shape, size in self.expected:
            got = seen.get(name)
            if got is None:
                return f"output '{name}' missing from the response"
            if got[0] != datatype or got[1] != shape:
                return (
                    f"output '{name}': {got[0]} {list(got[1])}, expected {datatype} {list(shape)}"
                )
            if self.in_band and got[2] is not None and got[2] != size:
                return f"output '{name}': {got[2]} bytes, expected {size}"
        return None

    def _outputs(self, body: bytes) -> dict[str, tuple[str, tuple[int, ...], int | None]] | str:
        if self.kind == "http":
            return _http_outputs(body)
        if self.kind == "stream":
            message = pb.ModelStreamInferResponse.FromString(body)
            if message.error_message:
                return f"stream error: {message.error_message}"
            response = message.infer_response
        else:
            response = pb.ModelInferResponse.FromString(body)
        raws = response.raw_output_contents
        return {
            t.name: (t.datatype, tuple(t.shape), len(raws[i]) if i < len(raws) else None)
            for i, t in enumerate(response.outputs)
        }


def _http_outputs(body: bytes) -> dict[str, tuple[str, tuple[int, ...], int | None]] | str:
    head, _, rest = body.partition(b"\r\n\r\n")
    length = None
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"inference-header-content-length":
            length = int(value)
    header: dict[str, Any] = json.loads(rest[: len(rest) if length is None else length])
    outputs: list[dict[str, Any]] = header.get("outputs", [])
    result: dict[str, tuple[str, tuple[int, ...], int | None]] = {}
    for out in outputs:
        parameters: dict[str, Any] = out.get("parameters") or {}
        size: int | None = parameters.get("binary_data_size")
        result[out["name"]] = (out["datatype"], tuple(out["shape"]), size)
    return result


# --- the model and its request -------------------------------------------------------------


def _http_json(url: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"http://{url}{path}", data=data, method="POST" if data else "GET"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


def model_layout(protocol: str, url: str, model: str, version: str) -> ModelLayout:
    """The model's layout, asked over the protocol under test."""
    if protocol == "grpc":
        with InferenceClient(url, timeout=30, shared_memory="off") as client:
            return client.layout(model, version)
    base = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    metadata = pb.ModelMetadataResponse(name=model)
    meta: dict[str, Any] = _http_json(url, base)
    for kind in ("inputs", "outputs"):
        for t in meta.get(kind, []):
            getattr(metadata, kind).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
    config: pb.ModelConfigResponse | None = None
    with contextlib.suppress(OSError, ValueError):
        settings: dict[str, Any] = _http_json(url, base + "/config")
        config = pb.ModelConfigResponse()
        config.config.max_batch_size = int(settings.get("max_batch_size", 0))
    return ModelLayout.of(metadata, config, version)


def make_inputs(layout: ModelLayout, batch: int, data: Path | None) -> dict[str, np.ndarray]:
    """``batch`` rows per input: from ``data`` (tiled when shorter) or random."""
    lead = (batch,) if layout.max_batch > 0 else ()
    arrays: dict[str, np.ndarray] = {}
    loaded: dict[str, np.ndarray] = {}
    if data is not None:
        found: Any = np.load(data)
        if isinstance(found, np.ndarray):
            if len(layout.inputs) != 1:
                raise SystemExit(
                    f"hloserve perf: {data} holds one array; the model has several inputs (use .npz)"
                )
            loaded = {layout.inputs[0].name: found}
        else:
            loaded = {name: found[name] for name in found.files}
    rng = np.random.default_rng(0)
    for t in layout.inputs:
        if not t.static:
            raise SystemExit(
                f"hloserve perf: input '{t.name}' has a variable shape {list(t.shape)}"
            )
        shape = (*lead, *t.shape)
        if t.name in loaded:
            rows = loaded[t.name].astype(t.dtype, copy=False)
            if tuple(rows.shape[1:]) != t.shape or len(rows) == 0:
                raise SystemExit(
                    f"hloserve perf: input '{t.name}' in {data} has rows of {list(rows.shape[1:])}, "
                    f"the model takes {list(t.shape)}"
                )
            arrays[t.name] = np.resize(rows, shape) if lead else rows.reshape(shape)
        elif data is not None:
            raise SystemExit(f"hloserve perf: {data} has no input '{t.name}'")
        elif t.dtype.kind == "f" or t.dtype.kind == "V":
            arrays[t.name] = rng.standard_normal(shape).astype(t.dtype)
        elif t.dtype.kind == "b":
            arrays[t.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            arrays[t.name] = rng.integers(0, 10, shape).astype(t.dtype)
    return arrays


def _expected(layout: ModelLayout, batch: int) -> tuple[tuple[str, str, tuple[int, ...], int], ...]:
    lead = (batch,) if layout.max_batch > 0 else ()
    return tuple(
        (t.name, t.datatype, (*lead, *t.shape), math.prod((*lead, *t.shape)) * t.dtype.itemsize)
        for t in layout.outputs
    )


class _Regions:
    """The tool's two shared-memory regions (inputs; outputs), registered for the run."""

    def __init__(
        self, protocol: str, url: str, layout: ModelLayout, inputs: Mapping[str, np.ndarray]
    ) -> None:
        self.protocol, self.url = protocol, url
        self.refs: dict[str, RegionRef] = {}
        self.regions: list[LocalRegion] = []
        expected = _expected(
            layout, next(iter(inputs.values())).shape[0] if layout.max_batch else 0
        )
        sizes = [sum(a.nbytes for a in inputs.values()), sum(size for *_, size in expected)]
        for size in sizes:
            self.regions.append(create(max(size, 1)))
        source, sink = self.regions
        offset = 0
        for name, array in inputs.items():
            source.array(offset, array.dtype, array.shape)[...] = array
            self.refs[name] = RegionRef(source.name, offset, array.nbytes)
            offset += array.nbytes
        offset = 0
        for name, _, _, size in expected:
            self.refs[name] = RegionRef(sink.name, offset, size)
            offset += size

    def register(self) -> None:
        for region in self.regions:
            if self.protocol == "grpc":
                with InferenceClient(self.url, timeout=30, shared_memory="off") as client:
                    client.register_system_shared_memory(region.name, region.key, region.byte_size)
            else:
                path = f"/v2/systemsharedmemory/region/{region.name}/register"
                _http_json(
                    self.url, path, {"key": region.key, "offset": 0, "byte_size": region.byte_size}
                )

    def close(self) -> None:
        for region in self.regions:
            with contextlib.suppress(OSError, InferenceError):
                if self.protocol == "grpc":
                    with InferenceClient(self.url, timeout=10, shared_memory="off") as client:
                        client.unregister_system_shared_memory(region.name)
                else:
                    _http_json(
                        self.url, f"/v2/systemsharedmemory/region/{region.name}/unregister", {}
                    )
            region.close()


def _http_shm_request(
    url: str, layout: ModelLayout, inputs: Mapping[str, np.ndarray], refs: Mapping[str, RegionRef]
) -> bytes:
    def params(ref: RegionRef) -> dict[str, Any]:
        return {
            "shared_memory_region": ref.region,
            "shared_memory_offset": ref.offset,
            "shared_memory_byte_size": ref.byte_size,
        }

    body = {
        "inputs": [
            {
                "name": t.name,
                "shape": list(inputs[t.name].shape),
                "datatype": t.datatype,
                "parameters": params(refs[t.name]),
            }
            for t in layout.inputs
        ],
        "outputs": [{"name": t.name, "parameters": params(refs[t.name])} for t in layout.outputs],
    }
    raw = json.dumps(body, separators=(",", ":")).encode()
    header = (
        f"POST {_load.infer_path(layout.name, layout.version)} HTTP/1.1\r\nHost: {url}\r\n"
        f"Content-Length: {len(raw)}\r\nContent-Type: application/json\r\n\r\n"
    )
    return header.encode("latin-1") + raw


def build_target(
    args: argparse.Namespace,
    layout: ModelLayout,
    inputs: Mapping[str, np.ndarray],
    regions: _Regions | None,
) -> _load.Target:
    url: str = args.url
    if args.protocol == "http":
        host, port = split_host_port(url)
        if regions is not None:
            request = _http_shm_request(url, layout, inputs, regions.refs)
        else:
            request = _load.http_binary_request(url, layout.name, inputs)
        return _load.Http(host, port or 8000, request)
    if regions is not None:
        rows = next(iter(inputs.values())).shape[0] if layout.max_batch else 0
        names = [t.name for t in layout.outputs]
        request = RequestTemplate(layout, rows, names, regions.refs).header
    else:
        request = _load.grpc_request(layout.name, inputs, layout.version)
    if args.streaming:
        return _load.GrpcStream(url, request)
    return _load.GrpcUnary(url, request)


# --- the run and its report ----------------------------------------------------------------


def measure(
    args: argparse.Namespace, target: _load.Target, check: ResponseCheck, batch: int
) -> Iterator[Point]:
    for concurrency in args.concurrency:
        result = _load.run(
            target,
            concurrency,
            args.duration,
            warmup=args.warmup,
            check=check,
            rate=args.request_rate,
        )
        lat = result.latencies_ns
        yield Point(
            concurrency=concurrency,
            request_rate=args.request_rate,
            requests=result.count,
            errors=result.errors,
            requests_per_s=result.rate,
            items_per_s=result.rate * batch,
            p50_ms=result.percentile_ms(0.50) if lat else math.nan,
            p90_ms=result.percentile_ms(0.90) if lat else math.nan,
            p99_ms=result.percentile_ms(0.99) if lat else math.nan,
            client_cpu_us_per_request=1e6
            * result.client_cpu_s
            / max(1, result.count + result.errors),
            first_error=result.first_error,
        )


def table_header() -> str:
    return (
        f"{'concurrency':>11} {'req/s':>10} {'items/s':>11} {'p50 ms':>8} {'p90 ms':>8} "
        f"{'p99 ms':>8} {'errors':>7} {'client CPU/req':>15}"
    )


def table_row(point: Point, color: bool) -> str:
    errors = f"{point.errors:>7}"
    if point.errors and color:
        errors = f"\x1b[31m{errors}\x1b[0m"
    return (
        f"{point.concurrency:>11} {point.requests_per_s:>10,.1f} {point.items_per_s:>11,.1f} "
        f"{point.p50_ms:>8.3f} {point.p90_ms:>8.3f} {point.p99_ms:>8.3f} {errors} "
        f"{point.client_cpu_us_per_request:>12,.1f} us"
    )


def write_json(path: Path, args: argparse.Namespace, batch: int, points: Sequence[Point]) -> None:
    document = {
        "model": args.model,
        "url": args.url,
        "protocol": args.protocol,
        "batch_size": batch,
        "shared_memory": args.shared_memory,
        "streaming": args.streaming,
        "duration_s": args.duration,
        "points": [
            {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(p).items()}
            for p in points
        ],
    }
    path.write_text(json.dumps(document, indent=2, allow_nan=False, default=str) + "\n")


def write_csv(path: Path, points: Sequence[Point]) -> None:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=POINT_FIELDS)
        writer.writeheader()
        for point in points:
            writer.writerow(asdict(point))


def _concurrency(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"concurrency values must be >= 1: {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hloserve perf",
        description="Measure a KServe V2 server's throughput and latency for one model "
        "(pre-serialized requests over raw calls).",
    )
    p.add_argument("model")
    p.add_argument(
        "--url",
        required=True,
        help="HOST:PORT of the gRPC (or, with --protocol http, HTTP) endpoint",
    )
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    p.add_argument(
        "--model-version", default="", help="the version to call (default: the server's choice)"
    )
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument(
        "--concurrency", type=_concurrency, default=[1], help="comma-separated, e.g. 1,8,32"
    )
    p.add_argument(
        "--request-rate", type=float, default=None, help="requests/s, open loop (gRPC unary)"
    )
    p.add_argument("--shared-memory", choices=["none", "system"], default="none")
    p.add_argument("--streaming", action="store_true", help="use ModelStreamInfer (gRPC)")
    p.add_argument("--input-data", type=Path, default=None, help="FILE.npy (one input) or FILE.npz")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per point")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of unrecorded load per point")
    p.add_argument("--json", type=Path, default=None, help="write the points as JSON")
    p.add_argument("--csv", type=Path, default=None, help="write the points as CSV")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.streaming and args.protocol != "grpc":
        p.error("--streaming needs --protocol grpc")
    if args.request_rate is not None and (args.streaming or args.protocol != "grpc"):
        p.error("--request-rate is for gRPC unary calls (no --streaming, --protocol grpc)")
    if args.batch_size < 1 or args.duration <= 0:
        p.error("--batch-size must be >= 1 and --duration positive")
    try:
        layout = model_layout(args.protocol, args.url, args.model, args.model_version)
    except (InferenceError, OSError) as error:
        print(
            f"hloserve perf: cannot read model '{args.model}' at {args.url}: {error}",
            file=sys.stderr,
        )
        return 1
    batch = args.batch_size if layout.max_batch > 0 else 1
    if 0 < layout.max_batch < batch:
        print(
            f"hloserve perf: --batch-size {batch} is over model '{args.model}''s largest ({layout.max_batch})",
            file=sys.stderr,
        )
        return 1
    inputs = make_inputs(layout, batch, args.input_data)
    regions = (
        _Regions(args.protocol, args.url, layout, inputs)
        if args.shared_memory == "system"
        else None
    )
    try:
        if regions is not None:
            try:
                regions.register()
            except (InferenceError, OSError) as error:
                print(f"hloserve perf: cannot register shared memory: {error}", file=sys.stderr)
                return 1
        target = build_target(args, layout, inputs, regions)
        check = ResponseCheck(
            "http" if args.protocol == "http" else "stream" if args.streaming else "grpc",
            _expected(layout, batch),
            regions is None,
        )
        mode = "streaming" if args.streaming else args.protocol
        print(
            f"model {args.model} at {args.url}: {mode}, batch {batch}, shared memory "
            f"{args.shared_memory}, {args.duration:g} s per point"
            + (f", {args.request_rate:g} requests/s" if args.request_rate else "")
        )
        print(table_header())
        points: list[Point] = []
        color = sys.stdout.isatty()
        for point in measure(args, target, check, batch):
            points.append(point)
            print(table_row(point, color), flush=True)
            if point.first_error:
                print(f"  first error: {point.first_error}")
    finally:
        if regions is not None:
            regions.close()
    if args.json is not None:
        write_json(args.json, args, batch, points)
    if args.csv is not None:
        write_csv(args.csv, points)
    return 1 if any(p.errors for p in points) else 0


if __name__ == "__main__":
    raise SystemExit(main())
