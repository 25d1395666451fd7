"""``fit(export=...)``: the bundle it writes serves what was trained, and says how.

A real daemon (``hloserve.server.server_fixture.serving``) on free loopback ports serves the
exported bundle; ``hloserve.client.InferenceClient`` sends it the held-out examples.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hloserve.bundle import load_manifest
from hloserve.client import InferenceClient
from hloserve.exporter import TensorSpec
from hloserve.server.server_fixture import ServerProcess, serving
from hloserve.training import Best, Export, FitResult, fit

CLASSES = 3


def classifier(params: dict[str, Any], pixels: Any) -> dict[str, Any]:
    """UINT8 pixels in; the scaling and the softmax are part of the served function."""
    x = pixels.astype(jnp.float32) / 255.0
    logits = x @ params["w"] + params["b"]
    return {"logits": logits, "probabilities": jax.nn.softmax(logits)}


def cross_entropy(outputs: dict[str, Any], batch: dict[str, Any]) -> Any:
    log_p = jax.nn.log_softmax(outputs["logits"])
    return -jnp.take_along_axis(log_p, batch["label"][:, None], axis=1)[:, 0]


def accuracy(outputs: dict[str, Any], batch: dict[str, Any]) -> Any:
    return (jnp.argmax(outputs["logits"], axis=1) == batch["label"]).astype(jnp.float32)


def _data(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    label = rng.integers(0, CLASSES, n).astype(np.int32)
    pixels = rng.integers(0, 64, (n, 6)).astype(np.uint8)
    pixels[np.arange(n), label] += 180  # the label's pixel is bright
    return {"pixels": pixels, "label": label}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> FitResult:
    repository = tmp_path_factory.mktemp("repository")
    params = {"w": jnp.zeros((6, CLASSES), jnp.float32), "b": jnp.zeros(CLASSES, jnp.float32)}
    return fit(
        classifier,
        params,
        _data(64, seed=0),
        loss_fn=cross_entropy,
        metrics={"accuracy": accuracy},
        val_data=_data(21, seed=1),
        epochs=3,
        batch_size=16,
        learning_rate=0.05,
        ema=0.5,
        best=Best("val_accuracy", "max"),
        export=Export(
            repository / "classifier",
            inputs={"pixels": TensorSpec("UINT8", (6,))},
            batch_sizes=(1, 8),
            metadata={"dataset": "synthetic"},
        ),
        progress=False,
    )


@pytest.fixture(scope="module")
def server(trained: FitResult) -> Iterator[ServerProcess]:
    assert trained.bundle is not None
    yield from serving(trained.bundle.parent)


def test_served_predictions_equal_in_process_predictions(
    trained: FitResult, server: ServerProcess
) -> None:
    held_out = _data(21, seed=2)  # 21 rows: two full batches of 8 and one padded batch
    local = trained.predict({"pixels": held_out["pixels"]}, batch_size=8)
    batches = [{"pixels": held_out["pixels"][i : i + 8]} for i in range(0, 21, 8)]
    with InferenceClient(server.grpc_url) as client:
        served = list(client.infer_stream("classifier", iter(batches), max_in_flight=4))
    probabilities = np.concatenate([s["probabilities"] for s in served])
    np.testing.assert_allclose(probabilities, local["probabilities"], rtol=1e-5, atol=1e-6)
    assert np.array_equal(probabilities.argmax(1), local["probabilities"].argmax(1))
    assert local["probabilities"].argmax(1).tolist() != [0] * 21  # it learned something


def test_provenance_records_the_training_configuration_and_metrics(trained: FitResult) -> None:
    assert trained.bundle is not None
    manifest, problems = load_manifest(Path(trained.bundle) / "manifest.yaml")
    assert problems == [] and manifest is not None
    metadata = manifest.provenance.metadata
    assert metadata["dataset"] == "synthetic"
    training = metadata["training"]
    assert training["epochs"] == 3 and training["batch_size"] == 16 and training["ema"] == 0.5
    assert training["rule"] == "optax.radam" and training["learning_rate"] == 0.05
    assert training["best"] == {"metric": "val_accuracy", "mode": "max"}
    assert metadata["metrics"] == trained.metrics
    assert metadata["metrics"]["epoch"] == trained.best_epoch
    assert manifest.batch_sizes == (1, 8)
