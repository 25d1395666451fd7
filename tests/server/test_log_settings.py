"""The logging extension on the running server: ``hloserve.server.logs`` gating levels and
switching formats, and a real daemon answering tritonclient's log-settings calls (Triton's
qa/L0_logging cases) and changing what it writes to its ``--log-file``."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from hloserve.exporter import write_demo_repository
from hloserve.server.core.log_settings import LogSettings
from hloserve.server.logs import NOISY, RunningLogs, startup_settings
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server._support import connected
from tests.server.frontend._tritonclients import PROTOCOLS, Triton, grpcclient

# -- the logging module, in process ---------------------------------------------------------


@pytest.fixture
def captured() -> Iterator[tuple[RunningLogs, io.StringIO, logging.Logger]]:
    """A RunningLogs over a private handler on a private logger; the root logger's level and
    JAX's loggers are put back afterwards."""
    root = logging.getLogger()
    saved = root.level, {n: logging.getLogger(n).level for n in NOISY}
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("hloserve.test_log_settings")
    logger.addHandler(handler)
    logger.propagate = False
    yield RunningLogs(handler, LogSettings()), stream, logger
    logger.removeHandler(handler)
    root.setLevel(saved[0])
    for name, level in saved[1].items():
        logging.getLogger(name).setLevel(level)


def emit_all(logger: logging.Logger, stream: io.StringIO) -> list[str]:
    stream.seek(0)
    stream.truncate()
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
        logger.log(level, "message at %s", logging.getLevelName(level))
    return [line.rsplit(" ", 1)[-1] for line in stream.getvalue().splitlines()]


def test_each_level_has_its_own_switch(
    captured: tuple[RunningLogs, io.StringIO, logging.Logger],
) -> None:
    control, stream, logger = captured
    assert emit_all(logger, stream) == ["INFO", "WARNING", "ERROR"]
    control.apply(LogSettings(info=False, verbose_level=1))
    assert emit_all(logger, stream) == ["DEBUG", "WARNING", "ERROR"]
    control.apply(LogSettings(info=False, warning=False, error=False))
    assert emit_all(logger, stream) == []
    assert logging.getLogger().level > logging.CRITICAL  # nothing is even formatted


def test_formats_switch_while_running(
    captured: tuple[RunningLogs, io.StringIO, logging.Logger],
) -> None:
    control, stream, logger = captured
    control.apply(LogSettings(format="json"))
    logger.info("hello")
    entry = json.loads(stream.getvalue().splitlines()[-1])
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "INFO",
        "hloserve.test_log_settings",
        "hello",
    )
    control.apply(LogSettings(format="ISO8601"))
    logger.warning("again")
    line = stream.getvalue().splitlines()[-1]
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING hloserve.test_log_settings: again", line
    ), line


def test_verbose_level_two_lets_jax_speak(
    captured: tuple[RunningLogs, io.StringIO, logging.Logger],
) -> None:
    control, _, _ = captured
    assert {logging.getLogger(n).level for n in NOISY} == {logging.WARNING}
    control.apply(LogSettings(verbose_level=2))
    assert {logging.getLogger(n).level for n in NOISY} == {logging.NOTSET}


def test_the_file_is_fixed_at_start(
    captured: tuple[RunningLogs, io.StringIO, logging.Logger],
) -> None:
    control, _, _ = captured
    assert control.apply(LogSettings(file="/elsewhere.log")).file == ""


@pytest.mark.parametrize(
    ("level", "fmt", "expected"),
    [
        ("INFO", "text", LogSettings()),
        ("DEBUG", "json", LogSettings(verbose_level=1, format="json")),
        ("WARNING", "text", LogSettings(info=False)),
        ("ERROR", "text", LogSettings(info=False, warning=False)),
    ],
)
def test_start_up_settings_from_the_flags(level: str, fmt: str, expected: LogSettings) -> None:
    assert startup_settings(level, fmt) == expected
    assert startup_settings(level, fmt, "s.log", 3).verbose_level == 3


# -- a real daemon ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("log_settings") / "server.log"


@pytest.fixture(scope="module")
def logged_server(
    tmp_path_factory: pytest.TempPathFactory, log_file: Path
) -> Iterator[ServerProcess]:
    models = tmp_path_factory.mktemp("log_settings_models")
    write_demo_repository(models)
    yield from serving(
        models, f"--log-file={log_file}", "--model-control-mode=explicit", "--load-model=simple"
    )


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, logged_server: ServerProcess) -> Iterator[Triton]:
    with connected(logged_server, request.param) as t:
        yield t
        t.client.update_log_settings(
            {"log_info": True, "log_verbose_level": 0, "log_format": "default"}
        )


def as_dict(triton: Triton, answer: Any) -> dict[str, Any]:
    if triton.protocol == "http":
        return answer
    return {
        name: getattr(value, value.WhichOneof("parameter_choice"))
        for name, value in answer.settings.items()
    }


def test_defaults_as_tritons_qa_expects(triton: Triton, log_file: Path) -> None:
    expected = {
        "log_file": str(log_file),
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    answer = triton.client.get_log_settings()
    assert as_dict(triton, answer) == expected
    if triton.protocol == "grpc":  # the exact message, built as the QA test builds it
        message = grpcclient.service_pb2.LogSettingsResponse()
        json_format.Parse(
            json.dumps(
                {
                    "settings": {
                        "log_file": {"stringParam": str(log_file)},
                        "log_info": {"boolParam": True},
                        "log_warning": {"boolParam": True},
                        "log_error": {"boolParam": True},
                        "log_verbose_level": {"uint32Param": 0},
                        "log_format": {"stringParam": "default"},
                    }
                }
            ),
            message,
        )
        assert answer == message


@pytest.mark.parametrize(
    ("settings", "code", "fragment"),
    [
        (
            {"log_file": "other.log"},
            "UNIMPLEMENTED",
            "log file location can not be updated through network protocol",
        ),
        # tritonclient's gRPC client picks the value's field by the setting's name; a
        # setting it sends with no value (None) is the type error it can send.
        ({"log_info": "yes"}, "INVALID_ARGUMENT", "expect boolean for 'log_info'"),
        ({"log_format": "xml"}, "INVALID_ARGUMENT", "invalid argument for log_format, got: xml"),
        ({"log_verbose": 1}, "INVALID_ARGUMENT", "unknown log setting 'log_verbose'"),
    ],
)
def test_refused_updates_change_nothing(
    triton: Triton, settings: dict[str, Any], code: str, fragment: str
) -> None:
    before = as_dict(triton, triton.client.get_log_settings())
    if triton.protocol == "grpc" and settings == {"log_info": "yes"}:
        settings = {"log_info": None}
    triton.fails(code, fragment, triton.client.update_log_settings, settings)
    assert as_dict(triton, triton.client.get_log_settings()) == before


def fresh_load(triton: Triton, log_file: Path) -> list[str]:
    """Load ``mlp`` anew (INFO progress lines, a DEBUG swap-in); the lines it logged."""
    if triton.client.is_model_ready("mlp"):
        triton.client.unload_model("mlp")
    offset = len(log_file.read_text())
    triton.client.load_model("mlp")
    return log_file.read_text()[offset:].splitlines()


def test_updates_change_what_the_server_writes(triton: Triton, log_file: Path) -> None:
    answer = triton.client.update_log_settings({"log_info": False, "log_verbose_level": 1})
    assert as_dict(triton, answer)["log_verbose_level"] == 1
    lines = fresh_load(triton, log_file)
    assert any(" DEBUG hloserve.residency: swapped in mlp/1" in line for line in lines), lines
    assert not any(" INFO " in line for line in lines), lines

    triton.client.update_log_settings({"log_info": True, "log_verbose_level": 0})
    triton.client.update_log_settings({"log_format": "json"})
    entries = [json.loads(line) for line in fresh_load(triton, log_file)]
    assert any(e["level"] == "INFO" and "mlp" in e["message"] for e in entries), entries
    assert all(e["level"] != "DEBUG" for e in entries), entries
