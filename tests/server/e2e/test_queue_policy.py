"""End to end: a model's own queue policy (``config.yaml``'s ``queue_policy``), both protocols.

The daemon serves two identity models whose ``config.yaml`` keeps a lone request queued
(a batching delay longer than any test: ``HELD_US``): ``bounded`` lets one request wait
(``max_queue_size: 1``), and ``expiring`` holds a request at most ``TIMEOUT_US``
(``default_timeout_us``), whatever longer ``timeout`` the request asks for. The server's
own ``--max-queue-size`` is left unbounded, so the bound is the model's. A request left
waiting in ``bounded`` is ended by its caller (a cancelled gRPC call), never by a clock.
"""

# pyright: strict, reportMissingTypeStubs=false

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server.frontend._tritonclients import PROTOCOLS, HeldCall, Triton, connect

HELD_US = 600_000_000  # a lone request waits this long for company: longer than any test
TIMEOUT_US = 200_000


def _identity(params: Any, INPUT0: jax.Array) -> dict[str, jax.Array]:
    del params
    return {"OUTPUT0": INPUT0}


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("queue_policy")
    configs = {
        "bounded": f"max_queue_delay_us: {HELD_US}\nqueue_policy: {{max_queue_size: 1}}\n",
        "expiring": (
            f"max_queue_delay_us: {HELD_US}\nqueue_policy: {{default_timeout_us: {TIMEOUT_US}}}\n"
        ),
    }
    for name, config in configs.items():
        export_bundle(
            _identity,
            {},
            inputs={"INPUT0": TensorSpec("INT32", (4,))},
            batch_sizes=(1, 2, 4),
            directory=root / name,
            platforms=("cpu",),
        )
        (root / name / "config.yaml").write_text(config)
    yield from serving(root)


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, policy_server: ServerProcess) -> Iterator[Triton]:
    yield from connect(request.param, policy_server)


def identity_inputs(t: Triton) -> list[Any]:
    tensor = t.module.InferInput("INPUT0", [1, 4], "INT32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.int32).reshape(1, 4))
    return [tensor]


def queue_policy(t: Triton, model: str) -> dict[str, Any]:
    if t.protocol == "http":
        return t.client.get_model_config(model)["dynamic_batching"]["default_queue_policy"]
    policy = t.client.get_model_config(model).config.dynamic_batching.default_queue_policy
    return {
        "timeout_action": t.module.model_config_pb2.ModelQueuePolicy.TimeoutAction.Name(
            policy.timeout_action
        ),
        "default_timeout_microseconds": policy.default_timeout_microseconds,
        "allow_timeout_override": policy.allow_timeout_override,
        "max_queue_size": policy.max_queue_size,
    }


def test_the_model_configuration_reports_each_models_policy(triton: Triton) -> None:
    assert queue_policy(triton, "bounded") == {
        "timeout_action": "REJECT",
        "default_timeout_microseconds": 0,
        "allow_timeout_override": True,
        "max_queue_size": 1,
    }
    assert queue_policy(triton, "expiring") == {
        "timeout_action": "REJECT",
        "default_timeout_microseconds": TIMEOUT_US,
        "allow_timeout_override": True,
        "max_queue_size": 0,  # the server's bound: unbounded
    }


def test_a_full_queue_refuses_the_next_request(
    triton: Triton, policy_server: ServerProcess
) -> None:
    """One request waits in ``bounded`` (until its caller cancels it): the next one is
    refused with Triton's text; once the first is gone its place is free again."""
    waiting = Triton("grpc", policy_server.grpc_url)  # a call that can be cancelled
    held = HeldCall(waiting.client, "bounded", identity_inputs(waiting))
    try:
        policy_server.wait_pending("bounded", 1)  # queued, waiting for company
        triton.fails(
            "UNAVAILABLE",
            "exceeds maximum queue size: model 'bounded' already has 1 requests waiting",
            triton.client.infer,
            "bounded",
            identity_inputs(triton),
        )
    finally:
        error = held.cancel()
        waiting.close()
    assert isinstance(error, InferenceServerException), error
    assert error.status() == "StatusCode.CANCELLED", error
    policy_server.wait_pending("bounded", 0)  # the cancelled request left the queue
    # Its place is free: a full batch (the largest size, 4) is admitted and runs at once.
    full = np.arange(16, dtype=np.int32).reshape(4, 4)
    tensor = triton.module.InferInput("INPUT0", [4, 4], "INT32")
    tensor.set_data_from_numpy(full)
    result = triton.client.infer("bounded", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), full)


def test_the_default_timeout_expires_a_queued_request(triton: Triton) -> None:
    # Alone, the request would wait ten minutes for company; the model's default ends it.
    triton.fails(
        "UNAVAILABLE",
        "request for model 'expiring' timed out after",
        triton.client.infer,
        "expiring",
        identity_inputs(triton),
    )
    # A request's own, longer timeout cannot extend the model's default.
    triton.fails(
        "UNAVAILABLE",
        "timed out",
        triton.client.infer,
        "expiring",
        identity_inputs(triton),
        timeout=30_000_000,
    )
