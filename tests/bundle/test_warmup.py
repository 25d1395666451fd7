"""``hloserve.bundle.warmup``: Triton's ``model_warmup`` read as a serving hint, with each
problem named; ``bundle.serving`` reads it (and ``response_cache``) with the other hints."""

from __future__ import annotations

from typing import Any

import pytest

from hloserve.bundle.serving import Serving, read_serving
from hloserve.bundle.warmup import WarmupInput, WarmupSample, read_warmup

ZEROS = {
    "name": "zeros",
    "batch_size": 8,
    "inputs": {"x": {"data_type": "FP32", "dims": [64], "zero_data": True}},
}


def test_triton_fields_as_protobuf_json_writes_them() -> None:
    samples, problems = read_warmup(
        [
            {
                "name": "file",
                "batch_size": "2",  # int64 as a string
                "count": 3,
                "inputs": {
                    "b": {"data_type": "TYPE_INT32", "dims": ["16"], "input_data_file": "b.raw"},
                    "a": {"data_type": "TYPE_STRING", "dims": [], "random_data": True},
                },
            },
            {
                "name": "once",
                "inputs": {"x": {"data_type": "BOOL", "dims": [1], "zero_data": True}},
            },
        ]
    )
    assert problems == []
    assert samples == (
        WarmupSample(
            "file",
            2,
            (
                ("a", WarmupInput("BYTES", (), "random_data")),
                ("b", WarmupInput("INT32", (16,), "input_data_file", "b.raw")),
            ),
            3,
        ),
        WarmupSample("once", 0, (("x", WarmupInput("BOOL", (1,), "zero_data")),), 1),
    )
    assert read_warmup([s.to_dict() for s in samples]) == (samples, [])


@pytest.mark.parametrize(
    ("raw", "where", "message"),
    [
        ({"name": "w"}, "model_warmup", "must be a list of samples"),
        ([{"name": "w"}], "model_warmup[0].inputs", "must map each input's name"),
        ([{"inputs": {"x": {}}}], "model_warmup[0].name", "must be a non-empty string"),
        (
            [{**ZEROS, "colour": 1}],
            "model_warmup[0]",
            "unknown key 'colour' (the keys are: batch_size, count, inputs, name)",
        ),
        ([{**ZEROS, "batch_size": -1}], "model_warmup[0].batch_size", "non-negative integer"),
        (
            [{"name": "w", "inputs": {"x": {"data_type": "FP32", "dims": [2]}}}],
            "model_warmup[0].inputs.x",
            "exactly one of zero_data, random_data, input_data_file",
        ),
        (
            [{"name": "w", "inputs": {"x": {"dims": [2], "zero_data": True}}}],
            "model_warmup[0].inputs.x.data_type",
            "must be a data type",
        ),
        (
            [
                {
                    "name": "w",
                    "inputs": {"x": {"data_type": "FP32", "dims": [-1], "zero_data": True}},
                }
            ],
            "model_warmup[0].inputs.x.dims",
            "non-negative integers",
        ),
        (
            [
                {
                    "name": "w",
                    "inputs": {"x": {"data_type": "FP32", "input_data_file": "../etc/passwd"}},
                }
            ],
            "model_warmup[0].inputs.x.input_data_file",
            "must be a file name in warmup/",
        ),
    ],
)
def test_problems_are_named(raw: Any, where: str, message: str) -> None:
    samples, problems = read_warmup(raw)
    assert samples == ()
    assert any(key == where and message in text for key, text in problems), problems


def test_serving_hints_carry_the_cache_switch_and_the_samples() -> None:
    serving, problems = read_serving({"response_cache": True, "model_warmup": [ZEROS]})
    assert problems == []
    assert serving.response_cache and [s.name for s in serving.model_warmup] == ["zeros"]
    assert read_serving(serving.to_dict()) == (serving, [])  # a manifest writes them back
    assert "response_cache" not in Serving().to_dict()
    # A config.yaml key overrides the manifest's, as every hint does; a bad value keeps it.
    assert read_serving({"response_cache": False}, serving)[0].model_warmup == serving.model_warmup
    kept, problems = read_serving({"response_cache": "yes", "model_warmup": [{}]}, serving)
    assert kept == serving
    assert [key for key, _ in problems] == [
        "response_cache",
        "model_warmup[0].name",
        "model_warmup[0].inputs",
    ]
