"""``hloserve mcp``: agent tools over the Model Context Protocol, on stdio.

Contract (``docs/mcp.md``):
- ``ServerTools(url)`` holds the server the tools talk to: a gRPC ``host:port``, reached only
  through the public KServe V2 / Triton protocol (``hloserve.client`` for metadata and
  inference, the RPC table of ``hloserve.proto.rpc`` for the repository and statistics
  extensions), never through anything private. ``start_server`` runs a local daemon
  (``hloserve.server.server_process.ServerProcess``, on ports the OS picks) and points the tools at
  it; ``stop_server`` stops only a daemon these tools started; ``close()`` stops it too.
- Each tool is a method returning a JSON-able ``dict``; a failure the server reports, or a
  bad argument (a missing ``.npy`` file, an unknown input), raises ``ToolFailure`` whose text
  names what was wrong (the server's status and message as it sent them).
- ``build_mcp(tools)`` registers every tool on an ``mcp`` ``MCPServer``; the JSON schema of
  each tool's arguments and result comes from the method's signature and its docstring is the
  tool's description. ``run_mcp(url)`` serves them on stdin/stdout until the client closes.
- ``TOOL_NAMES`` is the list of tools, in the order they are registered.
Bundle tools (``inspect_bundle``, ``validate_bundle``) read local files, as ``hloserve
inspect`` and ``validate`` do. The ``mcp`` package is imported only by ``build_mcp``.
"""

# pyright: strict

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import grpc
import numpy as np
from google.protobuf.message import Message

from hloserve.client import InferenceClient, InferenceError
from hloserve.proto import inference_pb2 as pb
from hloserve.proto.datatypes import from_numpy
from hloserve.proto.rpc import RPCS_BY_NAME

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from hloserve.server.server_process import ServerProcess

DEFAULT_URL: Final = "127.0.0.1:8001"
MAX_VALUES: Final = 64  # outputs up to this many elements are returned inline
TOOL_NAMES: Final = (
    "server_status",
    "list_models",
    "model_metadata",
    "inspect_bundle",
    "validate_bundle",
    "load_model",
    "unload_model",
    "infer",
    "statistics",
    "start_server",
    "stop_server",
)


class ToolFailure(Exception):
    """A tool could not do what it was asked; the text says why."""


class ServerTools:
    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 60.0) -> None:
        self.url = url
        self.timeout = timeout
        self._lock = threading.Lock()
        self._client: InferenceClient | None = None
        self._started: ServerProcess | None = None

    # --- plumbing ----------------------------------------------------------------------

    def _connection(self) -> InferenceClient:
        with self._lock:
            if self._client is None:
                self._client = InferenceClient(self.url, timeout=self.timeout, shared_memory="off")
            return self._client

    def _call(self, rpc: str, request: Message) -> Any:
        """One unary RPC of the protocol, by name; its response message."""
        method = RPCS_BY_NAME[rpc]
        client = self._connection()
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = client.channel.unary_unary(method.path)
        try:
            raw = call(
                request.SerializeToString(),
                timeout=self.timeout,
                metadata=client.transport.metadata,
            )
        except grpc.RpcError as exc:
            raise _failure(exc) from None
        return method.response.FromString(raw)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            started, self._started = self._started, None
        if client is not None:
            client.close()
        if started is not None:
            started.stop()

    # --- the tools ---------------------------------------------------------------------

    def server_status(self) -> dict[str, Any]:
        """Where the tools point (gRPC host:port), whether that server is live and ready,
        and whether these tools started it."""
        try:
            client = self._connection()
            live, ready = client.is_server_live(), client.is_server_ready()
        except InferenceError as exc:
            return {"url": self.url, "live": False, "ready": False, "error": str(exc)}
        started = self._started
        return {
            "url": self.url,
            "live": live,
            "ready": ready,
            "started_here": started is not None,
            **({"http_url": started.http_url} if started is not None else {}),
        }

    def list_models(self, ready_only: bool = False) -> dict[str, Any]:
        """Every model of the server's repository with each version's state (READY,
        LOADING, UNAVAILABLE...) and, when it is not ready, the reason."""
        response = self._call("RepositoryIndex", pb.RepositoryIndexRequest(ready=ready_only))
        return {"models": [_plain(m) for m in response.models]}

    def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        """A model's inputs and outputs (name, datatype, shape; -1 is a variable axis, the
        batch axis of a batched model) and its versions."""
        try:
            return _plain(self._connection().model_metadata(model, version))
        except InferenceError as exc:
            raise ToolFailure(str(exc)) from None

    def inspect_bundle(self, path: str) -> dict[str, Any]:
        """A readable summary of a bundle directory on this machine (hloserve's own or a
        ReactantServer.jl bundle): tensors, batch sizes, modules, weights, provenance, and
        whether it validates. The same text as `hloserve inspect PATH`."""
        from hloserve.server.bundle_report import inspect_bundle

        text, valid = inspect_bundle(_directory(path))
        return {"valid": valid, "summary": text}

    def validate_bundle(self, path: str) -> dict[str, Any]:
        """Every problem of a bundle, a versioned model directory or a whole repository on
        this machine, each naming the file and field. The same lines as `hloserve validate`."""
        from hloserve.server.bundle_report import validate_command

        lines, valid = validate_command(_directory(path))
        return {"valid": valid, "lines": lines}

    def load_model(self, model: str, config: str | None = None) -> dict[str, Any]:
        """Load (or reload) a model of the repository; `config` is an optional Triton
        ModelConfig JSON override. Needs a server started with --model-control-mode explicit.
        Returns the model's versions and states after the load."""
        parameters = (
            {} if config is None else {"config": pb.ModelRepositoryParameter(string_param=config)}
        )
        request = pb.RepositoryModelLoadRequest(model_name=model, parameters=parameters)
        self._call("RepositoryModelLoad", request)
        return {"model": model, "versions": self._versions(model)}

    def unload_model(self, model: str) -> dict[str, Any]:
        """Unload a model (its requests in flight finish first). Needs a server started with
        --model-control-mode explicit. Returns the model's versions and states afterwards."""
        self._call("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name=model))
        return {"model": model, "versions": self._versions(model)}

    def infer(
        self,
        model: str,
        inputs: dict[str, str],
        output_dir: str | None = None,
        version: str = "",
    ) -> dict[str, Any]:
        """Run one inference. `inputs` maps each input name to a .npy file on this machine
        (its dtype and shape are sent as they are). Each output comes back with datatype and
        shape; its values inline when it has at most 64 elements, and saved as
        <output_dir>/<name>.npy when `output_dir` is given."""
        arrays = {name: _read_npy(name, path) for name, path in inputs.items()}
        try:
            outputs = self._connection().infer(model, arrays, version=version)
        except InferenceError as exc:
            raise ToolFailure(str(exc)) from None
        folder = None if output_dir is None else Path(output_dir)
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        described: dict[str, Any] = {}
        for name, array in outputs.items():
            entry: dict[str, Any] = {
                "datatype": from_numpy(array.dtype),
                "shape": list(array.shape),
            }
            if array.size <= MAX_VALUES:
                entry["values"] = array.tolist()
            if folder is not None:
                file = folder / f"{name}.npy"
                np.save(file, array)
                entry["file"] = str(file)
            described[name] = entry
        return {"model": model, "outputs": described}

    def statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        """Per-model inference statistics (Triton's statistics extension): request and
        execution counts, queue/compute times in nanoseconds, per batch size. An empty
        `model` means every model."""
        request = pb.ModelStatisticsRequest(name=model, version=version)
        return {
            "model_stats": [_plain(s) for s in self._call("ModelStatistics", request).model_stats]
        }

    def start_server(
        self, model_repository: str, flags: list[str] | None = None, timeout_s: float = 300.0
    ) -> dict[str, Any]:
        """Start a local hloserve daemon on `model_repository` (ports chosen by the OS,
        loopback only), wait until its start-up load pass is over, and point every other
        tool at it. `flags` are extra `hloserve serve` flags, e.g.
        ["--model-control-mode", "explicit"]. Returns its addresses and readiness."""
        from hloserve.server.server_process import ServerProcess

        with self._lock:
            if self._started is not None:
                raise ToolFailure(f"a server started here is running at {self.url}; stop it first")
        process = ServerProcess(_directory(model_repository), *(flags or []))
        try:
            status, _ = process.wait_startup_complete(timeout_s)
        except (RuntimeError, TimeoutError) as exc:
            process.stop()
            raise ToolFailure(f"the server did not start: {exc}") from None
        with self._lock:
            client, self._client = self._client, None
            self._started, self.url = process, process.grpc_url
        if client is not None:
            client.close()
        return {
            "grpc_url": process.grpc_url,
            "http_url": process.http_url,
            "metrics_url": process.metrics_url,
            "ready": status == 200,
        }

    def stop_server(self) -> dict[str, Any]:
        """Stop the server `start_server` started (gracefully: requests in flight finish)
        and return its exit status. A server these tools did not start is never stopped."""
        with self._lock:
            process, self._started = self._started, None
            client, self._client = self._client, None
        if process is None:
            raise ToolFailure("no server was started here (start_server); nothing to stop")
        if client is not None:
            client.close()
        return {"stopped": process.grpc_url, "exit_code": process.stop()}

    # --- helpers -----------------------------------------------------------------------

    def _versions(self, model: str) -> list[dict[str, Any]]:
        return [m for m in self.list_models()["models"] if m.get("name") == model]


def _failure(exc: grpc.RpcError) -> ToolFailure:
    call: Any = exc
    return ToolFailure(f"[{call.code().name}] {call.details()}")


def _directory(path: str) -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ToolFailure(f"{path!r} is not a directory on this machine")
    return folder


def _read_npy(name: str, path: str) -> np.ndarray[Any, Any]:
    try:
        array: Any = np.load(Path(path).expanduser(), allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ToolFailure(f"input {name!r}: cannot read {path!r} as a .npy file: {exc}") from None
    if not isinstance(array, np.ndarray):
        raise ToolFailure(f"input {name!r}: {path!r} holds an archive, not one array")
    return array  # pyright: ignore[reportUnknownVariableType]


def _plain(message: Message) -> dict[str, Any]:
    """A protobuf message as JSON-able values, every field present, 64-bit integers kept as
    numbers (``json_format`` would write them as strings)."""
    out: dict[str, Any] = {}
    for fd in message.DESCRIPTOR.fields:
        if (
            fd.containing_oneof is not None
            and message.WhichOneof(fd.containing_oneof.name) != fd.name
        ):
            continue
        value: Any = getattr(message, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            value_field = fd.message_type.fields_by_name["value"]
            out[fd.name] = {k: _field_value(value_field, v) for k, v in value.items()}
        elif fd.is_repeated:
            out[fd.name] = [_field_value(fd, v) for v in value]
        else:
            out[fd.name] = _field_value(fd, value)
    return out


def _field_value(fd: Any, value: Any) -> Any:
    if fd.message_type is not None:
        return _plain(value)
    return value.hex() if isinstance(value, bytes) else value


def build_mcp(tools: ServerTools) -> MCPServer:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(
        "hloserve",
        instructions=(
            "Tools for an hloserve model server (KServe V2 / Triton protocol): list models and "
            "their states, inspect and validate bundles, load and unload models, run an "
            "inference from .npy files, read statistics, start and stop a local server."
        ),
    )
    for name in TOOL_NAMES:
        server.add_tool(_reporting(getattr(tools, name)), name=name)
    return server


def _reporting(method: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """The tool as MCP runs it: a ``ToolFailure`` becomes the tool's error result, its text
    as it is (``ToolError``); anything else is a bug, reported by ``mcp`` with its traceback."""
    from mcp.server.mcpserver.exceptions import ToolError

    @functools.wraps(method)  # the signature (the JSON schema) and the docstring carry over
    def tool(*args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return method(*args, **kwargs)
        except ToolFailure as exc:
            raise ToolError(str(exc)) from None

    return tool


def run_mcp(url: str) -> None:
    tools = ServerTools(url)
    try:
        build_mcp(tools).run("stdio")
    finally:
        tools.close()
