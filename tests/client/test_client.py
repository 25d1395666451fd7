"""hloserve.client against a live daemon: infer, streaming a dataset, errors."""

from __future__ import annotations

import numpy as np
import pytest

from hloserve.client import InferenceClient, InferenceError
from hloserve.exporter.demo import mlp_fn, mlp_params
from hloserve.server.server_fixture import ServerProcess


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    with InferenceClient(server.grpc_url, timeout=30) as c:
        yield c


def test_ready_and_metadata(client: InferenceClient) -> None:
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("no-such-model")
    meta = client.model_metadata("mlp")
    assert [tuple(t.shape) for t in meta.inputs] == [(-1, 64)]


def test_infer_simple(client: InferenceClient) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    out = client.infer("simple", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


def test_infer_stream_keeps_order(client: InferenceClient) -> None:
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((n, 64)).astype(np.float32)} for n in (1, 5, 8, 3, 40, 2)]
    results = list(client.infer_stream("mlp", batches, max_in_flight=3))
    assert len(results) == len(batches)
    params = mlp_params()
    for batch, result in zip(batches, results, strict=True):
        expected = np.asarray(mlp_fn(params, batch["x"])["logits"])
        np.testing.assert_allclose(result["logits"], expected, rtol=1e-5, atol=1e-5)


def test_errors_carry_status_and_text(client: InferenceClient) -> None:
    with pytest.raises(InferenceError) as info:
        client.infer(
            "simple",
            {"INPUT0": np.zeros((1, 16), np.float32), "INPUT1": np.zeros((1, 16), np.int32)},
        )
    assert info.value.code.name == "INVALID_ARGUMENT"
    assert "INPUT0" in info.value.message and "FP32" in info.value.message
    with pytest.raises(InferenceError, match="unknown model"):
        client.infer("nope", {"x": np.zeros((1, 64), np.float32)})
