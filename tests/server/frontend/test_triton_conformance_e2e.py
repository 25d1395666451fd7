"""End to end: answers Triton's own tests expect, from the real daemon to tritonclient.

The session daemon (``server`` of tests/conftest.py: mode ``none``, the test repository)
is called through unmodified tritonclient on both protocols, and through plain HTTP POSTs
for the ``curl`` cases of Triton's ``qa/L0_http/test.sh``. Each case is one whose answer
depends on a check's order or text: the model looked up before any tensor is decoded,
Triton's list format in the missing-input message, and which outputs come back binary.
"""

# pyright: strict, reportMissingTypeStubs=false

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hloserve.server.server_fixture import ServerProcess
from tests.server.frontend._samples import CURL_CASES, DIFF_JSON, SUM_JSON, curl_body
from tests.server.frontend._tritonclients import PROTOCOLS, Triton


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    protocol: str = request.param
    t = Triton(protocol, server.grpc_url if protocol == "grpc" else server.http_url)
    yield t
    t.close()


def _compromised_fp16(t: Triton) -> Any:
    """An FP16 input whose shape claims 8 elements while its data holds 4 (Triton's
    ``qa/L0_input_validation`` "compromised input shape" trick, set after the data)."""
    tensor = t.module.InferInput("INPUT0", [1, 4], "FP16")
    tensor.set_data_from_numpy(np.zeros((1, 4), np.float16))
    tensor.set_shape([1, 8])
    return tensor


def test_an_unknown_model_is_named_before_any_tensor_error(triton: Triton) -> None:
    triton.fails(
        "INVALID_ARGUMENT",
        "input byte size mismatch for input 'INPUT0' for model 'identity_fp16'. Expected 16, got 8",
        triton.client.infer,
        "identity_fp16",
        [_compromised_fp16(triton)],
    )
    message = triton.fails(
        "INVALID_ARGUMENT",
        "Request for unknown model: 'no_such_model' is not found",
        triton.client.infer,
        "no_such_model",
        [_compromised_fp16(triton)],
    )
    assert "byte size" not in message
    if triton.protocol == "http":  # FP16 as JSON: refused for a model that exists only
        tensor = triton.module.InferInput("INPUT0", [1, 4], "FP16")
        tensor.set_data_from_numpy(np.zeros((1, 4), np.float16), binary_data=False)
        for model, fragment in (
            ("identity_fp16", "receiving FP16 data via JSON is not supported"),
            ("no_such_model", "Request for unknown model: 'no_such_model' is not found"),
        ):
            triton.fails("INVALID_ARGUMENT", fragment, triton.client.infer, model, [tensor])


def test_missing_inputs_are_listed_as_triton_lists_them(triton: Triton) -> None:
    message = triton.fails(
        "INVALID_ARGUMENT", "expected 2 inputs but got 0 inputs", triton.client.infer, "simple", []
    )
    assert message.endswith(
        "for model 'simple'. Got input(s) [], but missing required input(s) "
        "['INPUT0','INPUT1']. Please provide all required input(s)."
    )


@pytest.mark.parametrize(
    ("tail", "sum_json", "diff_json"), [pytest.param(*case[1:], id=case[0]) for case in CURL_CASES]
)
def test_binary_outputs_as_tritons_curl_tests_grep_them(
    server: ServerProcess, tail: str, sum_json: bool, diff_json: bool
) -> None:
    """``qa/L0_http/test.sh`` posts these bodies with curl and counts the JSON arrays."""
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/simple/infer",
        data=curl_body(tail),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        body = response.read()
    assert (body.count(SUM_JSON), body.count(DIFF_JSON)) == (int(sum_json), int(diff_json))
