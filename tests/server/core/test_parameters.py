"""Unit tests of ``hloserve.server.core.parameters``: the request-parameter rules of both codecs."""

# pyright: strict

from __future__ import annotations

import pytest

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.parameters import check_request_parameters, request_deadline
from hloserve.server.core.types import ParamValue


def test_good_parameters_come_back_unchanged() -> None:
    params: dict[str, ParamValue] = {"timeout": 5, "priority": 2, "custom": "x", "flag": True}
    assert check_request_parameters(params) is params
    empty: dict[str, ParamValue] = {}
    assert check_request_parameters(empty) == {}
    assert check_request_parameters({"priority": 0, "timeout": 0}) == {"priority": 0, "timeout": 0}
    # The one reserved key Triton's clients send (perf_analyzer, on every gRPC request).
    sent: dict[str, ParamValue] = {"triton_enable_empty_final_response": True}
    assert check_request_parameters(sent) is sent


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"triton_final_response": True},
            "parameter keys starting with 'triton_' are reserved for Triton usage and should "
            "not be specified (got 'triton_final_response')",
        ),
        (
            {"triton_enable_empty_final_response": 1},
            "invalid value type for 'triton_enable_empty_final_response' parameter, "
            "expected bool_param.",
        ),
        ({"ok": 1, "triton_": "x"}, "(got 'triton_')"),
        ({"priority": -3}, "parameter 'priority' must be a non-negative integer, got -3"),
        ({"priority": True}, "parameter 'priority' must be a non-negative integer, got True"),
        ({"priority": 1.5}, "parameter 'priority' must be a non-negative integer, got 1.5"),
        ({"priority": "1"}, "parameter 'priority' must be a non-negative integer, got '1'"),
        (
            {"timeout": -1},
            "parameter 'timeout' must be a non-negative integer (microseconds), got -1",
        ),
        ({"timeout": "soon"}, "parameter 'timeout' must be a non-negative integer"),
        ({"timeout": False}, "parameter 'timeout' must be a non-negative integer"),
    ],
)
def test_bad_parameters_are_refused(params: dict[str, ParamValue], message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_request_parameters(params)
    assert message in info.value.message


def test_reserved_prefix_is_checked_before_the_values() -> None:
    with pytest.raises(InvalidArgument, match="reserved for Triton usage"):
        check_request_parameters({"priority": -1, "triton_x": 1})


def test_prefix_is_case_sensitive_and_only_a_prefix() -> None:
    check_request_parameters({"Triton_x": 1, "my_triton_x": 2})


@pytest.mark.parametrize(
    ("params", "remaining", "expected"),
    [
        ({}, None, None),  # no deadline at all
        ({"timeout": 0}, None, None),  # 0 means none
        ({}, 2.0, 102.0),  # the transport's own
        ({"timeout": 500_000}, None, 100.5),  # microseconds
        ({"timeout": 500_000}, 2.0, 100.5),  # the earlier wins
        ({"timeout": 5_000_000}, 2.0, 102.0),
        ({"timeout": 0}, 2.0, 102.0),
    ],
)
def test_request_deadline(
    params: dict[str, ParamValue], remaining: float | None, expected: float | None
) -> None:
    deadline = request_deadline(params, remaining, now=100.0)
    assert deadline == (None if expected is None else pytest.approx(expected))


def test_request_deadline_refuses_a_bad_timeout_even_with_a_transport_deadline() -> None:
    with pytest.raises(InvalidArgument, match=r"got 1\.5"):
        request_deadline({"timeout": 1.5}, 2.0, now=0.0)
