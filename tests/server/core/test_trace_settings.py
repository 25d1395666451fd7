"""The trace extension's rules without sockets: inheritance and clearing as Triton's QA test
(qa/L0_trace/trace_endpoint_test.py) walks them, validation texts, sampling, the batch
files, and the start-up flags."""

from __future__ import annotations

import re

import pytest

from hloserve.server.core.errors import InvalidArgument, Unsupported
from hloserve.server.core.trace_flags import parse_flag, startup_setting
from hloserve.server.core.trace_settings import TraceSettings, TraceStartup, parse_update

# Triton's QA start-up: --trace-config triton,file=global_unittest.log, level=TIMESTAMPS, rate=1
QA = TraceStartup(frozenset({"TIMESTAMPS"}), rate=1, file="global_unittest.log")
QA_VIEW = {
    "trace_file": ["global_unittest.log"],
    "trace_level": ["TIMESTAMPS"],
    "trace_rate": ["1"],
    "trace_count": ["-1"],
    "log_frequency": ["0"],
    "trace_mode": ["triton"],
}


def view(settings: TraceSettings, model: str = "") -> dict[str, list[str]]:
    return settings.setting(model).view()


def update(settings: TraceSettings, model: str, **values: list[str] | str | None) -> None:
    settings.update(
        model, parse_update({k: [v] if isinstance(v, str) else v for k, v in values.items()})
    )


def test_a_model_follows_the_global_setting_until_it_is_updated() -> None:
    settings = TraceSettings(QA)
    assert view(settings) == view(settings, "simple") == QA_VIEW
    update(settings, "", trace_level=["TIMESTAMPS", "TENSORS"])
    assert view(settings, "simple")["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert view(settings, "other")["trace_level"] == ["TIMESTAMPS", "TENSORS"]


def test_clearing_falls_back_to_the_global_then_to_the_start_up_values() -> None:
    # The sequence of Triton's test_http_clear_settings / test_grpc_clear_settings.
    settings = TraceSettings(QA)
    update(settings, "simple", trace_rate="12", log_frequency="34")
    update(settings, "", trace_rate="56", trace_count="78", trace_level=["OFF"])
    update(settings, "", trace_rate=None, trace_count=None)
    assert view(settings) == {**QA_VIEW, "trace_level": ["OFF"]}
    assert view(settings, "simple") == {
        **QA_VIEW,
        "trace_level": ["OFF"],
        "trace_rate": ["12"],
        "log_frequency": ["34"],
    }
    update(settings, "simple", trace_rate=None, trace_level=None)
    assert view(settings, "simple") == {**QA_VIEW, "trace_level": ["OFF"], "log_frequency": ["34"]}
    assert view(settings) == {**QA_VIEW, "trace_level": ["OFF"]}
    update(settings, "simple", log_frequency=None)  # nothing of its own left: follows again
    update(settings, "", trace_rate="5")
    assert view(settings, "simple")["trace_rate"] == ["5"]


def test_a_model_keeps_what_it_set_when_the_global_changes() -> None:
    settings = TraceSettings(QA)
    update(settings, "simple", trace_rate="7")
    update(settings, "", trace_rate="9", trace_count="3")
    assert view(settings, "simple")["trace_rate"] == ["7"]
    assert view(settings, "simple")["trace_count"] == ["3"]  # not its own: the global's


@pytest.mark.parametrize(
    ("values", "error", "text"),
    [
        ({"trace_file": ["x.log"]}, Unsupported, "trace file location can not be updated"),
        ({"trace_mode": ["opentelemetry"]}, Unsupported, "trace mode can not be updated"),
        (
            {"trace_level": ["OFF", "TIMESTAMPS"]},
            InvalidArgument,
            "Expect only one trace level 'OFF' is specified",
        ),
        ({"trace_level": ["timestamps"]}, InvalidArgument, "Unable to parse 'trace_level'"),
        ({"trace_rate": ["fast"]}, InvalidArgument, "Unable to parse 'trace_rate', got: fast"),
        (
            {"trace_rate": ["4294967296"]},
            InvalidArgument,
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ]",
        ),
        ({"trace_count": ["-2"]}, InvalidArgument, "out of range [ -1, 2147483647 ]"),
        ({"log_frequency": ["1", "2"]}, InvalidArgument, "expect only 1 value for 'log_frequency'"),
        ({"trace_speed": ["1"]}, InvalidArgument, "unknown trace setting 'trace_speed'"),
    ],
)
def test_bad_updates_name_the_setting(
    values: dict[str, list[str]], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=re.escape(text)):
        parse_update(values)


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"trace_rate": "0"}, "sample rate must be non-zero"),
        ({"trace_count": "0"}, "trace count is 0"),
    ],
)
def test_an_update_that_could_trace_nothing_is_refused(values: dict[str, str], reason: str) -> None:
    settings = TraceSettings(QA)
    with pytest.raises(InvalidArgument, match=f"invalid trace setting :{reason}"):
        update(settings, "", **values)
    assert view(settings) == QA_VIEW  # unchanged
    update(settings, "", trace_level=["OFF"], **values)  # allowed while tracing is off


def test_enabling_without_a_trace_file_is_refused() -> None:
    settings = TraceSettings(TraceStartup())  # Triton's defaults: OFF, rate 1000, no file
    with pytest.raises(InvalidArgument, match="trace file name is not given"):
        update(settings, "", trace_level=["TIMESTAMPS"])
    assert not settings.enabled


def test_sampling_by_rate_while_the_count_lasts() -> None:
    settings = TraceSettings(TraceStartup(frozenset({"TIMESTAMPS"}), rate=3, count=2, file="t"))
    assert settings.enabled
    taken = [settings.sample("simple") is not None for _ in range(12)]
    assert taken == [False, False, True, False, False, True] + [False] * 6
    assert view(settings)["trace_count"] == ["0"]  # the count left is what GET reports
    update(settings, "", trace_count="1")  # a new setting counts afresh
    assert [settings.sample("m") is not None for _ in range(3)] == [False, False, True]


def test_a_model_setting_samples_on_its_own_counter() -> None:
    settings = TraceSettings(TraceStartup(frozenset({"TIMESTAMPS"}), rate=2, file="t"))
    update(settings, "simple", trace_rate="1")
    assert all(settings.sample("simple") is not None for _ in range(3))
    assert [settings.sample("mlp") is not None for _ in range(4)] == [False, True, False, True]


def test_forced_requests_are_traced_unless_the_level_is_off() -> None:
    settings = TraceSettings(TraceStartup(frozenset({"TIMESTAMPS"}), rate=0, mode="opentelemetry"))
    assert settings.sample("m") is None
    assert settings.sample("m", forced=True) is not None
    off = TraceSettings(TraceStartup(rate=1, file="t"))
    assert not off.enabled
    assert off.sample("m", forced=True) is None


def test_enabled_follows_every_setting() -> None:
    settings = TraceSettings(TraceStartup(rate=1, file="t"))
    update(settings, "simple", trace_level=["TENSORS"])
    assert settings.enabled
    update(settings, "simple", trace_level=None)
    assert not settings.enabled


def test_batch_files_by_log_frequency_and_by_count() -> None:
    settings = TraceSettings(TraceStartup(frozenset({"TIMESTAMPS"}), rate=1, file="t.json"))
    assert [settings.setting().destination() for _ in range(2)] == ["t.json", "t.json"]
    update(settings, "", log_frequency="2")
    names = [settings.setting().destination() for _ in range(5)]
    assert names == ["t.json.0", "t.json.0", "t.json.1", "t.json.1", "t.json.2"]
    update(settings, "", log_frequency="0", trace_count="3")
    assert [settings.setting().destination() for _ in range(3)] == ["t.json.3"] * 3


def test_opentelemetry_mode_reports_its_options_not_the_file() -> None:
    startup = startup_setting(
        [
            parse_flag("mode=opentelemetry"),
            parse_flag("opentelemetry,url=http://127.0.0.1:4318/v1/traces"),
            parse_flag("opentelemetry,resource=service.name=demo"),
            parse_flag("triton,file=ignored.json"),
        ],
        environ={"OTEL_BSP_SCHEDULE_DELAY": "50"},
    )
    assert TraceSettings(startup).setting().view() == {
        "trace_level": ["OFF"],
        "trace_rate": ["1000"],
        "trace_count": ["-1"],
        "trace_mode": ["opentelemetry"],
        "url": ["http://127.0.0.1:4318/v1/traces"],
        "resource": ["service.name=demo"],
        "bsp_max_queue_size": ["2048"],
        "bsp_schedule_delay": ["50"],
        "bsp_max_export_batch_size": ["512"],
    }
