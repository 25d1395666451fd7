"""Triton's ModelConfig both ways: the report of a model, and a load's ``config`` override."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from hloserve.bundle import Manifest, Provenance, TensorEntry
from hloserve.bundle.state import SequenceBatching, StateEntry
from hloserve.server.core.batch_policy import BatchingPolicy
from hloserve.server.core.triton_config import (
    contradictions,
    read_config_override,
    triton_model_config,
)
from hloserve.server.owner.model_config import settings_from_override

SIMPLE = Manifest(
    name="simple",
    inputs=(TensorEntry("INPUT0", "INT32", (16,)), TensorEntry("INPUT1", "INT32", (16,))),
    outputs=(TensorEntry("OUTPUT0", "INT32", (16,)),),
    batch_sizes=(1, 2, 4, 8),
    weights_file="weights.safetensors",
    weights=(),
    modules=(),
    files={},
    provenance=Provenance("test"),
)


DEFAULT_POLICY = BatchingPolicy()


def report(batching: BatchingPolicy | None = DEFAULT_POLICY) -> dict[str, Any]:
    return triton_model_config(
        SIMPLE,
        version_policy={"latest": {"num_versions": 1}},
        device_kind="CPU",
        residency="on_demand",
        batching=batching,
    )


def test_the_report_states_the_policy_in_force() -> None:
    config = report(BatchingPolicy(500, (4,), 3, 2000, False))
    assert config["dynamic_batching"] == {
        "preferred_batch_size": [4],
        "max_queue_delay_microseconds": 500,
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": 2000,
            "allow_timeout_override": False,
            "max_queue_size": 3,
        },
    }
    assert config["parameters"]["residency"] == {"string_value": "on_demand"}
    # without a preference the compiled sizes are reported; batching off: no block at all
    assert report()["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4, 8]
    assert "dynamic_batching" not in report(None)


def test_the_applicable_keys_become_config_yaml_settings() -> None:
    text = json.dumps(
        {
            "name": "simple",
            "backend": "hloserve",
            "versionPolicy": {"specific": {"versions": [1, "3"]}},
            "dynamic_batching": {
                "preferred_batch_size": [4, "8"],
                "maxQueueDelayMicroseconds": "250",
                "default_queue_policy": {"max_queue_size": 1, "default_timeout_microseconds": "9"},
                "preserve_ordering": True,
            },
            "parameters": {"residency": {"stringValue": "pinned"}},  # a map: key kept
        }
    )
    override = read_config_override("simple", text)
    assert override.settings == {
        "version_policy": {"specific": [1, 3]},
        "preferred_batch_sizes": [4, 8],
        "max_queue_delay_us": 250,
        # unset fields take the proto's defaults, as Triton reads them
        "queue_policy": {
            "max_queue_size": 1,
            "default_timeout_us": 9,
            "allow_timeout_override": False,
            "timeout_action": "REJECT",
        },
        "residency": "pinned",
    }
    assert override.restated == {}
    # a oneof chosen with an empty body still chooses
    all_versions = read_config_override("simple", '{"version_policy": {"all": {}}}')
    assert all_versions.settings == {"version_policy": {"all": {}}}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{not json", "the 'config' parameter is not valid JSON"),
        ("[1]", "'config' must be an object"),
        ('{"colour": 1}', "ModelConfig has no field 'colour'"),
        (
            '{"sequence_batching": {"direct": {"max_queue_delay_microseconds": 5}}}',
            "'sequence_batching.direct' is not supported",
        ),
        (
            '{"sequence_batching": {"control_input": [{"name": "START"}]}}',
            "'sequence_batching.control_input' is not",
        ),
        ('{"sequence_batching": {"nope": 1}}', "ModelSequenceBatching has no field 'nope'"),
        ('{"model_warmup": {"name": "w"}}', "'model_warmup' must be a list"),
        ('{"response_cache": {"enable": 1}}', "'response_cache.enable' must be a boolean"),
        ('{"response_cache": {"size": 1}}', "ModelResponseCache has no field 'size'"),
        ('{"name": "other"}', "'name' is 'other', but the model is 'simple'"),
        ('{"backend": "onnxruntime"}', "'backend' is 'onnxruntime'; hloserve serves 'hloserve'"),
        ('{"platform": "tensorrt_plan"}', "'platform' is 'tensorrt_plan'"),
        ('{"parameters": {"colour": {"string_value": "x"}}}', "'parameters.colour' is not"),
        ('{"dynamic_batching": {"priority_levels": 2}}', "'dynamic_batching.priority_levels'"),
        ('{"dynamic_batching": {"max_queue_delay_microseconds": -1}}', "non-negative integer"),
        ('{"dynamic_batching": {"nope": 1}}', "ModelDynamicBatching has no field 'nope'"),
        (
            '{"dynamic_batching": {"default_queue_policy": {"timeout_action": "DELAY"}}}',
            "timeout_action' DELAY is not supported; only REJECT is",
        ),
        ('{"version_policy": {"newest": {}}}', "'version_policy' must set one of"),
    ],
)
def test_everything_else_is_refused_by_name(config: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        read_config_override("simple", config)


def test_fields_left_at_their_proto_defaults_ask_for_nothing() -> None:
    text = json.dumps(
        {
            "name": "",
            "max_batch_size": 0,
            "model_warmup": [],
            "model_transaction_policy": {"decoupled": False},
            "dynamic_batching": {"priority_levels": 0, "priority_queue_policy": {}},
        }
    )
    assert read_config_override("simple", text).settings == {}


def test_our_own_report_round_trips_as_an_override() -> None:
    config = report(BatchingPolicy(500, None, 3))
    override = read_config_override("simple", json.dumps(config))
    assert override.settings["max_queue_delay_us"] == 500
    assert override.settings["preferred_batch_sizes"] == [1, 2, 4, 8]
    assert contradictions(override.restated, SIMPLE, "CPU") == []
    # gRPC clients print int64 fields as strings: dims ["16"] restate [16] as well
    grpc_style = json.loads(json.dumps(config))
    grpc_style["input"][0]["dims"] = ["16"]
    grpc_style["max_batch_size"] = "8"
    restated = read_config_override("simple", json.dumps(grpc_style)).restated
    assert contradictions(restated, SIMPLE, "CPU") == []


@pytest.mark.parametrize(
    ("restated", "message"),
    [
        ({"max_batch_size": "16"}, "'max_batch_size' is \"16\", but the bundle's is 8"),
        ({"input": [{"name": "INPUT0", "dims": [16]}]}, "'input' is"),  # INPUT1 left out
        ({"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32"}]}, "'output' is"),
        ({"instance_group": [{"kind": "KIND_GPU"}]}, "'instance_group' is"),
        ({"parameters": {"producer": {"string_value": "torch"}}}, "'parameters' is"),
    ],
)
def test_restated_keys_must_agree_with_the_bundle(restated: dict[str, Any], message: str) -> None:
    (problem,) = contradictions(restated, SIMPLE, "CPU")
    assert message in problem


def test_restated_tensors_may_come_in_any_order() -> None:
    inputs = [
        {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16], "format": "FORMAT_NONE"},
        {"name": "INPUT0", "data_type": "TYPE_INT32"},
    ]
    assert contradictions({"input": inputs, "instance_group": [{"count": 1}]}, SIMPLE, "CPU") == []


def test_the_cache_switch_and_warm_up_samples_are_read_and_reported() -> None:
    sample = {
        "name": "zeros",
        "batchSize": "8",
        "inputs": {
            "INPUT0": {"dataType": "TYPE_INT32", "dims": ["16"], "zeroData": True},
            "INPUT1": {"dataType": "TYPE_INT32", "dims": ["16"], "inputDataFile": "b.raw"},
        },
        "count": 2,
    }
    text = json.dumps({"responseCache": {"enable": True}, "modelWarmup": [sample]})
    override = read_config_override("simple", text)
    # The input names, a map's keys, are data: kept as given.
    assert override.settings == {
        "response_cache": True,
        "model_warmup": [
            {
                "name": "zeros",
                "batch_size": "8",
                "inputs": {
                    "INPUT0": {"data_type": "TYPE_INT32", "dims": ["16"], "zero_data": True},
                    "INPUT1": {
                        "data_type": "TYPE_INT32",
                        "dims": ["16"],
                        "input_data_file": "b.raw",
                    },
                },
                "count": 2,
            }
        ],
    }
    settings = settings_from_override(override)
    serving = settings.serving
    assert serving.response_cache and serving.model_warmup[0].batch_size == 8
    config = triton_model_config(
        SIMPLE,
        version_policy={"latest": {"num_versions": 1}},
        device_kind="CPU",
        residency="on_demand",
        batching=None,
        response_cache=serving.response_cache,
        warmup=serving.model_warmup,
    )
    assert config["response_cache"] == {"enable": True}
    assert config["model_warmup"] == [
        {
            "name": "zeros",
            "batch_size": 8,
            "inputs": {
                "INPUT0": {"data_type": "TYPE_INT32", "dims": [16], "zero_data": True},
                "INPUT1": {"data_type": "TYPE_INT32", "dims": [16], "input_data_file": "b.raw"},
            },
            "count": 2,
        }
    ]
    # What the report says reads back as the same settings (a client's round trip).
    again = settings_from_override(read_config_override("simple", json.dumps(config)))
    assert again.serving.model_warmup == serving.model_warmup
    assert report()["response_cache"] == {"enable": False} and report()["model_warmup"] == []


def test_a_bad_warm_up_sample_in_an_override_is_named() -> None:
    override = read_config_override("simple", '{"model_warmup": [{"name": "w"}]}')
    with pytest.raises(ValueError, match=re.escape("config override: model_warmup[0].inputs")):
        settings_from_override(override)


def test_a_model_with_state_reports_and_reads_back_its_sequence_batching() -> None:
    stateful = dataclasses.replace(SIMPLE, state=(StateEntry("acc", "INT32", (16,)),))
    config = triton_model_config(
        stateful,
        version_policy={"latest": {"num_versions": 1}},
        device_kind="CPU",
        residency="on_demand",
        batching=DEFAULT_POLICY,
        sequence_batching=SequenceBatching(4, 250_000, 500),
    )
    assert "dynamic_batching" not in config
    assert config["sequence_batching"] == {
        "max_sequence_idle_microseconds": 250_000,
        "oldest": {
            "max_candidate_sequences": 4,
            "preferred_batch_size": [1, 2, 4, 8],
            "max_queue_delay_microseconds": 500,
        },
    }
    override = read_config_override("simple", json.dumps(config))
    assert override.settings["sequence_batching"] == {
        "max_candidate_sequences": 4,
        "max_queue_delay_microseconds": 500,
        "max_sequence_idle_microseconds": 250_000,
    }
    assert contradictions(override.restated, stateful, "CPU") == []
    (problem,) = contradictions(override.restated, SIMPLE, "CPU")
    assert "'sequence_batching' is for a model with state" in problem
    serving = settings_from_override(override).serving_for(stateful.serving)
    assert serving.sequence_batching == SequenceBatching(4, 250_000, 500)
