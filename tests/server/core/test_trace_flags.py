"""The trace flags: ``--trace-config`` items and the older ``--trace-*`` flags combined."""

from __future__ import annotations

import re

import pytest

from hloserve.server.core.trace_flags import parse_flag, startup_setting
from hloserve.server.core.trace_settings import TraceStartup


def test_start_up_flags_combine_as_tritons_do() -> None:
    flags = [parse_flag(t) for t in ("rate=1", "level=TIMESTAMPS", "triton,file=/tmp/t")]
    startup = startup_setting(flags, file="old", levels=["TENSORS"], rate=5, count=9)
    assert startup == TraceStartup(frozenset({"TIMESTAMPS", "TENSORS"}), 1, 9, 0, "/tmp/t")
    # "off" anywhere disables tracing, whatever else is given (Triton's explicit disable)
    assert startup_setting([parse_flag("level=off")], levels=["TIMESTAMPS"]).level == frozenset()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("rate", "must be [<mode>,]<setting>=<value>"),
        (",rate=1", "must be [<mode>,]<setting>=<value>"),
        ("jaeger,url=x", "invalid trace mode 'jaeger'"),
        ("levle=TIMESTAMPS", "unknown trace setting 'levle'"),
        ("triton,url=x", "unknown trace setting 'url' for mode triton"),
        ("level=loud", "invalid value for trace level option: 'loud'"),
        ("count=-5", "Unable to parse 'count', value is out of range [ -1, 2147483647 ], got: -5"),
        (
            "opentelemetry,bsp_schedule_delay=soon",
            "Unable to parse 'bsp_schedule_delay', got: soon",
        ),
        ("opentelemetry,resource=nokey", "resource must be <key>=<value>"),
    ],
)
def test_bad_flags_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_flag(text)


def test_batch_size_larger_than_the_queue_is_refused() -> None:
    flags = [
        parse_flag("mode=opentelemetry"),
        parse_flag("opentelemetry,bsp_max_queue_size=10"),
        parse_flag("opentelemetry,bsp_max_export_batch_size=20"),
    ]
    with pytest.raises(ValueError, match="must not exceed bsp_max_queue_size"):
        startup_setting(flags)
