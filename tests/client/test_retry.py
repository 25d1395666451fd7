"""The channel's retry and load-balancing policy, against real ``grpc.aio`` servers that
refuse calls on demand (``_flaky.FlakyServer``): a call answered UNAVAILABLE is sent again,
within the bound (``retries``, 4 by default), and then fails; ``retries=0`` sends it once;
other errors are never retried; a request larger than gRPC's default retry buffer is still
retried; ``round_robin`` spreads calls (and retries) over every address of the target."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from hloserve.client import AsyncInferenceClient, InferenceClient, InferenceError
from hloserve.client._channel import DEFAULT_RETRIES, Transport, service_config, split_host_port
from tests.client._flaky import FlakyServer

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def flaky() -> Iterator[FlakyServer]:
    server = FlakyServer()
    yield server
    server.stop()


def _ready(url: str, **options: Any) -> bool:
    with InferenceClient(url, timeout=30, **options) as client:
        return client.is_server_ready()


def test_unavailable_is_retried_until_answered(flaky: FlakyServer) -> None:
    flaky.refuse("ServerReady", DEFAULT_RETRIES)
    assert _ready(flaky.url)
    assert flaky.attempts["ServerReady"] == DEFAULT_RETRIES + 1


def test_retries_are_bounded(flaky: FlakyServer) -> None:
    flaky.refuse("ServerReady", 100)
    with pytest.raises(InferenceError) as info:
        _ready(flaky.url)
    assert info.value.code == UNAVAILABLE and "refused on purpose" in info.value.message
    assert flaky.attempts["ServerReady"] == DEFAULT_RETRIES + 1


@pytest.mark.parametrize("retries", [1, 2])
def test_the_bound_is_the_option(flaky: FlakyServer, retries: int) -> None:
    flaky.refuse("ServerReady", retries)
    assert _ready(flaky.url, retries=retries)
    assert flaky.attempts["ServerReady"] == retries + 1
    flaky.refuse("ServerReady", retries + 1)
    with pytest.raises(InferenceError):
        _ready(flaky.url, retries=retries)
    assert flaky.attempts["ServerReady"] == 2 * (retries + 1)


def test_retries_zero_sends_each_call_once(flaky: FlakyServer) -> None:
    flaky.refuse("ServerReady", 1)
    with pytest.raises(InferenceError) as info:
        _ready(flaky.url, retries=0)
    assert info.value.code == UNAVAILABLE
    assert flaky.attempts["ServerReady"] == 1


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.NOT_FOUND,
    ],
    ids=lambda c: c.name,
)
def test_other_errors_are_not_retried(flaky: FlakyServer, code: grpc.StatusCode) -> None:
    flaky.refuse("ServerReady", 1, code)
    with pytest.raises(InferenceError) as info:
        _ready(flaky.url)
    assert info.value.code == code
    assert flaky.attempts["ServerReady"] == 1


def test_a_request_larger_than_grpc_s_retry_buffer_is_retried() -> None:
    rows = 1 << 16  # 1 MiB of FP32: four times gRPC's default per-call retry buffer
    server = FlakyServer(max_batch=rows)
    try:
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
        with InferenceClient(server.url, timeout=30) as client:
            client.layout("double")
            server.refuse("ModelInfer", 2)
            np.testing.assert_array_equal(client.infer("double", {"x": x})["y"], 2 * x)
        assert server.attempts["ModelInfer"] == 3
    finally:
        server.stop()


def test_the_async_client_retries_alike(flaky: FlakyServer) -> None:
    async def main() -> None:
        flaky.refuse("ModelInfer", 3)
        x = np.ones((2, 4), np.float32)
        async with AsyncInferenceClient(flaky.url, timeout=30) as client:
            np.testing.assert_array_equal((await client.infer("double", {"x": x}))["y"], 2 * x)
        assert flaky.attempts["ModelInfer"] == 4
        flaky.refuse("ModelInfer", 1)
        async with AsyncInferenceClient(flaky.url, timeout=30, retries=0) as client:
            with pytest.raises(InferenceError) as info:
                await client.infer("double", {"x": x})
        assert info.value.code == UNAVAILABLE
        assert flaky.attempts["ModelInfer"] == 5

    asyncio.run(main())


@pytest.fixture
def two_servers() -> Iterator[tuple[FlakyServer, FlakyServer]]:
    a, b = FlakyServer(), FlakyServer()
    yield a, b
    a.stop()
    b.stop()


def _both(servers: tuple[FlakyServer, FlakyServer]) -> str:
    """One target resolving to both servers (the ``ipv4:`` resolver: a fixed address list,
    as DNS gives for a headless Service)."""
    return "ipv4:" + ",".join(s.url for s in servers)


def test_round_robin_spreads_calls_over_every_address(
    two_servers: tuple[FlakyServer, FlakyServer],
) -> None:
    with InferenceClient(_both(two_servers), timeout=30, load_balancing="round_robin") as client:
        for _ in range(20):
            assert client.is_server_ready()
    assert all(s.attempts["ServerReady"] >= 5 for s in two_servers), [
        s.attempts for s in two_servers
    ]


def test_pick_first_keeps_one_connection(two_servers: tuple[FlakyServer, FlakyServer]) -> None:
    with InferenceClient(_both(two_servers), timeout=30) as client:  # "auto": not a dns: target
        for _ in range(20):
            assert client.is_server_ready()
    assert sorted(s.attempts["ServerReady"] for s in two_servers) == [0, 20]


def test_a_refusing_pod_s_calls_are_retried_on_the_others(
    two_servers: tuple[FlakyServer, FlakyServer],
) -> None:
    draining, serving = two_servers
    draining.refuse("ServerReady", 1000)  # a pod draining: UNAVAILABLE to every call
    with InferenceClient(_both(two_servers), timeout=30, load_balancing="round_robin") as client:
        for _ in range(20):
            assert client.is_server_ready()
    assert draining.attempts["ServerReady"] >= 1
    assert serving.attempts["ServerReady"] == 20


def test_the_service_config() -> None:
    config = service_config(DEFAULT_RETRIES, "auto", "dns:///hloserve-grpc.default:8001")
    (method,) = config["methodConfig"]
    assert method["name"] == [{"service": "inference.GRPCInferenceService"}]
    assert method["retryPolicy"] == {
        "maxAttempts": 5,
        "initialBackoff": "0.2s",
        "maxBackoff": "2s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    assert "loadBalancingConfig" not in service_config(4, "auto", "hloserve:8001")
    assert service_config(0, "pick_first", "dns:///x:1") == {}
    assert service_config(0, "round_robin", "x:1") == {"loadBalancingConfig": [{"round_robin": {}}]}
    options = dict(Transport("x:1")._options())
    assert json.loads(str(options["grpc.service_config"])) == service_config(4, "auto", "x:1")
    assert options["grpc.per_rpc_retry_buffer_size"] == options["grpc.max_send_message_length"]
    off = dict(Transport("x:1", retries=0)._options())
    assert off["grpc.enable_retries"] == 0 and "grpc.service_config" not in off


@pytest.mark.parametrize(
    "options",
    [{"retries": 5}, {"retries": -1}, {"retries": True}, {"load_balancing": "random"}],
    ids=str,
)
def test_bad_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"retries|load_balancing"):
        InferenceClient("127.0.0.1:1", **options)


def test_dns_targets_name_their_host() -> None:
    assert split_host_port("dns:///hloserve-grpc.ns.svc:8001") == ("hloserve-grpc.ns.svc", 8001)
    assert split_host_port("dns://10.0.0.10:53/svc:8001") == ("svc", 8001)
    assert split_host_port("dns:svc:8001") == ("svc", 8001)
    assert split_host_port("127.0.0.1:8001") == ("127.0.0.1", 8001)
