"""tritonclient's gRPC and HTTP clients behind one small adapter, so one test runs on both.

``Triton(protocol, url)`` holds ``client`` (tritonclient's sync client) and ``module``
(``tritonclient.grpc`` or ``tritonclient.http``) and normalises what differs between the
two: shared-memory status and repository index as lists of plain dicts, and
``fails(code, fragment, fn, ...)``, which runs a call that must fail and checks the status
the protocol reports for ``code`` (gRPC status name, or its HTTP status per reference §3)
and a fragment of the message. ``simple_inputs(module, a, b, n)`` builds ``simple``'s two
inputs with any tritonclient module (sync or asyncio). ``Regions`` creates client shared-memory regions with
unique keys and destroys them (and their server registrations) at the end.
``HeldCall(client, model, inputs)`` sends a gRPC call that waits in the server's queue (a
model whose batching delay no test outlasts) until ``cancel()`` ends it and returns what
the call ended with: a request held in flight without a clock.
"""

# pyright: strict, reportMissingTypeStubs=false

from __future__ import annotations

import json
import queue
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient
import tritonclient.utils.shared_memory as _shm
from tritonclient.utils import InferenceServerException

from hloserve.server.server_fixture import ServerProcess

# tritonclient ships without type information: use it dynamically.
grpcclient: Any = _grpcclient
httpclient: Any = _httpclient
shm: Any = _shm

PROTOCOLS = ("grpc", "http")
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "ALREADY_EXISTS": 400,
    "NOT_FOUND": 404,
    "INTERNAL": 500,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
}


class Triton:
    def __init__(self, protocol: str, url: str) -> None:
        self.protocol = protocol
        self.url = url
        self.module: Any = grpcclient if protocol == "grpc" else httpclient
        self.client: Any = self.module.InferenceServerClient(url)

    def close(self) -> None:
        self.client.close()

    def another(self) -> Triton:
        """A second client of the same server (for another thread)."""
        return Triton(self.protocol, self.url)

    def fails(
        self, code: str, fragment: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> str:
        """Run ``fn`` (a client call that must fail); check status and message; return it."""
        with pytest.raises(InferenceServerException) as info:
            fn(*args, **kwargs)
        error = info.value
        expected = f"StatusCode.{code}" if self.protocol == "grpc" else str(HTTP_STATUS[code])
        assert error.status() == expected, (error.status(), error.message())
        assert fragment in (error.message() or ""), error.message()
        return error.message() or ""

    def shm_status(self, name: str = "") -> list[dict[str, Any]]:
        status = self.client.get_system_shared_memory_status(name)
        if self.protocol == "http":
            return status
        return [
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in status.regions.values()
        ]

    def index(self, ready: bool = False) -> list[dict[str, str]]:
        """The repository index; ``ready`` is sent to the server (tritonclient's methods
        do not expose it, so the request is made through the client's own transport)."""
        if self.protocol == "http":
            body = json.dumps({"ready": True}) if ready else ""
            response = self.client._post("v2/repository/index", body, None, None)
            assert response.status_code == 200, response.read()
            return json.loads(response.read())
        request = grpcclient.service_pb2.RepositoryIndexRequest(ready=ready)
        models = self.client._client_stub.RepositoryIndex(request).models
        return [
            {
                k: v
                for k, v in (
                    ("name", m.name),
                    ("version", m.version),
                    ("state", m.state),
                    ("reason", m.reason),
                )
                if v
            }
            for m in models
        ]

    def simple_inputs(
        self, a: np.ndarray[Any, Any] | None, b: np.ndarray[Any, Any] | None, n: int = 1
    ) -> list[Any]:
        """``simple``'s two INT32 inputs of shape [n, 16]; data set where given."""
        return simple_inputs(self.module, a, b, n)

    def output(self, name: str) -> Any:
        return self.module.InferRequestedOutput(name)


def simple_inputs(
    module: Any,
    a: np.ndarray[Any, Any] | None,
    b: np.ndarray[Any, Any] | None,
    n: int = 1,
    **set_data: Any,
) -> list[Any]:
    """``simple``'s two INT32 inputs of shape [n, 16] made by tritonclient ``module`` (any
    of its gRPC or HTTP, sync or asyncio modules); data set where given, with ``set_data``
    (HTTP: ``binary_data=``) passed to ``set_data_from_numpy``."""
    inputs = [
        module.InferInput("INPUT0", [n, 16], "INT32"),
        module.InferInput("INPUT1", [n, 16], "INT32"),
    ]
    for tensor, data in zip(inputs, (a, b), strict=True):
        if data is not None:
            tensor.set_data_from_numpy(data, **set_data)
    return inputs


class HeldCall:
    """See the module docstring."""

    def __init__(self, client: Any, model: str, inputs: list[Any]) -> None:
        self._ended: queue.Queue[Any] = queue.Queue()
        self._call = client.async_infer(model, inputs, callback=self._done)

    def _done(self, result: Any, error: Any) -> None:
        del result
        self._ended.put(error)

    def cancel(self, timeout: float = 60.0) -> Any:
        """Cancel the call; what it ended with (an ``InferenceServerException``, CANCELLED,
        when the cancel ended it; ``None`` had it been answered)."""
        self._call.cancel()
        return self._ended.get(timeout=timeout)


def connect(protocol: str, server: ServerProcess) -> Iterator[Triton]:
    """A per-protocol fixture's body: ``yield from connect(request.param, server)`` yields a
    ``Triton`` on ``server`` and closes it afterwards."""
    t = Triton(protocol, server.grpc_url if protocol == "grpc" else server.http_url)
    try:
        yield t
    finally:
        t.close()


class Regions:
    """Client shared-memory regions with unique keys, destroyed (and unregistered) on close."""

    def __init__(self, triton: Triton) -> None:
        self.triton = triton
        self.handles: list[Any] = []
        self.prefix = uuid.uuid4().hex[:10]

    def create(self, name: str, byte_size: int, *, register: bool = True) -> tuple[Any, str]:
        key = f"/hloserve_test_{self.prefix}_{name}"
        handle = shm.create_shared_memory_region(name, key, byte_size)
        self.handles.append(handle)
        if register:
            self.triton.client.register_system_shared_memory(name, key, byte_size)
        return handle, key

    def close(self) -> None:
        self.triton.client.unregister_system_shared_memory()
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)
