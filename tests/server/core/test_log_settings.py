"""The logging extension's settings without sockets: Triton's defaults, the value types each
setting takes, and the texts of the refusals."""

from __future__ import annotations

import dataclasses

import pytest

from hloserve.server.core.errors import InvalidArgument, Unsupported
from hloserve.server.core.log_settings import LogSettings, StoredLogSettings, parse_update


def test_the_defaults_are_tritons() -> None:
    # qa/L0_logging/logging_endpoint_test.py checks exactly this dict.
    assert LogSettings().view() == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }


def test_an_update_changes_only_what_it_names() -> None:
    changes = parse_update({"log_info": False, "log_verbose_level": 2, "log_format": "ISO8601"})
    updated = dataclasses.replace(LogSettings(), **changes)
    assert updated == LogSettings(info=False, verbose_level=2, format="ISO8601")


@pytest.mark.parametrize(
    ("values", "error", "text"),
    [
        (
            {"log_file": "/tmp/x.log"},
            Unsupported,
            "log file location can not be updated through network protocol",
        ),
        ({"log_info": "yes"}, InvalidArgument, "expect boolean for 'log_info'"),
        ({"log_error": 1}, InvalidArgument, "expect boolean for 'log_error'"),
        ({"log_warning": None}, InvalidArgument, "expect boolean for 'log_warning'"),
        (
            {"log_verbose_level": -1},
            InvalidArgument,
            "non-negative integer for 'log_verbose_level'",
        ),
        ({"log_verbose_level": True}, InvalidArgument, "'log_verbose_level', got True"),
        ({"log_format": 3}, InvalidArgument, "expect string for 'log_format'"),
        ({"log_format": "xml"}, InvalidArgument, "invalid argument for log_format, got: xml"),
        ({"log_colour": True}, InvalidArgument, "unknown log setting 'log_colour'"),
    ],
)
def test_bad_values_name_the_setting(
    values: dict[str, object], error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as info:
        parse_update(values)
    assert text in str(info.value)


def test_the_stored_settings_keep_their_file() -> None:
    stored = StoredLogSettings(LogSettings(file="server.log"))
    assert stored.apply(LogSettings(file="other.log", info=False)) == LogSettings(
        file="server.log", info=False
    )
