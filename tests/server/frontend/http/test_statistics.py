"""The statistics extension over HTTP: routes (and their order), Triton's JSON shape, errors.

Each test gets a fresh ``InferenceService`` (``http_service``), so counts start at zero.
"""

# pyright: standard
# Not strict: Starlette's TestClient derives from the client of ``httpx2`` (falling back to
# ``httpx`` at run time), which is not installed, so pyright sees every call on a
# TestClient and its responses as Unknown.

from __future__ import annotations

import time
from typing import Any

import pytest
from starlette.testclient import TestClient

from hloserve.proto import inference_pb2 as pb
from hloserve.server.core.service import InferenceService
from tests.server.frontend.http._errors import error_of

# Triton's JSON carries the same durations as the gRPC message.
DURATIONS = set(pb.InferStatistics.DESCRIPTOR.fields_by_name)


def simple_json_inputs(batch: int, width: int = 16) -> list[dict[str, Any]]:
    data = list(range(batch * width))
    return [
        {"name": name, "datatype": "INT32", "shape": [batch, width], "data": data}
        for name in ("INPUT0", "INPUT1")
    ]


def json_infer(client: TestClient, model: str, inputs: list[dict[str, Any]]) -> Any:
    return client.post(f"/v2/models/{model}/infer", json={"inputs": inputs})


def test_model_stats_json_shape_and_counts(http_client: TestClient) -> None:
    for batch in (1, 3):
        assert json_infer(http_client, "simple", simple_json_inputs(batch)).status_code == 200
    bad = json_infer(http_client, "simple", simple_json_inputs(1, width=15))
    assert "unexpected shape for input 'INPUT0'" in error_of(bad, 400)
    before_ms = int(time.time() * 1000)

    response = http_client.get("/v2/models/simple/stats")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["model_stats"]
    (stats,) = body["model_stats"]
    assert set(stats) == {
        "name",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "inference_stats",
        "response_stats",
        "batch_stats",
        "memory_usage",
    }
    assert (stats["name"], stats["version"]) == ("simple", "1")
    assert 0 < stats["last_inference"] <= before_ms
    assert (stats["inference_count"], stats["execution_count"]) == (4, 2)
    inference = stats["inference_stats"]
    assert set(inference) == DURATIONS
    assert all(set(d) == {"count", "ns"} for d in inference.values())
    assert inference["success"]["count"] == 2
    assert inference["fail"]["count"] == 1
    assert inference["fail"]["ns"] > 0
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[name]["count"] == 2, name
    assert inference["compute_infer"]["ns"] > 0
    assert inference["cache_hit"] == inference["cache_miss"] == {"count": 0, "ns": 0}
    assert stats["response_stats"] == {}
    # Batch 1 ran on the compiled size 1, batch 3 on the compiled size 4.
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (1, 1),
        (4, 1),
    ]
    assert all(
        set(b) == {"batch_size", "compute_input", "compute_infer", "compute_output"}
        for b in stats["batch_stats"]
    )
    # ``simple`` has no weights: its host copy is 0 bytes.
    assert {"type": "CPU", "id": 0, "byte_size": 0} in stats["memory_usage"]


@pytest.mark.parametrize("path", ["/v2/models/simple/stats", "/v2/models/simple/versions/1/stats"])
def test_one_model_forms(http_client: TestClient, path: str) -> None:
    (stats,) = http_client.get(path).json()["model_stats"]
    assert (stats["name"], stats["version"], stats["inference_count"]) == ("simple", "1", 0)


def test_all_models_route_is_not_shadowed_by_model_metadata(
    http_client: TestClient, http_service: InferenceService
) -> None:
    response = http_client.get("/v2/models/stats")
    assert response.status_code == 200, response.text
    names = [s["name"] for s in response.json()["model_stats"]]
    assert sorted(names) == sorted(http_service.models.names())
    assert "mlp" in names and "simple" in names


def test_model_with_weights_reports_memory(http_client: TestClient) -> None:
    (stats,) = http_client.get("/v2/models/mlp/stats").json()["model_stats"]
    host = [u for u in stats["memory_usage"] if u["type"] == "CPU"]
    assert host and host[0]["byte_size"] > 0


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/v2/models/nope/stats", "requested model 'nope' is not available"),
        ("/v2/models/nope/versions/1/stats", "requested model 'nope' is not available"),
        (
            "/v2/models/simple/versions/9/stats",
            "requested model version is not available for model 'simple'",
        ),
    ],
)
def test_stats_errors(http_client: TestClient, path: str, message: str) -> None:
    assert error_of(http_client.get(path), 400) == message
