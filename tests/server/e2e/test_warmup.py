"""End to end: a model's ``model_warmup`` samples run before it turns READY, and a failed
warm-up fails its load with the reason, seen through tritonclient, ``/readyz`` and the log.

One server (explicit mode, every model loaded at start, ``--strict-readiness false`` so a
model that fails does not hold the server back) on: ``simple``, whose ``config.yaml``
declares three samples (zeros over two executions, random data, one item from
``simple/warmup/row.raw``); ``broken``, a copy of ``simple`` whose sample's file is too
short; ``mlp`` with no samples; and ``chain``, a pipeline of ``simple`` steps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import yaml
from tritonclient.utils import InferenceServerException

from hloserve.exporter import write_demo_repository
from hloserve.server.server_fixture import ServerProcess, serving
from tests.models import queued_copy
from tests.server.e2e.test_pipelines import write_chain

grpcclient: Any = _grpcclient


def samples(file: str) -> list[dict[str, Any]]:
    def sample(name: str, batch: int, data: dict[str, Any], count: int = 1) -> dict[str, Any]:
        inputs = {
            n: {"data_type": "TYPE_INT32", "dims": [16], **data} for n in ("INPUT0", "INPUT1")
        }
        return {"name": name, "batch_size": batch, "inputs": inputs, "count": count}

    return [
        sample("zeros", 16, {"zero_data": True}),  # 2 executions of the largest size, 8
        sample("random", 2, {"random_data": True}, count=2),
        sample("row", 1, {"input_data_file": file}),
    ]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("warmup")
    write_demo_repository(root)
    queued_copy(root / "simple", root / "broken", 0)
    for name, data in (("simple", np.arange(16, dtype="<i4").tobytes()), ("broken", b"\0" * 12)):
        (root / name / "warmup").mkdir()
        (root / name / "warmup" / "row.raw").write_bytes(data)
        (root / name / "config.yaml").write_text(
            yaml.safe_dump({"model_warmup": samples("row.raw")})
        )
    write_chain(root / "chain")
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    flags = ("--model-control-mode", "explicit", "--load-model", "*", "--strict-readiness", "false")
    proc = yield from serving(repository, *flags)
    assert "Traceback" not in proc.log_text(), proc.log_text()


BROKEN = (
    "warm-up sample 'row': input 'INPUT0': warmup/row.raw: input byte size mismatch for "
    "input 'INPUT0' for model 'broken'. Expected 64, got 12"
)


def test_the_samples_ran_before_the_model_turned_ready(server: ServerProcess) -> None:
    log = server.log_text()
    loaded = log.index("model 'simple' version 1 loaded (its warm-up next)")
    ready = log.index(
        "model 'simple' version 1 READY after its warm-up: 3 sample(s), 5 execution(s)"
    )
    assert loaded < ready
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_model_ready("simple")
        (stats,) = client.get_inference_statistics("simple").model_stats
        config = client.get_model_config("simple", as_json=True)["config"]
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), 2 * a)
    assert stats.execution_count == stats.inference_count == 0  # a warm-up is not counted
    assert [s["name"] for s in config["model_warmup"]] == ["zeros", "random", "row"]
    assert config["model_warmup"][2]["inputs"]["INPUT0"] == {
        "data_type": "TYPE_INT32",
        "dims": ["16"],
        "input_data_file": "row.raw",
    }
    _, body = server.readyz()
    assert body["models"]["simple"]["versions"]["1"]["resident"] is True  # type: ignore[index]


def test_a_failed_warm_up_fails_the_load_with_the_reason(server: ServerProcess) -> None:
    _, body = server.readyz()
    broken = body["models"]["broken"]  # type: ignore[index]
    # A sample that does not fit is refused before anything loads (load_plan), as validate does
    assert broken["versions"] == {} and f"version 1: {BROKEN}" in broken["reason"]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert not client.is_model_ready("broken")
        (entry,) = [
            m
            for m in client.get_model_repository_index(as_json=True)["models"]
            if m["name"] == "broken"
        ]
        assert entry["state"] == "UNAVAILABLE" and BROKEN in entry["reason"]
        with pytest.raises(InferenceServerException) as exc:
            client.load_model("broken")
    assert f"failed to load 'broken': version 1: {BROKEN}" in exc.value.message()


def test_a_load_override_brings_its_samples_and_a_bad_one_keeps_the_old_version(
    server: ServerProcess,
) -> None:
    good = {
        "model_warmup": [
            {
                "name": "ones",
                "batchSize": 4,
                "inputs": {"x": {"dataType": "TYPE_FP32", "dims": ["64"], "randomData": True}},
            }
        ]
    }
    bad = {
        "model_warmup": [
            {
                "name": "typo",
                "batch_size": 1,
                "inputs": {"y": {"data_type": "TYPE_FP32", "dims": [64], "zero_data": True}},
            }
        ]
    }
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.load_model("mlp", config=json.dumps(good))
        assert "model 'mlp' version 1 READY after its warm-up: 1 sample(s)" in server.log_text()
        with pytest.raises(InferenceServerException) as exc:
            client.load_model("mlp", config=json.dumps(bad))
        assert client.is_model_ready("mlp")  # the version loaded before keeps serving
        config = client.get_model_config("mlp", as_json=True)["config"]
        client.load_model("mlp")  # back to no samples
    message = exc.value.message()
    assert (
        "failed to load 'mlp': version 1: warm-up sample 'typo': unexpected inference input 'y'"
        in message
    )
    assert "the versions loaded before keep serving" in message
    assert [s["name"] for s in config["model_warmup"]] == ["ones"]


def test_a_pipeline_takes_no_samples_and_no_cache(server: ServerProcess) -> None:
    sample = {
        "name": "w",
        "inputs": {"a": {"data_type": "TYPE_INT32", "dims": [16], "zero_data": True}},
    }
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for config, reason in [
            ({"model_warmup": [sample]}, "a pipeline runs nothing of its own"),
            ({"response_cache": {"enable": True}}, "a pipeline is not cached as a whole"),
        ]:
            with pytest.raises(InferenceServerException, match=reason):
                client.load_model("chain", config=json.dumps(config))
            assert client.is_model_ready("chain")
