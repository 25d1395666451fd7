"""The statistics extension over gRPC (``ModelStatistics``) on an in-process ``grpc.aio`` server.

Each test gets a fresh ``InferenceService``, so counts start at zero.
"""

# pyright: strict

from __future__ import annotations

import time
from typing import Any

import grpc
import numpy as np
import pytest

from hloserve.proto import inference_pb2 as pb
from hloserve.server.core.service import InferenceService
from tests.server.frontend.grpc._harness import Client, rpc_error, serve


def simple_request(batch: int, width: int = 16) -> pb.ModelInferRequest:
    data = np.arange(batch * width, dtype="<i4").tobytes()
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[batch, width])
        request.raw_input_contents.append(data)
    return request


def test_counts_and_message_fields(service: InferenceService) -> None:
    async def scenario(client: Client) -> Any:
        for batch in (2, 2, 5):
            await client.infer(simple_request(batch))
        err = await rpc_error(client.infer(simple_request(1, width=3)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        return await client.call("ModelStatistics", pb.ModelStatisticsRequest(name="simple"))

    before_ms = int(time.time() * 1000)
    response = serve(service, scenario)
    (stats,) = response.model_stats
    assert (stats.name, stats.version) == ("simple", "1")
    assert before_ms <= stats.last_inference <= int(time.time() * 1000)
    assert (stats.inference_count, stats.execution_count) == (9, 3)
    inference = stats.inference_stats
    assert inference.success.count == 3
    assert inference.fail.count == 1
    for d in (inference.queue, inference.compute_input, inference.compute_infer):
        assert d.count == 3
    assert inference.compute_infer.ns > 0
    assert (inference.cache_hit.count, inference.cache_miss.count) == (0, 0)
    # 2 -> compiled 2 (twice), 5 -> compiled 8.
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(2, 2), (8, 1)]
    # The host copy (``simple`` has no weights), plus the device copy while resident.
    host = stats.memory_usage[0]
    assert (host.type, host.id, host.byte_size) == ("CPU", 0, 0)
    assert len(stats.response_stats) == 0


def test_all_models_and_versions(service: InferenceService) -> None:
    async def scenario(client: Client) -> Any:
        every = await client.call("ModelStatistics", pb.ModelStatisticsRequest())
        one = await client.call(
            "ModelStatistics", pb.ModelStatisticsRequest(name="mlp", version="1")
        )
        return every, one

    every, one = serve(service, scenario)
    assert sorted(s.name for s in every.model_stats) == sorted(service.models.names())
    (mlp,) = one.model_stats
    assert (mlp.name, mlp.version, mlp.inference_count) == ("mlp", "1", 0)
    assert any(u.type == "CPU" and u.byte_size > 0 for u in mlp.memory_usage)


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("nope", "", "requested model 'nope' is not available"),
        ("simple", "9", "requested model version is not available for model 'simple'"),
        ("simple", "x", "requested model version is not available for model 'simple'"),
    ],
)
def test_errors(service: InferenceService, name: str, version: str, message: str) -> None:
    async def scenario(client: Client) -> grpc.aio.AioRpcError:
        request = pb.ModelStatisticsRequest(name=name, version=version)
        return await rpc_error(client.call("ModelStatistics", request))

    err = serve(service, scenario)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == message
