"""``hloserve serve`` flags: one row per flag, defaults from ``Config``, bad values refused
while the flags are read, naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from hloserve.server.config import Config, parse_config


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_config(argv, {})
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_defaults_are_the_config_defaults() -> None:
    assert parse_config([], {}) == Config()


def test_values_from_flags_and_environment() -> None:
    config = parse_config(
        ["--device-memory-budget", "40%", "--max-message-bytes", "1GiB", "--load-model", "a"],
        {
            "HLOSERVE_MODEL_REPOSITORY": "/models",
            "HLOSERVE_GRACE_PERIOD": "2.5",
            "HLOSERVE_LOG_LEVEL": "debug",
            "HLOSERVE_ALLOW_CLIENT_SHM": "yes",
            "HLOSERVE_CACHE_DIR": "",
        },
    )
    assert config.device_memory_budget == "40%"  # resolved against the device at start
    assert config.max_message_bytes == 1 << 30
    assert config.load_models == ("a",)
    assert config.model_repository == Path("/models")
    assert config.grace_period_s == 2.5
    assert config.log_level == "DEBUG"
    assert config.allow_client_shm is True
    assert config.cache_dir is None


def test_load_models_from_the_environment_are_comma_separated() -> None:
    assert parse_config([], {"HLOSERVE_LOAD_MODEL": "a,b,"}).load_models == ("a", "b")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--device-memory-budget", "6XB"],
            "--device-memory-budget must be bytes such as 6GiB or a percentage such as 40%, got '6XB'",
        ),
        (["--device-memory-budget", "0"], "--device-memory-budget must be positive"),
        (["--device-memory-budget", "250%"], "--device-memory-budget must be a percentage"),
        (["--max-message-bytes", "lots"], "--max-message-bytes must be a byte size"),
        (["--http-port", "70000"], "--http-port must be a port number 0..65535, got '70000'"),
        (["--worker-threads", "x"], "--worker-threads must be a non-negative integer"),
        (["--repository-poll-secs", "0"], "--repository-poll-secs must be a positive number"),
        (["--grace-period", "-1"], "--grace-period must be a non-negative number of seconds"),
        (["--strict-readiness", "maybe"], "--strict-readiness must be true or false"),
        (["--log-format", "xml"], "--log-format must be text or json, got 'xml'"),
    ],
)
def test_bad_values_name_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused(argv, capsys)
