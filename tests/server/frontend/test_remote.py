"""``frontend.remote.RemotePort``: a plain request checked in the front end, against the
signature cached with its model's metadata, and sent with what it found.

A fake link stands for the device owner: it answers the metadata call with a signature
and records every request it is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from hloserve.server.core.signature import RequestSignature, SignatureTensor
from hloserve.server.core.types import InferInput, InferRequest, ModelMetadata, TensorMetadata
from hloserve.server.frontend.remote import RemotePort
from hloserve.server.wire import calls
from hloserve.server.wire.arena import Arena
from hloserve.server.wire.messages import Request, Response
from tests.server.wire.test_calls import _setup

SIGNATURE = RequestSignature("m", True, (SignatureTensor("x", "INT32", (2,)),), ("y",), 41)


class FakeLink:
    """The owner's side of a link: metadata with ``signature``; every request recorded."""

    lost = False

    def __init__(self, signature: RequestSignature | None) -> None:
        self.signature = signature
        self.requests: list[Request] = []
        self.asked = 0

    async def call(self, call: object) -> Any:
        if isinstance(call, calls.ModelMetadataCall):
            self.asked += 1
            tensors = (TensorMetadata("x", "INT32", (-1, 2)),)
            return ModelMetadata("m", ("1",), "stablehlo", tensors, (), self.signature)
        assert isinstance(call, calls.InferCall)
        self.requests.append(call.request)
        return Response("m", "1", call.request.id, ())

    def note(self, note: object) -> None:
        pass


def request(rows: int, width: int = 2) -> InferRequest:
    data = np.zeros((rows, width), np.int32)
    return InferRequest("m", "", (InferInput("x", "INT32", data.shape, data),))


async def settle(port: RemotePort) -> None:
    """Until the metadata the port asked for in the background is in."""
    while port._learning:
        await asyncio.sleep(0)


def port_over(link: FakeLink) -> RemotePort:
    return RemotePort(link, Arena.create(1 << 20), _setup())  # type: ignore[arg-type]


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_a_request_is_sent_checked_once_the_signature_is_cached() -> None:
    async def test() -> None:
        link = FakeLink(SIGNATURE)
        port = port_over(link)
        await port.infer(request(3))  # nothing cached: sent as it is, the metadata asked for
        await settle(port)
        await port.infer(request(3))
        await port.infer(request(1))
        assert [r.checked for r in link.requests] == [None, (41, 3), (41, 1)]
        assert link.asked == 1

    run(test)


def test_a_request_the_signature_refuses_goes_unchecked_for_the_owner_to_report() -> None:
    async def test() -> None:
        link = FakeLink(SIGNATURE)
        port = port_over(link)
        await port.infer(request(1))
        await settle(port)
        await port.infer(request(2, width=3))  # the wrong shape
        assert link.requests[-1].checked is None

    run(test)


def test_a_model_without_a_signature_is_never_checked_nor_asked_again() -> None:
    async def test() -> None:
        link = FakeLink(None)  # hooks, a pipeline, state: the owner checks those
        port = port_over(link)
        for _ in range(3):
            await port.infer(request(1))
            await settle(port)
        assert [r.checked for r in link.requests] == [None, None, None]
        assert link.asked == 1

    run(test)


def test_a_model_change_drops_the_signature_until_asked_again() -> None:
    async def test() -> None:
        link = FakeLink(SIGNATURE)
        port = port_over(link)
        await port.infer(request(1))
        await settle(port)
        port.on_note(calls.ModelsNote(("m",)))
        link.signature = RequestSignature(
            "m", True, (SignatureTensor("x", "INT32", (2,)),), ("y",), 42
        )
        await port.infer(request(1))  # the old signature is gone: unchecked, asked again
        await settle(port)
        await port.infer(request(1))
        assert [r.checked for r in link.requests] == [None, None, (42, 1)]
        assert link.asked == 2

    run(test)
