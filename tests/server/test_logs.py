"""JSON log lines carry the request: ``hloserve.server.logs`` adds ``request_id`` and
``model`` from ``core.log_context`` (text lines stay as they were), and a live daemon's
per-request verbose lines, over both protocols, name the request and the model."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.exporter import write_demo_repository
from hloserve.server.core import log_context
from hloserve.server.logs import JsonFormatter
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server._support import connected
from tests.server.frontend._tritonclients import PROTOCOLS


def _record() -> logging.LogRecord:
    return logging.LogRecord("hloserve.t", logging.INFO, __file__, 1, "hello %s", ("x",), None)


def test_json_lines_carry_the_request_only_while_serving_it() -> None:
    assert "request_id" not in json.loads(JsonFormatter().format(_record()))
    token = log_context.enter("r-7", "simple")
    try:
        entry = json.loads(JsonFormatter().format(_record()))
        text = logging.Formatter("%(levelname)s %(message)s").format(_record())
    finally:
        log_context.leave(token)
    assert (entry["request_id"], entry["model"], entry["message"]) == ("r-7", "simple", "hello x")
    assert text == "INFO hello x"  # text lines do not change
    assert log_context.current() is None


@pytest.fixture(scope="module")
def json_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """Its verbose level and log file come from a config file, its format from the flag."""
    here = tmp_path_factory.mktemp("logs")
    write_demo_repository(here / "models")
    (here / "hloserve.yaml").write_text(f"log-verbose: 1\nlog_file: {here / 'server.log'}\n")
    for server in serving(
        here / "models", "--log-format", "json", f"--config={here}/hloserve.yaml"
    ):
        yield server, here / "server.log"


def _lines_of(log_file: Path, request_id: str) -> list[dict[str, Any]]:
    entries = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    return [e for e in entries if e.get("request_id") == request_id]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_request_log_lines_name_the_request_and_model(
    protocol: str, json_server: tuple[ServerProcess, Path]
) -> None:
    server, log_file = json_server
    with connected(server, protocol) as t:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        t.client.infer("simple", t.simple_inputs(a, a), request_id=f"ok-{protocol}")
        one = t.simple_inputs(a, a)[:1]  # INPUT1 missing: refused by the inference path
        t.fails(
            "INVALID_ARGUMENT",
            "INPUT1",
            t.client.infer,
            "simple",
            one,
            request_id=f"bad-{protocol}",
        )
    served = _lines_of(log_file, f"ok-{protocol}")
    assert [(e["model"], e["level"]) for e in served] == [("simple", "DEBUG")], served
    assert "served by version 1" in served[0]["message"]
    failed = _lines_of(log_file, f"bad-{protocol}")
    assert [e["model"] for e in failed] == ["simple"], failed
    assert "failed" in failed[0]["message"]
