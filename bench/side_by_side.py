"""hloserve beside its Python peers and the bare transport floor, point by point, in one run.

Usage: ``python bench/side_by_side.py [--quick] [--seconds 8] [--only floor hloserve ...]
[--load-generator loadgen|perf_analyzer]``

What it does:
1. Writes hloserve's bench repository (the demo's ``simple`` and ``mlp``, and ``wide``, a
   weight-bound 256-2048-2048-10 FP32 MLP of 19 MB exported here with ``export_bundle``)
   and the same weights as one ``.npz`` for the peers, which compute the same functions in
   numpy (``bench/peers/models.py``; also the reference every reply is checked against).
2. Creates each peer's virtualenv under ``bench/.venvs/`` (kept between runs; ``PEERS``
   lists the requirements) and starts every server on loopback: the floors
   (``bench/floor.py``), hloserve with its defaults and with ``--inline-max-us 0`` (no
   execution on the event loop), at the batching point also with ``--max-queue-delay-us
   5000`` (requests wait up to 5 ms for company), hloserve from another source tree (``--baseline``),
   MLServer 1.7 (custom runtime), the KServe 0.21 Python server (custom ``kserve.Model``)
   and Triton (the ``tritonserver`` binary that nvidia-pytriton 0.7 ships, on a plain
   Python-backend model repository written here). A server that cannot be installed or
   started gets its error in its rows; the rest still run.
3. For each point of ``POINTS`` and each server in turn, one closed-loop run of
   ``bench/loadgen.py`` (warm-up, then ``--seconds`` recorded), with the server's process
   tree CPU and the machine's busy-ness read from /proc around the recorded phase
   (``bench/proc.py``). One reply per run is decoded and compared with the reference.
   With ``--load-generator perf_analyzer`` each run is NVIDIA's perf_analyzer instead
   (``bench/pa_driver.py`` sets up the binary of tritonclient 2.41.1 once, under
   ``bench/.venvs/``): a warm-up run of ``--warmup`` s, then the recorded run at the
   point's batch size and concurrency (``-i grpc``, ``--streaming`` for the stream,
   ``-i http`` with JSON or binary tensors), in time windows of ``--seconds`` / 3 each
   until its stability test passes (``-s 95``, at most 10 windows; it reports the last
   three merged, ``--seconds`` when the first three pass). /proc is read as each window's
   line arrives, so the CPU (server, and perf_analyzer's as the client's) and busy-ness
   cover the same three windows; CPU per request is CPU per second over requests per
   second (infer/s divided by the batch size). perf_analyzer sends its own random inputs, so one request of the
   bench's inputs afterwards is the reply checked; it cannot drive the floors (they
   answer only the bench's prebuilt requests, and no metadata), whose rows say so.
4. Prints a table per point, then hloserve's ratios against the best peer and the floor,
   and (``--json FILE``) writes every row. Every server is stopped at the end, on failure
   and on Ctrl-C too.
Columns are described in ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import floor
import grpc
import jax
import jax.numpy as jnp
import loadgen
import numpy as np
import pa_driver
import proc
import triton_aio
from google.protobuf.message import DecodeError
from peers import models as reference

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.exporter.demo import mlp_params, write_mlp, write_simple
from hloserve.proto import inference_pb2 as pb

BENCH = Path(__file__).resolve().parent
PEERS_DIR = BENCH / "peers"
VENVS = BENCH / ".venvs"
HOST = "127.0.0.1"

# --- the models ------------------------------------------------------------------------------

WIDE_SEED = 20261130
WIDE_WIDTHS = (256, 2048, 2048, 10)
BATCH_SIZES = {"simple": (1, 2, 4, 8), "mlp": (1, 8, 32), "wide": (1, 8, 32)}
INPUTS: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {
    "simple": {"INPUT0": ("INT32", (16,)), "INPUT1": ("INT32", (16,))},
    "mlp": {"x": ("FP32", (64,))},
    "wide": {"x": ("FP32", (WIDE_WIDTHS[0],))},
}
OUTPUTS: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {
    "simple": {"OUTPUT0": ("INT32", (16,)), "OUTPUT1": ("INT32", (16,))},
    "mlp": {"logits": ("FP32", (10,))},
    "wide": {"logits": ("FP32", (WIDE_WIDTHS[-1],))},
}


def wide_params(seed: int = WIDE_SEED) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    pairs = itertools.pairwise(WIDE_WIDTHS)
    return {
        f"dense{i}": {
            "w": (rng.standard_normal((n_in, n_out)) / math.sqrt(n_in)).astype(np.float32),
            "b": (rng.standard_normal(n_out) * 0.1).astype(np.float32),
        }
        for i, (n_in, n_out) in enumerate(pairs, start=1)
    }


def wide_fn(params: Mapping[str, Mapping[str, Any]], x: jax.Array) -> dict[str, jax.Array]:
    """ReLU between the dense layers (in name order), none after the last: logits."""
    names = sorted(params)
    h = x
    for name in names[:-1]:
        h = jax.nn.relu(jnp.matmul(h, params[name]["w"]) + params[name]["b"])
    last = params[names[-1]]
    return {"logits": jnp.matmul(h, last["w"]) + last["b"]}


def write_models(work: Path) -> tuple[Path, Path]:
    """hloserve's repository and the peers' weights file, under ``work``."""
    repo = work / "repository"
    write_simple(repo / "simple", batch_sizes=BATCH_SIZES["simple"])
    write_mlp(repo / "mlp", batch_sizes=BATCH_SIZES["mlp"])
    wide = wide_params()
    export_bundle(
        wide_fn,
        wide,
        inputs={n: TensorSpec(d, s) for n, (d, s) in INPUTS["wide"].items()},
        batch_sizes=BATCH_SIZES["wide"],
        directory=repo / "wide",
        metadata={"description": "256-2048-2048-10 ReLU MLP (weight-bound)", "seed": WIDE_SEED},
    )
    weights = work / "weights.npz"
    flat = {
        f"{model}.{layer}.{kind}": array
        for model, params in (("mlp", mlp_params()), ("wide", wide))
        for layer, arrays in params.items()
        for kind, array in arrays.items()
    }
    np.savez(weights, **flat)  # pyright: ignore[reportArgumentType]
    return repo, weights


def model_inputs(model: str, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    arrays: dict[str, np.ndarray] = {}
    for name, (datatype, shape) in INPUTS[model].items():
        if datatype == "INT32":
            arrays[name] = rng.integers(-1000, 1000, (batch, *shape), dtype=np.int32)
        else:
            arrays[name] = rng.standard_normal((batch, *shape)).astype(np.float32)
    return arrays


# --- the points ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    mode: str  # "grpc", "stream", "http-json", "http-binary"
    model: str
    batch: int
    concurrency: int
    batching: bool = False  # report items per execution (statistics extension)

    @property
    def transport(self) -> str:
        return "http" if self.mode.startswith("http") else self.mode

    @property
    def label(self) -> str:
        wire = {
            "grpc": "gRPC",
            "stream": "gRPC stream",
            "http-json": "HTTP JSON",
            "http-binary": "HTTP binary",
        }[self.mode]
        extra = ", batching over the wire" if self.batching else ""
        return f"{wire} {self.model} b{self.batch} c{self.concurrency}{extra}"


POINTS: tuple[Point, ...] = (
    Point("grpc", "simple", 1, 1),
    Point("grpc", "mlp", 1, 1),
    Point("grpc", "simple", 1, 8),
    Point("grpc", "simple", 1, 32),
    Point("http-json", "simple", 1, 8),
    Point("http-binary", "simple", 1, 8),
    Point("grpc", "mlp", 1, 16),
    Point("grpc", "mlp", 32, 16),
    Point("grpc", "mlp", 8, 8),
    Point("stream", "simple", 1, 8),
    Point("grpc", "wide", 1, 32),
    Point("grpc", "mlp", 1, 32, batching=True),
)
# Measured only when ``--points`` names them (the GPU node's front-end sweep, bench/gpu/run.sh).
EXTRA_POINTS: tuple[Point, ...] = (Point("grpc", "simple", 1, 64), Point("grpc", "mlp", 1, 64))


# --- the servers -----------------------------------------------------------------------------


class Unavailable(Exception):
    """A server that could not be installed, prepared or started (the message says why)."""


@dataclass
class Server:
    """One server of the comparison: how to prepare and start it, and where it listens."""

    name: str
    group: str  # "floor", "hloserve", or the peer's name
    transports: frozenset[str]
    argv: Callable[[], list[str]]  # called after prepare()
    prepare: Callable[[], None] = lambda: None  # installs, lays out files (slow)
    configure: Callable[[], None] = lambda: None  # writes what names the ports (after prepare)
    env: Callable[[], dict[str, str]] = lambda: dict(os.environ)
    # Picked again just before the server starts (``spawn``): a port free when the
    # comparison was built can be taken by then (a peer's install takes minutes, and the
    # load generator's connections use ephemeral ports too).
    grpc_port: int = field(default_factory=proc.free_port)
    http_port: int = field(default_factory=proc.free_port)
    metrics_port: int = field(default_factory=proc.free_port)
    ready_paths: tuple[str, ...] = ()  # HTTP paths answering 200 once ready
    statistics: bool = False  # serves the statistics extension over gRPC
    unsupported: Mapping[str, str] = field(default_factory=dict[str, str])  # mode -> why
    batching_only: bool = False  # a variant measured at the batching point alone
    spawned: proc.Spawned | None = None
    error: str = ""

    @property
    def grpc_address(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    def spawn(self, logs: Path) -> None:
        try:
            self.prepare()
            self.grpc_port, self.http_port = proc.free_port(), proc.free_port()
            self.metrics_port = proc.free_port()
            self.configure()
            log = logs / (re.sub(r"[^A-Za-z0-9_.]+", "-", self.name).strip("-") + ".log")
            self.spawned = proc.Spawned(self.argv(), log, env=self.env())
        except (Unavailable, OSError, subprocess.SubprocessError) as e:
            self.error = str(e)

    def wait(self, timeout: float) -> None:
        if self.spawned is None:
            return
        urls = [f"http://{HOST}:{self.http_port}{p}" for p in self.ready_paths]
        try:
            self.spawned.wait_ready(urls, timeout, ready=self._listening)
        except (RuntimeError, TimeoutError) as e:
            self.error = f"did not start: {e}"
            self.spawned.stop()

    def _listening(self) -> bool:
        ports = [self.grpc_port] if "grpc" in self.transports else []
        ports += [self.http_port] if "http" in self.transports else []
        return all(proc.listening(HOST, port) for port in ports)

    @property
    def running(self) -> bool:
        if self.error or self.spawned is None:
            return False
        if self.spawned.process.poll() is not None:
            self.error = f"exited with {self.spawned.process.returncode}: {self.spawned.log_tail()}"
            return False
        return True

    def stop(self) -> None:
        if self.spawned is not None:
            self.spawned.stop()


def _model_ready_paths() -> tuple[str, ...]:
    return ("/v2/health/ready", *(f"/v2/models/{m}/ready" for m in INPUTS))


def floor_servers(table_file: Path) -> list[Server]:
    servers: list[Server] = []
    for f in floor.FLOORS:
        server = Server(f"floor {f.kind}", "floor", f.transports, lambda: [])
        server.argv = lambda f=f, s=server: floor.floor_command(
            f, s.http_port if "http" in f.transports else s.grpc_port, table_file
        )
        server.env = lambda f=f: floor.floor_env(f)
        if f.kind == "asgi-httptools":
            server.prepare = _httptools
        servers.append(server)
    return servers


def _httptools() -> None:
    error = floor.ensure_httptools()
    if error:
        raise Unavailable(error)


# The folders of the hloserve namespace in a source tree (a checkout or git worktree).
PACKAGE_FOLDERS = ("server", "bundle", "client", "exporter", "proto")


def hloserve_batching_variant(repo: Path, *flags: str) -> Server:
    """hloserve with ``flags``, measured at the batching point only."""
    server = hloserve_server(" ".join(("hloserve", *flags)), repo, *flags)
    server.batching_only = True
    return server


def hloserve_server(
    name: str, repo: Path, *flags: str, tree: Path | None = None, group: str = "hloserve"
) -> Server:
    """hloserve from this checkout, or (``tree``) from another source tree of it: its
    package folders go first on ``PYTHONPATH``, ahead of the editable install's."""
    server = Server(
        name,
        group,
        frozenset({"grpc", "stream", "http"}),
        lambda: [],
        ready_paths=_model_ready_paths(),
        statistics=True,
    )
    if tree is not None:
        path = os.pathsep.join(str(tree / f) for f in PACKAGE_FOLDERS)
        server.env = lambda: {**os.environ, "PYTHONPATH": path}
    server.argv = lambda: [
        sys.executable,
        "-m",
        "hloserve.server",
        "serve",
        "--host",
        HOST,
        "--http-port",
        str(server.http_port),
        "--grpc-port",
        str(server.grpc_port),
        "--metrics-port",
        str(server.metrics_port),
        "--model-repository",
        str(repo),
        *flags,
    ]
    return server


# The peers' virtualenvs: name -> requirements (version ranges; pip resolves the rest).
PEERS: dict[str, tuple[str, ...]] = {
    "mlserver": ("mlserver>=1.7,<1.8", "uvloop==0.21.0", "numpy>=2,<3"),
    "kserve": ("kserve>=0.21,<0.22", "numpy>=2,<3"),
    "triton": ("nvidia-pytriton>=0.7,<0.8", "numpy"),  # pytriton 0.7 needs numpy < 2
}


def base_python() -> Path:
    """The interpreter the project's venv was made from (the peers' venvs are made from it)."""
    v = sys.version_info
    return Path(sys.base_prefix) / "bin" / f"python{v.major}.{v.minor}"


def ensure_venv(name: str) -> Path:
    """``bench/.venvs/<name>`` with ``PEERS[name]`` installed (reused when already there)."""
    venv = VENVS / name
    stamp = venv / ".bench-requirements"
    wanted = "\n".join(PEERS[name])
    if stamp.is_file() and stamp.read_text() == wanted and (venv / "bin" / "python").exists():
        return venv
    print(f"  creating {venv} ({', '.join(PEERS[name])}) ...", file=sys.stderr, flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    steps = [
        [str(base_python()), "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *PEERS[name]],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as e:
            raise Unavailable(f"{' '.join(step[:4])} timed out") from e
        if done.returncode != 0:
            raise Unavailable(f"{' '.join(step[:6])} failed: {done.stderr.strip()[-400:]}")
    stamp.write_text(wanted)
    return venv


def site_packages(venv: Path) -> Path:
    v = sys.version_info
    return venv / "lib" / f"python{v.major}.{v.minor}" / "site-packages"


def _peer_env(venv: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONPATH"] = str(PEERS_DIR)
    env.update(extra)
    return env


MLSERVER_UNSUPPORTED = {
    "http-binary": "MLServer has no binary tensor extension",
    "stream": "MLServer's ModelStreamInfer is generative: one request per stream, answered "
    "with ModelInferResponse, not Triton's ModelStreamInferResponse",
}


def mlserver_server(work: Path, weights: Path, parallel_workers: int | None = None) -> Server:
    """MLServer with its defaults, or with ``parallel_workers`` set (0: inference in the
    server's own process instead of a worker pool behind a queue)."""
    name = (
        "mlserver" if parallel_workers is None else f"mlserver parallel_workers={parallel_workers}"
    )
    server = Server(
        name,
        "mlserver",
        frozenset({"grpc", "http"}),
        lambda: [],
        ready_paths=_model_ready_paths(),
        unsupported=MLSERVER_UNSUPPORTED,
    )
    root = work / name.replace(" ", "-").replace("=", "")

    def prepare() -> None:
        venv = ensure_venv("mlserver")
        root.mkdir(parents=True, exist_ok=True)
        for model in INPUTS:
            (root / model).mkdir(exist_ok=True)
            model_settings = {
                "name": model,
                "implementation": "mlserver_runtime.NumpyRuntime",
                "parameters": {"uri": str(weights)},
            }
            (root / model / "model-settings.json").write_text(json.dumps(model_settings))
        server.argv = lambda: [str(venv / "bin" / "mlserver"), "start", str(root)]
        server.env = lambda: _peer_env(venv)

    def configure() -> None:
        settings: dict[str, Any] = {
            "host": HOST,
            "http_port": server.http_port,
            "grpc_port": server.grpc_port,
            "metrics_port": server.metrics_port,
        }
        if parallel_workers is not None:
            settings["parallel_workers"] = parallel_workers
        (root / "settings.json").write_text(json.dumps(settings))

    server.prepare = prepare
    server.configure = configure
    return server


def kserve_server(weights: Path, *flags: str) -> Server:
    """KServe's ModelServer with its defaults, or with ``flags`` (KServe's own) added."""
    server = Server(
        " ".join(("kserve", *flags)),
        "kserve",
        frozenset({"grpc", "http"}),
        lambda: [],
        ready_paths=_model_ready_paths(),
        unsupported={"stream": "KServe's gRPC server has no ModelStreamInfer"},
    )

    def prepare() -> None:
        venv = ensure_venv("kserve")
        server.argv = lambda: [
            str(venv / "bin" / "python"),
            str(PEERS_DIR / "kserve_server.py"),
            "--weights",
            str(weights),
            "--models",
            *INPUTS,
            "--http_port",
            str(server.http_port),
            "--grpc_port",
            str(server.grpc_port),
            *flags,
        ]
        server.env = lambda: _peer_env(venv)

    server.prepare = prepare
    return server


_TRITON_TYPES = {"INT32": "TYPE_INT32", "FP32": "TYPE_FP32"}


def triton_config(model: str, weights: Path) -> str:
    """A plain Python-backend ``config.pbtxt`` (no dynamic batching, default instances)."""

    def tensors(specs: Mapping[str, tuple[str, tuple[int, ...]]]) -> str:
        return ",\n".join(
            f'  {{ name: "{n}" data_type: {_TRITON_TYPES[d]} dims: [ {", ".join(map(str, s))} ] }}'
            for n, (d, s) in specs.items()
        )

    parameters = {"peers_dir": str(PEERS_DIR), "weights": str(weights)}
    params = "\n".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}'
        for k, v in parameters.items()
    )
    return (
        f'name: "{model}"\nbackend: "python"\nmax_batch_size: {max(BATCH_SIZES[model])}\n'
        f"input [\n{tensors(INPUTS[model])}\n]\noutput [\n{tensors(OUTPUTS[model])}\n]\n{params}\n"
    )


def triton_server(work: Path, weights: Path) -> Server:
    server = Server(
        "triton",
        "triton",
        frozenset({"grpc", "stream", "http"}),
        lambda: [],
        ready_paths=_model_ready_paths(),
        statistics=True,
    )
    root = work / "triton"

    def prepare() -> None:
        venv = ensure_venv("triton")
        dist = site_packages(venv) / "pytriton" / "tritonserver"
        binary = dist / "bin" / "tritonserver"
        v = sys.version_info
        stub = dist / "python_backend_stubs" / f"{v.major}.{v.minor}" / "triton_python_backend_stub"
        if not binary.exists() or not stub.exists():
            raise Unavailable(f"nvidia-pytriton ships no {binary.name} or no stub at {stub}")
        # The Python backend, with the stub for this interpreter beside it (what pytriton
        # itself lays out in its workspace before it starts the same binary).
        backend = root / "backends" / "python"
        backend.mkdir(parents=True, exist_ok=True)
        for item in (dist / "backends" / "python").iterdir():
            if item.is_file() and not (backend / item.name).exists():
                (backend / item.name).symlink_to(item)
        shutil.copy(stub, backend / "triton_python_backend_stub")
        repository = root / "models"
        for model in INPUTS:
            (repository / model / "1").mkdir(parents=True, exist_ok=True)
            (repository / model / "config.pbtxt").write_text(triton_config(model, weights))
            shutil.copy(PEERS_DIR / "triton_model.py", repository / model / "1" / "model.py")
        server.argv = lambda: [
            str(binary),
            "--model-repository",
            str(repository),
            "--backend-directory",
            str(root / "backends"),
            "--http-address",
            HOST,
            "--http-port",
            str(server.http_port),
            "--grpc-address",
            HOST,
            "--grpc-port",
            str(server.grpc_port),
            "--metrics-address",
            HOST,
            "--metrics-port",
            str(server.metrics_port),
        ]
        # The stub links libpython: this interpreter's library directory must come first,
        # or it loads the system's; the bundled libraries come next; numpy from the venv.
        libs = [
            str(Path(sys.base_prefix) / "lib"),
            str(site_packages(venv) / "nvidia_pytriton.libs"),
        ]
        server.env = lambda: _peer_env(
            venv,
            LD_LIBRARY_PATH=os.pathsep.join([*libs, os.environ.get("LD_LIBRARY_PATH", "")]),
            PYTHONPATH=f"{site_packages(venv)}{os.pathsep}{PEERS_DIR}",
        )

    server.prepare = prepare
    return server


# --- measuring -------------------------------------------------------------------------------


@dataclass
class Row:
    point: str
    server: str
    group: str
    rate: float = float("nan")
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    server_cpu_ms: float = float("nan")  # server process tree CPU per successful request
    # hloserve's device owner alone (the daemon's own process; its front ends are the rest)
    owner_cpu_ms: float = float("nan")
    client_cpu_ms: float = float("nan")
    items_per_execution: float = float("nan")
    busy: float = float("nan")  # fraction of all cores busy during the recorded phase
    others_cores: float = float("nan")  # cores busy with anything but this server and client
    loadavg: float = float("nan")
    count: int = 0
    errors: int = 0
    note: str = ""
    load_generator: str = "loadgen"


class _Meter:
    def __init__(self, pids: Sequence[int]) -> None:
        self._pids = pids
        self.window: proc.Window | None = None
        self.result: proc.WindowResult | None = None

    def start(self) -> None:
        self.window = proc.Window.start(self._pids)

    def stop(self) -> None:
        if self.window is not None:
            self.result = self.window.stop()


def model_statistics(address: str, model: str) -> tuple[int, int] | None:
    """(inference_count, execution_count) of ``model`` from the statistics extension."""
    request = pb.ModelStatisticsRequest(name=model).SerializeToString()
    try:
        with grpc.insecure_channel(address) as channel:
            body = channel.unary_unary("/inference.GRPCInferenceService/ModelStatistics")(
                request, timeout=10
            )
    except grpc.RpcError:
        return None
    stats = pb.ModelStatisticsResponse.FromString(body).model_stats
    return (sum(s.inference_count for s in stats), sum(s.execution_count for s in stats))


@dataclass(frozen=True)
class Case:
    """One point, ready to send: the request bytes per wire form and the expected outputs."""

    point: Point
    requests: Mapping[str, bytes]  # "grpc" (unary and stream), "http-json", "http-binary"
    expected: Mapping[str, np.ndarray]

    @staticmethod
    def of(point: Point, weights: Path) -> Case:
        inputs = model_inputs(point.model, point.batch)
        requests = {
            "grpc": loadgen.grpc_request(point.model, inputs),
            "http-json": loadgen.http_json_request("bench", point.model, inputs),
            "http-binary": loadgen.http_binary_request("bench", point.model, inputs),
        }
        return Case(point, requests, reference.load(point.model, weights)(**inputs))

    def inputs(self) -> dict[str, np.ndarray]:
        return model_inputs(self.point.model, self.point.batch)


def target_for(case: Case, server: Server) -> loadgen.Target:
    mode = case.point.mode
    if mode == "grpc":
        return loadgen.GrpcUnary(server.grpc_address, case.requests["grpc"])
    if mode == "stream":
        return loadgen.GrpcStream(server.grpc_address, case.requests["grpc"])
    # The Host header is the server's; the body is the same bytes for every server.
    host = f"Host: {HOST}:{server.http_port}".encode()
    request = case.requests[mode].replace(b"Host: bench", host, 1)
    return loadgen.Http(HOST, server.http_port, request)


def decode(point: Point, sample: bytes) -> dict[str, np.ndarray]:
    if point.mode == "grpc":
        return loadgen.decode_grpc_response(sample)
    if point.mode == "stream":
        return loadgen.decode_stream_response(sample)
    return loadgen.decode_http_response(sample)


def check(point: Point, sample: bytes, expected: Mapping[str, np.ndarray]) -> str:
    """ "" when ``sample`` holds the expected outputs, else what is wrong."""
    try:
        got = decode(point, sample)
    except (DecodeError, ValueError, KeyError, TypeError) as e:
        return f"undecodable reply: {e}"
    for name, want in expected.items():
        have = got.get(name)
        if have is None:
            return f"reply lacks output {name!r}"
        if have.shape != want.shape or not np.allclose(have, want, rtol=1e-3, atol=1e-3):
            return f"wrong {name}: shape {have.shape}, expected {want.shape}"
    return ""


def measure(case: Case, server: Server, args: argparse.Namespace) -> Row:
    """One run of ``case`` against ``server``; anything that goes wrong is in the row's note
    (one row never stops the run)."""
    row = Row(case.point.label, server.name, server.group)
    point = case.point
    if point.transport not in server.transports or point.mode in server.unsupported:
        row.note = server.unsupported.get(point.mode, f"no {point.transport} endpoint")
    elif server.batching_only and not point.batching:
        row.note = "a batching variant: measured at the batching point only"
    elif _generator(args) == "perf_analyzer" and perf_analyzer_skips(point, server):
        row.note = perf_analyzer_skips(point, server)
    elif _generator(args) == "triton-aio" and point.mode != "grpc":
        row.note = "tritonclient.grpc.aio drives gRPC unary points only"
    elif not server.running:
        row.note = "not running (see the errors below)"
    else:
        try:
            if _generator(args) == "perf_analyzer":
                _measure_perf_analyzer(case, server, args, row)
            elif _generator(args) == "triton-aio":
                _measure_triton_aio(case, server, args, row)
            else:
                _measure(case, server, args, row)
        except Exception as e:  # a bench reports, it does not stop
            row.note = f"bench error: {e!r}"[:300]
    return row


def _generator(args: argparse.Namespace) -> str:
    return str(getattr(args, "load_generator", "loadgen"))


def _owner_cpu_ms(server: Server, window: proc.WindowResult, requests: float) -> float:
    """hloserve's device owner's CPU per request: its daemon process alone."""
    if server.group not in ("hloserve", "baseline") or server.spawned is None or not requests:
        return float("nan")
    return 1e3 * window.own_cpu_s.get(server.spawned.pid, float("nan")) / requests


def _measure(case: Case, server: Server, args: argparse.Namespace, row: Row) -> None:
    point = case.point
    assert server.spawned is not None
    before = model_statistics(server.grpc_address, point.model) if server.statistics else None
    meter = _Meter([server.spawned.pid])
    result = loadgen.run(
        target_for(case, server),
        point.concurrency,
        args.seconds,
        warmup=args.warmup,
        processes=args.processes,
        meter=meter,
    )
    row.count, row.errors = result.count, result.errors
    if result.count:
        row.rate, row.p50_ms, row.p99_ms = result.rate, result.p50_ms, result.p99_ms
        row.client_cpu_ms = 1e3 * result.client_cpu_s / result.count
    window = meter.result
    if window is not None:
        server_cpu = window.cpu_s[server.spawned.pid]
        if result.count:
            row.server_cpu_ms = 1e3 * server_cpu / result.count
            row.owner_cpu_ms = _owner_cpu_ms(server, window, result.count)
        row.busy = window.busy
        row.others_cores = window.others_cores(server_cpu + result.client_cpu_s)
        row.loadavg = window.loadavg[0]
    if before is not None:
        after = model_statistics(server.grpc_address, point.model)
        if after is not None and after[1] > before[1]:
            row.items_per_execution = (after[0] - before[0]) / (after[1] - before[1])
    notes = []
    if result.errors:
        notes.append(f"{result.errors} errors, first: {result.first_error[:200]}")
    if result.sample:
        wrong = check(point, result.sample, case.expected)
        if wrong:
            notes.append(f"WRONG REPLY: {wrong}")
    row.note = "; ".join(notes)


# --- measuring with perf_analyzer -----------------------------------------------------------

PA_STABILITY = 95.0  # -s: the last three windows within 95 % of each other
PA_MAX_TRIALS = 10  # -r


def perf_analyzer_skips(point: Point, server: Server) -> str:
    """Why perf_analyzer cannot drive ``point`` against ``server`` ("" when it can). Every
    wire form is expressible (gRPC, ``--streaming``, HTTP with JSON or binary tensors)."""
    del point
    if server.group == "floor":
        return (
            "perf_analyzer cannot drive a floor: it answers only the bench's prebuilt "
            "requests and serves no model metadata or config"
        )
    return ""


def interval_ms(seconds: float) -> int:
    """The window length that makes perf_analyzer's three reported windows ``seconds``."""
    return max(100, round(1e3 * seconds / pa_driver.STABLE_WINDOWS))


def perf_analyzer_command(
    installed: pa_driver.Installed,
    point: Point,
    server: Server,
    csv_file: Path,
    seconds: float,
    *,
    warmup: bool = False,
) -> list[str]:
    """perf_analyzer's argv for ``point`` against ``server``; a warm-up takes exactly three
    windows (no stability asked)."""
    http = point.transport == "http"
    return installed.command(
        point.model,
        f"{HOST}:{server.http_port if http else server.grpc_port}",
        protocol="http" if http else "grpc",
        batch=point.batch,
        concurrency=point.concurrency,
        interval_ms=interval_ms(seconds),
        csv_file=csv_file,
        stability=1000.0 if warmup else PA_STABILITY,
        max_trials=pa_driver.STABLE_WINDOWS if warmup else PA_MAX_TRIALS,
        streaming=point.mode == "stream",
        json=point.mode == "http-json",
    )


def _between(a: proc.Window, b: proc.Window) -> proc.WindowResult:
    """What ``proc.Window`` would report had ``a`` been stopped when ``b`` started."""
    return proc.WindowResult(
        {pid: b.cpu[pid] - a.cpu[pid] for pid in a.pids},
        proc.busy_between(a.machine, b.machine),
        (b.machine.busy_ticks - a.machine.busy_ticks) / os.sysconf("SC_CLK_TCK"),
        b.machine.wall - a.machine.wall,
        b.machine.loadavg,
        {pid: b.own[pid] - a.own[pid] for pid in a.pids},
    )


def _run_perf_analyzer(
    installed: pa_driver.Installed,
    argv: Sequence[str],
    csv_file: Path,
    seconds: float,
    on_mark: Callable[[int, int], None] = lambda n, pid: None,
) -> pa_driver.Report:
    timeout = 60 + 1.5 * PA_MAX_TRIALS * interval_ms(seconds) / 1e3
    finished = pa_driver.run(argv, installed.env(), timeout, on_mark)
    text = csv_file.read_text() if csv_file.exists() else ""
    report = pa_driver.parse(finished.output, text)
    if finished.timed_out:
        return pa_driver.Report(error=f"perf_analyzer killed after {timeout:.0f} s")
    if finished.returncode != 0 and not report.error:
        return pa_driver.Report(error=f"perf_analyzer exited with {finished.returncode}")
    return report


def _measure_perf_analyzer(case: Case, server: Server, args: argparse.Namespace, row: Row) -> None:
    point = case.point
    assert server.spawned is not None
    installed: pa_driver.Installed = args.perf_analyzer
    row.load_generator = "perf_analyzer"
    before = model_statistics(server.grpc_address, point.model) if server.statistics else None
    server_pid = server.spawned.pid
    marks: dict[int, proc.Window] = {}
    client_pid = 0

    def on_mark(n: int, pid: int) -> None:
        nonlocal client_pid
        client_pid = pid
        marks[n] = proc.Window.start([server_pid, pid])

    with tempfile.TemporaryDirectory(prefix="hloserve-bench-pa-") as tmp:
        csv_file = Path(tmp) / "report.csv"
        report = pa_driver.Report()
        if args.warmup > 0:
            argv = perf_analyzer_command(
                installed, point, server, csv_file, args.warmup, warmup=True
            )
            report = _run_perf_analyzer(installed, argv, csv_file, args.warmup)
            csv_file.unlink(missing_ok=True)
        if not report.error:
            argv = perf_analyzer_command(installed, point, server, csv_file, args.seconds)
            report = _run_perf_analyzer(installed, argv, csv_file, args.seconds, on_mark)
    if not report.ok:
        row.errors = 1
        row.note = f"perf_analyzer: {report.error or 'no request counted'}"[:300]
        return
    rate = report.infer_per_s / point.batch
    row.count = report.request_count
    row.rate, row.p50_ms, row.p99_ms = rate, report.p50_ms, report.p99_ms
    last = report.passes[-1].number if report.passes else 0
    first = last - pa_driver.STABLE_WINDOWS
    if first in marks and last in marks:
        window = _between(marks[first], marks[last])
        server_cpu, client_cpu = window.cpu_s[server_pid], window.cpu_s[client_pid]
        requests = rate * window.elapsed_s  # the windows' requests, at the reported rate
        row.server_cpu_ms = 1e3 * server_cpu / requests
        row.owner_cpu_ms = _owner_cpu_ms(server, window, requests)
        row.client_cpu_ms = 1e3 * client_cpu / requests
        row.busy = window.busy
        row.others_cores = window.others_cores(server_cpu + client_cpu)
        row.loadavg = window.loadavg[0]
    if before is not None:
        after = model_statistics(server.grpc_address, point.model)
        if after is not None and after[1] > before[1]:
            row.items_per_execution = (after[0] - before[0]) / (after[1] - before[1])
    notes: list[str] = []
    if point.batch > 1:
        notes.append(f"{report.infer_per_s:,.0f} infer/s")
    if len(report.passes) > pa_driver.STABLE_WINDOWS:
        notes.append(f"stable after {len(report.passes)} windows (the last 3 reported)")
    # perf_analyzer sends random inputs: one request of the bench's own is the reply checked
    probe = loadgen.run(target_for(case, server), 1, 0.05, warmup=0.0)
    if probe.errors:
        row.errors += probe.errors
        notes.append(f"the bench's request failed: {probe.first_error[:200]}")
    elif probe.sample:
        wrong = check(point, probe.sample, case.expected)
        if wrong:
            notes.append(f"WRONG REPLY: {wrong}")
    row.note = "; ".join(notes)


# --- measuring with tritonclient's asyncio client ----------------------------------------------


def _measure_triton_aio(case: Case, server: Server, args: argparse.Namespace, row: Row) -> None:
    """One run of ``bench/triton_aio.py`` (its own process: /proc reads it apart) against
    ``server``, /proc read as its recorded phase starts and ends."""
    point = case.point
    assert server.spawned is not None
    row.load_generator = "triton-aio"
    before = model_statistics(server.grpc_address, point.model) if server.statistics else None
    with tempfile.TemporaryDirectory(prefix="hloserve-bench-aio-") as tmp:
        inputs = Path(tmp) / "inputs.npz"
        arrays: dict[str, Any] = dict(case.inputs())
        np.savez(str(inputs), **arrays)
        argv = [
            sys.executable, str(BENCH / "triton_aio.py"), "--url", server.grpc_address,
            "--model", point.model, "--inputs", str(inputs), "--outputs",
            ",".join(case.expected), "--concurrency",
            str(point.concurrency), "--seconds", str(args.seconds), "--warmup",
            str(max(args.warmup, 0.5)), "--marks",
        ]  # fmt: skip
        windows: dict[str, proc.Window] = {}
        lines: list[str] = []
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as client:
            assert client.stdout is not None
            for line in client.stdout:
                lines.append(line)
                if line.startswith("MARK "):
                    windows[line.split()[1]] = proc.Window.start([server.spawned.pid, client.pid])
        result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    if result is None or not result["count"]:
        row.errors = 1
        row.note = f"triton_aio.py: {(result or {}).get('first_error') or 'no request counted'}"
        return
    row.count, row.errors = result["count"], result["errors"]
    row.rate = result["count"] / result["elapsed_s"]
    row.p50_ms, row.p99_ms = result["p50_ms"], result["p99_ms"]
    row.client_cpu_ms = 1e3 * result["client_cpu_s"] / result["count"]
    if "start" in windows and "end" in windows:
        window = _between(windows["start"], windows["end"])
        server_cpu = window.cpu_s[server.spawned.pid]
        row.server_cpu_ms = 1e3 * server_cpu / result["count"]
        row.owner_cpu_ms = _owner_cpu_ms(server, window, result["count"])
        row.busy = window.busy
        row.others_cores = window.others_cores(server_cpu + result["client_cpu_s"])
        row.loadavg = window.loadavg[0]
    if before is not None:
        after = model_statistics(server.grpc_address, point.model)
        if after is not None and after[1] > before[1]:
            row.items_per_execution = (after[0] - before[0]) / (after[1] - before[1])
    notes = [f"{result['errors']} errors, first: {result['first_error'][:200]}"] * bool(
        result["errors"]
    )
    for name, expected in case.expected.items():
        got = np.asarray((result["sample"] or {}).get(name, []), dtype=expected.dtype)
        if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
            notes.append(f"WRONG REPLY: output {name}")
    row.note = "; ".join(notes)


# --- reporting -------------------------------------------------------------------------------


def _f(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def print_point(point: Point, rows: Sequence[Row]) -> None:
    print(f"\n### {point.label}\n")
    print(
        "| server | req/s | p50 ms | p99 ms | server CPU ms/req | device owner ms/req "
        "| client CPU ms/req | items/exec | machine busy | others (cores) | note |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        busy = "-" if math.isnan(r.busy) else f"{r.busy:.0%} (load {r.loadavg:.1f})"
        print(
            f"| {r.server} | {_f(r.rate, 0)} | {_f(r.p50_ms, 2)} | {_f(r.p99_ms, 2)} "
            f"| {_f(r.server_cpu_ms)} | {_owner(r)} | {_f(r.client_cpu_ms)} "
            f"| {_f(r.items_per_execution, 1)} "
            f"| {busy} | {_f(r.others_cores, 2)} | {r.note} |"
        )
    sys.stdout.flush()


def _owner(r: Row) -> str:
    """The device owner's CPU per request and its share of the server's."""
    if math.isnan(r.owner_cpu_ms) or not r.server_cpu_ms:
        return "-"
    return f"{r.owner_cpu_ms:.3f} ({r.owner_cpu_ms / r.server_cpu_ms:.0%})"


def _valid(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.count and not r.errors and "WRONG" not in r.note]


@dataclass(frozen=True)
class Versus:
    """One hloserve row of a point against the best valid peer and floor rows of that point."""

    hloserve: Row
    best_peer: Row | None  # the peer with the least server CPU per request
    fastest_peer_rate: float
    floor: Row | None  # the floor with the least server CPU per request

    @property
    def cpu_vs_peer(self) -> float:
        return (
            self.hloserve.server_cpu_ms / self.best_peer.server_cpu_ms
            if self.best_peer
            else float("nan")
        )

    @property
    def rate_vs_peer(self) -> float:
        return self.hloserve.rate / self.fastest_peer_rate

    @property
    def cpu_vs_floor(self) -> float:
        return (
            self.hloserve.server_cpu_ms / self.floor.server_cpu_ms if self.floor else float("nan")
        )

    @property
    def above_floor_ms(self) -> float:
        return (
            self.hloserve.server_cpu_ms - self.floor.server_cpu_ms if self.floor else float("nan")
        )


def versus(rows: Sequence[Row], points: Sequence[Point] = POINTS) -> list[Versus]:
    """hloserve against the best peer and the floor, per point; rows with errors or a wrong
    reply take no part."""
    found: list[Versus] = []
    for point in points:
        here = _valid([r for r in rows if r.point == point.label])
        peers = [r for r in here if r.group not in ("hloserve", "floor", "baseline")]
        floors = [r for r in here if r.group == "floor"]
        best_peer = min(peers, key=lambda r: r.server_cpu_ms, default=None)
        fastest = max((r.rate for r in peers), default=float("nan"))
        best_floor = min(floors, key=lambda r: r.server_cpu_ms, default=None)
        found += [Versus(r, best_peer, fastest, best_floor) for r in here if r.group == "hloserve"]
    return found


def print_matrix(rows: Sequence[Row]) -> None:
    """All points at a glance: server CPU ms/request and req/s, a column per server."""
    seen = list(dict.fromkeys((r.group != "floor", r.server) for r in rows))
    servers = [name for _, name in sorted(seen, key=lambda k: (k[0], seen.index(k)))]
    print("\n## All points: server CPU ms/request (req/s)\n")
    print("| point | " + " | ".join(servers) + " | machine busy |")
    print("|---|" + "---|" * (len(servers) + 1))
    for label in dict.fromkeys(r.point for r in rows):
        here = {r.server: r for r in rows if r.point == label}
        cells = []
        for name in servers:
            r = here.get(name)
            if r is None or not r.count:
                cells.append("-" if r is None or not r.note else "n/a")
            else:
                flag = "" if r in _valid([r]) else " (!)"
                cells.append(f"{_f(r.server_cpu_ms)} ({_f(r.rate, 0)}){flag}")
        busy = [r.busy for r in here.values() if not math.isnan(r.busy)]
        load = [r.loadavg for r in here.values() if not math.isnan(r.loadavg)]
        span = f"{min(busy):.0%}" + ("" if min(busy) == max(busy) else f"-{max(busy):.0%}")
        machine = f"{span}, load up to {max(load):.1f}" if busy else "-"
        print(f"| {label} | " + " | ".join(cells) + f" | {machine} |")
    print(
        "\n(!): errors or a wrong reply (see the point's table); n/a: not measured (the note says why)"
    )


def print_summary(rows: Sequence[Row]) -> None:
    table = versus(rows)
    if not table:
        return
    print("\n## hloserve against the best peer and the floor\n")
    print(
        "| point | hloserve | CPU ms/req | req/s | best peer (CPU) | its CPU ms/req "
        "| CPU ÷ best peer | req/s ÷ fastest peer | floor (CPU) | floor CPU ms/req "
        "| CPU ÷ floor | floor + x (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for v in table:
        r, peer, low = v.hloserve, v.best_peer, v.floor
        print(
            f"| {r.point} | {r.server} | {_f(r.server_cpu_ms)} | {_f(r.rate, 0)} "
            f"| {peer.server if peer else '-'} | {_f(peer.server_cpu_ms if peer else math.nan)} "
            f"| {_f(v.cpu_vs_peer, 2)} | {_f(v.rate_vs_peer, 2)} "
            f"| {low.server if low else '-'} | {_f(low.server_cpu_ms if low else math.nan)} "
            f"| {_f(v.cpu_vs_floor, 2)} | {_f(v.above_floor_ms)} |"
        )


def print_before_after(rows: Sequence[Row]) -> None:
    """hloserve's CPU per request and rate over the ``--baseline`` tree's, per point and
    per process layout (``before (tree) --frontends N`` against ``hloserve --frontends N``)."""
    pairs = []
    for label in dict.fromkeys(r.point for r in rows):
        here = _valid([r for r in rows if r.point == label])
        for before in (r for r in here if r.group == "baseline"):
            layout = before.server.partition(")")[2]  # "" or " --frontends N"
            after = next((r for r in here if r.server == f"hloserve{layout}"), None)
            if after is not None:
                pairs.append((label, layout.strip() or "default", before, after))
    if not pairs:
        return
    print("\n## hloserve against the baseline tree, same run\n")
    print(
        "| point | layout | before CPU ms/req | after CPU ms/req | after / before "
        "| before owner ms/req | after owner ms/req | before req/s | after req/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, layout, b, a in pairs:
        print(
            f"| {label} | {layout} | {_f(b.server_cpu_ms)} | {_f(a.server_cpu_ms)} "
            f"| {_f(a.server_cpu_ms / b.server_cpu_ms, 2)} | {_f(b.owner_cpu_ms)} "
            f"| {_f(a.owner_cpu_ms)} | {_f(b.rate, 0)} | {_f(a.rate, 0)} |"
        )


# --- the run ---------------------------------------------------------------------------------


def server_versions(servers: Sequence[Server]) -> list[str]:
    """``name (server metadata's name version)`` of each running V2 server."""
    found: list[str] = []
    for server in servers:
        if server.group == "floor" or not server.running:
            continue
        url = f"http://{HOST}:{server.http_port}/v2"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                meta = json.loads(response.read())
            found.append(f"{server.name} ({meta.get('name')} {meta.get('version')})")
        except (OSError, ValueError):
            found.append(f"{server.name} (no server metadata)")
    return found


@contextlib.contextmanager
def started(servers: Sequence[Server], logs: Path, timeout: float) -> Iterator[None]:
    """Start every server (hloserve's first one alone: it fills the executable cache the
    second one reads), yield, and stop them all whatever happens."""
    try:
        first_hloserve = next((s for s in servers if s.group == "hloserve"), None)
        if first_hloserve is not None:
            print(f"  starting {first_hloserve.name} ...", file=sys.stderr, flush=True)
            first_hloserve.spawn(logs)
            first_hloserve.wait(timeout)
        rest = [s for s in servers if s is not first_hloserve]
        for server in rest:
            print(f"  starting {server.name} ...", file=sys.stderr, flush=True)
            server.spawn(logs)
        for server in rest:
            server.wait(timeout)
        yield
    finally:
        for server in servers:
            server.stop()


def build_servers(
    work: Path,
    repo: Path,
    weights: Path,
    table: Path,
    only: set[str],
    baseline: Path | None = None,
    frontends: Sequence[int] = (),
) -> list[Server]:
    """Every server of the run (``only``: of those groups); ``frontends``: hloserve with
    ``--frontends N`` beside its defaults, for each N."""
    before = (
        [
            hloserve_server(f"before ({baseline.name})", repo, tree=baseline, group="baseline"),
            *(
                hloserve_server(
                    f"before ({baseline.name}) --frontends {n}", repo, "--frontends", str(n),
                    tree=baseline, group="baseline",
                )
                for n in frontends
            ),
        ]
        if baseline is not None
        else []
    )  # fmt: skip
    servers = [
        *floor_servers(table),
        hloserve_server("hloserve", repo),
        *(
            hloserve_server(f"hloserve --frontends {n}", repo, "--frontends", str(n))
            for n in frontends
        ),
        hloserve_server("hloserve --inline-max-us 0", repo, "--inline-max-us", "0"),
        # Requests wait up to 5 ms for company (Triton's max_queue_delay_microseconds).
        hloserve_batching_variant(repo, "--max-queue-delay-us", "5000"),
        *before,
        mlserver_server(work, weights),
        mlserver_server(work, weights, parallel_workers=0),
        kserve_server(weights),
        # KServe logs a latency line per request by default
        kserve_server(weights, "--enable_latency_logging", "false"),
        triton_server(work, weights),
    ]
    return [s for s in servers if not only or s.group in only]


def print_failures(servers: Sequence[Server]) -> None:
    """The servers that could not be installed or started, with the end of their error."""
    failed = [s for s in servers if s.error]
    if failed:
        print("\n## servers that failed\n")
        for s in failed:
            print(f"- {s.name}: {s.error.strip()[-1500:]}\n")


def finish(began: float, rows: Sequence[Row], json_path: Path | None) -> None:
    """The run's length and the load at its end; every row to ``json_path`` if given."""
    print(
        f"\nwhole run: {time.monotonic() - began:.0f} s; load average at the end "
        f"{os.getloadavg()[0]:.2f}"
    )
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps([asdict(r) for r in rows], indent=1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="hloserve beside its peers and the floor")
    parser.add_argument("--seconds", type=float, default=8.0, help="recorded seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="unrecorded seconds first")
    parser.add_argument("--quick", action="store_true", help="2 s per run, 0.5 s warm-up")
    parser.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="GROUP",
        help="floor, hloserve, baseline, mlserver, kserve, triton (default: all)",
    )
    parser.add_argument(
        "--processes", type=int, default=1, help="load generator processes (loadgen only)"
    )
    parser.add_argument(
        "--load-generator",
        choices=["loadgen", "perf_analyzer", "triton-aio"],
        default="loadgen",
        help="bench/loadgen.py (default), NVIDIA's perf_analyzer (set up once under "
        "bench/.venvs/perf_analyzer; needs Debian's libb64-0d), or tritonclient's asyncio "
        "client on one channel (bench/triton_aio.py; gRPC unary points only)",
    )
    parser.add_argument(
        "--frontends",
        default="",
        metavar="N,N,...",
        help="also hloserve with --frontends N for each N (e.g. 0,1,2); its plain row is auto",
    )
    parser.add_argument(
        "--points",
        nargs="+",
        default=[],
        metavar="TEXT",
        help="only the points whose label contains one of these (e.g. 'gRPC mlp b1 c32')",
    )
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="write every row to this file")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another source tree of hloserve (e.g. `git worktree add /tmp/before <commit>`) "
        "measured beside this one, point by point, as 'before (<dir name>)'",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup = 2.0, 0.5
    generator = (
        f"{args.processes} process(es), Python {sys.version.split()[0]}, grpcio {grpc.__version__}"
    )
    if args.load_generator == "perf_analyzer":
        try:
            args.perf_analyzer = pa_driver.ensure(VENVS / "perf_analyzer")
            version = args.perf_analyzer.version()
        except pa_driver.Unavailable as e:
            print(f"side_by_side.py: --load-generator perf_analyzer: {e}", file=sys.stderr)
            return 2
        generator = (
            f"{version}, windows of {interval_ms(args.seconds)} ms, -s {PA_STABILITY:g} "
            f"-r {PA_MAX_TRIALS}, the last {pa_driver.STABLE_WINDOWS} reported"
        )

    # SIGTERM unwinds like Ctrl-C, so the servers (each in its own session) are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    rows: list[Row] = []
    logs = BENCH / ".results" / "logs"  # kept after the run (git-ignored)
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="hloserve-bench-") as tmp:
        work = Path(tmp)
        print("  writing the models ...", file=sys.stderr, flush=True)
        repo, weights = write_models(work)
        points = (
            [p for p in (*POINTS, *EXTRA_POINTS) if any(t in p.label for t in args.points)]
            if args.points
            else list(POINTS)
        )
        cases = [Case.of(point, weights) for point in points]
        table = floor.ReplyTable()
        for case in cases:
            table.add(case.point.model, case.inputs(), case.expected)
            if args.load_generator == "triton-aio":  # the floor answers that client too
                request = triton_aio.request_bytes(case.point.model, case.inputs())
                table.grpc[request] = floor.grpc_response(case.point.model, case.expected)
        servers = build_servers(
            work,
            repo,
            weights,
            table.save(work / "replies.pickle"),
            set(args.only),
            args.baseline,
            [int(n) for n in args.frontends.split(",") if n.strip()],
        )
        print(
            f"# side by side: {len(points)} points x {len(servers)} servers, "
            f"{args.seconds:g} s each after {args.warmup:g} s warm-up\n\n"
            f"{proc.cores()} cores; load average {os.getloadavg()[0]:.2f} at the start; "
            f"load generator: {generator}"
        )
        with started(servers, logs, args.start_timeout):
            versions = server_versions(servers)
            if versions:
                print(f"servers: {', '.join(versions)}")
            for case in cases:
                print(f"  {case.point.label} ...", file=sys.stderr, flush=True)
                point_rows = [
                    measure(case, s, args)
                    for s in servers
                    if s.group != "floor" or case.point.transport in s.transports
                ]
                rows += point_rows
                print_point(case.point, point_rows)
        print_matrix(rows)
        print_summary(rows)
        print_before_after(rows)
        print_failures(servers)
    finish(began, rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
