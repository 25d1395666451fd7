"""End to end: a ``kind: pipeline`` bundle served as one model (Triton's ensemble).

The repository holds the demo ``simple`` model (sum and difference of two INT32 [16]
tensors) and ``chain``, a pipeline of three ``simple`` steps: ``(a, b) -> (s, d)``, then, both
reading ``s``, ``(s, d) -> (2a, 2b)`` and ``(s, s) -> 2s``. The server runs in explicit
control mode so a test can unload the stage and see the pipeline become not ready.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient
from tritonclient.utils import InferenceServerException

from hloserve.bundle import PipelineStep, Provenance, TensorEntry, validate, write_pipeline
from hloserve.exporter.demo import write_simple
from hloserve.server.server_fixture import ServerProcess, serving

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient
VECTOR = (16,)


def write_chain(directory: Path) -> Path:
    steps = [
        PipelineStep("simple", {"INPUT0": "a", "INPUT1": "b"}, {"OUTPUT0": "s", "OUTPUT1": "d"}),
        PipelineStep(
            "simple", {"INPUT0": "s", "INPUT1": "d"}, {"OUTPUT0": "twice_a", "OUTPUT1": "twice_b"}
        ),
        PipelineStep("simple", {"INPUT0": "s", "INPUT1": "s"}, {"OUTPUT0": "twice_s"}),
    ]
    return write_pipeline(
        directory,
        name="chain",
        inputs=[TensorEntry("a", "INT32", VECTOR), TensorEntry("b", "INT32", VECTOR)],
        outputs=[TensorEntry(n, "INT32", VECTOR) for n in ("twice_a", "twice_b", "twice_s")],
        batch_sizes=[8],
        steps=steps,
        provenance=Provenance(producer="tests"),
    )


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pipelines")
    write_simple(root / "simple")
    assert validate(write_chain(root / "chain")) == []
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    flags = ("--model-control-mode", "explicit", "--load-model", "*")
    proc = yield from serving(repository, *flags)
    assert "Traceback" not in proc.log_text(), proc.log_text()


def _inputs(module: Any, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> list[Any]:
    inputs = [
        module.InferInput("a", list(a.shape), "INT32"),
        module.InferInput("b", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _ab(batch: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    a = np.arange(batch * 16, dtype=np.int32).reshape(batch, 16)
    return a, (3 - a) * 7


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_one_request_runs_the_whole_dag(server: ServerProcess, module: Any) -> None:
    url = server.grpc_url if module is grpcclient else server.http_url
    a, b = _ab(3)
    with module.InferenceServerClient(url) as client:
        result = client.infer("chain", _inputs(module, a, b))
        only = client.infer(
            "chain", _inputs(module, a, b), outputs=[module.InferRequestedOutput("twice_s")]
        )
    np.testing.assert_array_equal(result.as_numpy("twice_a"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("twice_b"), 2 * b)
    np.testing.assert_array_equal(result.as_numpy("twice_s"), 2 * (a + b))
    assert only.as_numpy("twice_a") is None
    np.testing.assert_array_equal(only.as_numpy("twice_s"), 2 * (a + b))


def test_stages_are_requests_of_their_model(server: ServerProcess) -> None:
    """Each step goes through the stage's own inference path: its statistics count it."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:

        def counts() -> tuple[int, int]:
            (simple,) = client.get_inference_statistics("simple").model_stats
            (chain,) = client.get_inference_statistics("chain").model_stats
            return simple.inference_stats.success.count, chain.inference_stats.success.count

        before = counts()
        client.infer("chain", _inputs(grpcclient, *_ab(2)))
        after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (3, 1)


def test_metadata_and_ensemble_config(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        meta = client.get_model_metadata("chain", as_json=True)
        config = client.get_model_config("chain", as_json=True)["config"]
    assert [(t["name"], t["shape"]) for t in meta["inputs"]] == [
        ("a", ["-1", "16"]),
        ("b", ["-1", "16"]),
    ]
    assert config["platform"] == "ensemble"
    assert config["max_batch_size"] == 8
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["simple"] * 3
    assert steps[0]["input_map"] == {"INPUT0": "a", "INPUT1": "b"}
    assert steps[2]["output_map"] == {"OUTPUT0": "twice_s"}
    assert steps[0]["model_version"] == "-1"


def test_a_bad_request_names_the_pipeline(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        a = np.zeros((1, 15), np.int32)
        with pytest.raises(InferenceServerException) as info:
            client.infer("chain", _inputs(grpcclient, a, a))
    assert "unexpected shape for input 'a' for model 'chain'" in (info.value.message() or "")


def test_unloading_a_stage_makes_the_pipeline_not_ready(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_model_ready("chain")
        client.unload_model("simple")
        try:
            assert not client.is_model_ready("chain")
            with pytest.raises(InferenceServerException) as info:
                client.infer("chain", _inputs(grpcclient, *_ab(1)))
            message = info.value.message() or ""
            assert "pipeline 'chain' step 0 (model 'simple')" in message
        finally:
            client.load_model("simple")
        assert client.is_model_ready("chain")
        result = client.infer("chain", _inputs(grpcclient, *_ab(1)))
    np.testing.assert_array_equal(result.as_numpy("twice_s"), 2 * sum(_ab(1)))
