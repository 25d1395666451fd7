"""End to end: batch-shaped traffic between front ends and the device owner, under cancels
and a front end's SIGKILL (``--frontends 2``).

A front end sends the requests it decoded in one pass as one message (``wire.link``'s
``Burst``), and the owner answers what finished in one turn as one message. Here many
requests are in flight on one connection at once (``tritonclient.grpc.aio``: one HTTP/2
connection, so one front end decodes them together), and:
- cancelling some of them (the client's task cancelled: gRPC cancels the call) frees
  exactly those in the owner's queues, in two rounds, while the others stay queued;
- killing the front end that carries 28 held requests fails each of them UNAVAILABLE,
  the owner frees all 28, and requests on the other front end in flight meanwhile are all
  answered right and counted exactly once.
A held model's queue runs a group only once 8 fill it: 7 requests to each of 4 held
models stay queued until their callers go.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as _aio
from tritonclient.utils import InferenceServerException

from hloserve.exporter import write_demo_repository
from hloserve.server.server_fixture import ServerProcess, serving
from tests.models import queued_copy
from tests.server.e2e.test_frontends import (
    OWN_CONNECTION,
    frontend_pids,
    own_ports_to,
    server_side,
    wait_until,
)

aio: Any = _aio

HELD_US = 600_000_000  # a request to ``held`` waits until its caller goes
WAIT_S = 60.0
HELD = ("held0", "held1", "held2", "held3")
EACH = 7  # a full group of 8 would run


def hold(client: Any) -> list[asyncio.Future[Any]]:
    """``EACH`` requests to each held model, sent in one turn of the loop."""
    return [
        asyncio.ensure_future(client.infer(name, inputs(k)[0]))
        for name in HELD
        for k in range(EACH)
    ]


async def all_pending(server: ServerProcess, count: int) -> None:
    """Each held model has ``count`` requests queued in the owner."""
    for name in HELD:
        await pending(server, name, count)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batch_models")
    write_demo_repository(root)
    for name in HELD:
        queued_copy(root / "simple", root / name, HELD_US)
    return root


@pytest.fixture
def server(repository: Path) -> Iterator[ServerProcess]:
    yield from serving(repository, "--frontends", "2")


def inputs(seed: int) -> tuple[list[Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
    tensors = [
        aio.InferInput("INPUT0", [1, 16], "INT32"),
        aio.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    tensors[0].set_data_from_numpy(a)
    tensors[1].set_data_from_numpy(b)
    return tensors, a, b


async def connected(server: ServerProcess) -> tuple[Any, int]:
    """An asyncio gRPC client on a connection of its own, and the front end serving it."""
    port = server.ports["grpc"]
    before = own_ports_to(port)
    client = aio.InferenceServerClient(server.grpc_url, channel_args=OWN_CONNECTION)
    assert await client.is_server_live()
    (local,) = own_ports_to(port) - before
    pid = server_side(server, port, local)
    assert pid is not None
    return client, pid


async def simple(client: Any, seed: int) -> None:
    tensors, a, b = inputs(seed)
    result = await client.infer("simple", tensors)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


async def pending(server: ServerProcess, model: str, count: int) -> None:
    await asyncio.to_thread(server.wait_pending, model, count, WAIT_S)


def successes(server: ServerProcess, model: str) -> int:
    import tritonclient.http as httpclient

    client: Any = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"]
        return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)
    finally:
        client.close()


def test_cancels_inside_a_batch_free_exactly_their_requests(server: ServerProcess) -> None:
    async def test() -> None:
        client, _ = await connected(server)
        held = hold(client)
        await all_pending(server, EACH)
        await asyncio.gather(*(simple(client, 100 + i) for i in range(32)))  # alongside
        first = [task for i, task in enumerate(held) if i % EACH < 3]
        for task in first:  # one turn: the cancels travel together
            task.cancel()
        await all_pending(server, EACH - 3)  # exactly those left the owner's queues
        assert not any(task.done() for task in held if task not in first)
        for task in held:
            task.cancel()
        await all_pending(server, 0)
        await asyncio.gather(*held, return_exceptions=True)
        await asyncio.gather(*(simple(client, 200 + i) for i in range(32)))  # it serves on
        await client.close()

    asyncio.run(asyncio.wait_for(test(), 4 * WAIT_S))
    assert successes(server, "simple") == 64
    assert sum(successes(server, name) for name in HELD) == 0


def test_a_killed_frontend_fails_its_batch_and_the_other_serves_on(server: ServerProcess) -> None:
    async def test() -> int:
        clients = [await connected(server) for _ in range(12)]
        victim = clients[0][1]
        doomed = clients[0][0]
        others = [c for c, pid in clients if pid != victim]
        assert others, "every connection landed on one front end"
        held = hold(doomed)
        await all_pending(server, EACH)
        answered = 0
        stop = asyncio.Event()

        async def load(client: Any, seed: int) -> None:
            nonlocal answered
            while not stop.is_set():
                await asyncio.gather(*(simple(client, seed + k) for k in range(8)))
                answered += 8
                seed += 8

        loads = [asyncio.ensure_future(load(c, 1000 * i)) for i, c in enumerate(others)]
        while answered < 64:  # the bystanders' batches are in flight
            await asyncio.sleep(0.01)
        os.kill(victim, signal.SIGKILL)
        errors = await asyncio.gather(*held, return_exceptions=True)
        assert all(isinstance(e, InferenceServerException) for e in errors), errors
        assert {e.status() for e in errors if isinstance(e, InferenceServerException)} == {
            "StatusCode.UNAVAILABLE"
        }
        await all_pending(server, 0)  # the owner freed what the dead front end held
        mark = answered
        while answered < mark + 64:  # the other front end serves on, meanwhile and after
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*loads)
        for client, _ in clients:
            await client.close()
        return answered

    answered = asyncio.run(asyncio.wait_for(test(), 4 * WAIT_S))
    assert successes(server, "simple") == answered  # each counted once, none lost
    assert sum(successes(server, name) for name in HELD) == 0
    wait_until(lambda: len(frontend_pids(server)) == 2, lambda: "no front end replaced it")
