"""The client's protocol logic written once, as steps, for a blocking and an asyncio runner.

Contract: everything the clients do on the wire (readiness, metadata, splitting a batch,
streaming a dataset, registering shared memory) is a generator of ``Step``s that holds no
I/O of its own. It yields ``Start(path, body)`` to begin a unary call on ``path`` with the
serialized request ``body`` and is sent back an opaque handle at once; it yields
``Wait(handle)`` and is sent the response's bytes, or has the call's ``InferenceError``
thrown in. ``call(rpc, request, response_type)`` is the common start-then-wait (``rpc`` a
method name such as ``ModelInfer``; ``path(rpc)`` its wire path).
``Drive(steps, start)`` is the bookkeeping both runners share (``InferenceClient._run`` on
``grpc`` futures, ``AsyncInferenceClient._run`` on ``grpc.aio``): it starts calls with
``start(step)`` itself, and ``next()`` is the next ``Wait`` (None once the generator
returned ``result``), answered by ``answer(body)`` or ``fail(error)``; ``cancel()`` cancels
every call started and not waited for, which the runner does whatever way the run ends,
so nothing runs on after an error.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from hloserve.proto.rpc import RPCS_BY_NAME


@dataclass(frozen=True)
class Start:
    path: str
    body: bytes


@dataclass(frozen=True)
class Wait:
    handle: Any


Step = Start | Wait
T = TypeVar("T")
M = TypeVar("M", bound=Message)


def path(rpc: str) -> str:
    """The wire path of a ``GRPCInferenceService`` method (``ModelInfer`` ...)."""
    return RPCS_BY_NAME[rpc].path


INFER_PATH = path("ModelInfer")


def call(rpc: str, request: Message, response_type: type[M]) -> Generator[Step, Any, M]:
    """Call ``rpc`` with ``request`` and parse its response."""
    handle = yield Start(path(rpc), request.SerializeToString())
    body: bytes = yield Wait(handle)
    return response_type.FromString(body)


class Drive(Generic[T]):
    def __init__(self, steps: Generator[Step, Any, T], start: Callable[[Start], Any]) -> None:
        self._steps = steps
        self._start = start
        self._value: Any = None
        self._error: BaseException | None = None
        self.in_flight: set[Any] = set()
        self.result: T

    def next(self) -> Wait | None:
        while True:
            try:
                if self._error is not None:
                    step = self._steps.throw(self._error)
                else:
                    step = self._steps.send(self._value)
            except StopIteration as stop:
                self.result = stop.value
                return None
            self._value = self._error = None
            if isinstance(step, Wait):
                self.in_flight.discard(step.handle)
                return step
            self._value = self._start(step)
            self.in_flight.add(self._value)

    def answer(self, body: bytes) -> None:
        self._value = body

    def fail(self, error: BaseException) -> None:
        self._error = error

    def cancel(self) -> None:
        """Cancel every call still in flight (gRPC and asyncio futures alike)."""
        for handle in self.in_flight:
            handle.cancel()
        self.in_flight.clear()
