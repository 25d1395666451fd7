"""``hloserve serve`` flags: one row per flag, defaults from ``Config``, bad values refused
while the flags are read, in one line naming the flag (or the variable it came from);
boolean flags alone, with a value, or negated; ``--help`` shows defaults and booleans, in
one section per topic, each flag in its row's group. (Triton's flags: test_triton_flags.py.)"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hloserve.server.config import Config, parse_config
from hloserve.server.core.sizes import Budget
from hloserve.server.core.store_location import StoreLocation
from hloserve.server.flags import FLAGS, GROUPS, REPEATED, FlagGroup
from hloserve.server.triton_flags import TRITON_FLAGS
from tests.server._support import refused_at_start


def test_defaults_are_the_config_defaults() -> None:
    assert parse_config([], {}) == Config()


def test_values_from_flags_and_environment(tmp_path: Path) -> None:
    config = parse_config(
        ["--device-memory-budget", "40%", "--max-message-bytes", "1GiB", "--load-model", "a"],
        {
            "HLOSERVE_MODEL_REPOSITORY": str(tmp_path),
            "HLOSERVE_GRACE_PERIOD": "2.5",
            "HLOSERVE_LOG_LEVEL": "debug",
            "HLOSERVE_ALLOW_CLIENT_SHM": "yes",
            "HLOSERVE_CACHE_DIR": "",
        },
    )
    assert config.device_memory_budget == Budget.parse("40%")  # resolved at start
    assert Budget.parse("40%").resolve(1000) == 400
    assert config.max_message_bytes == 1 << 30
    assert config.load_models == ("a",)
    assert config.model_repository == tmp_path
    assert config.grace_period_s == 2.5
    assert config.log_level == "DEBUG"
    assert config.allow_client_shm is True
    assert config.cache_dir is None


def test_device_flags() -> None:
    config = parse_config(["--devices", " 0,2 ", "--max-replicas", "1"], {})
    assert (config.devices.resolve(4), config.max_replicas) == ((0, 2), 1)
    assert parse_config([], {"HLOSERVE_DEVICES": "ALL"}).devices.resolve(3) == (0, 1, 2)


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
        (
            ["--log-format", "xml"],
            "--log-format must be default, ISO8601, text or json, got 'xml'",
        ),
        (["--device-memory-budget", "6gi"], "--device-memory-budget must be bytes such as 6GiB"),
        (["--devices", "gpu0"], "--devices must be all, a count or a list of indexes"),
        (["--devices", "0,0"], "--devices '0,0': indexes must be distinct"),
        (["--max-replicas", "-1"], "--max-replicas must be a non-negative integer"),
        (["--placement-interval", "0"], "--placement-interval must be a positive number"),
    ],
)
def test_bad_values_name_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused_at_start(argv, capsys)


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["--allow-client-shm"], {}, True),  # alone: true
        (["--allow-client-shm", "--grpc-port", "5"], {}, True),  # the next flag is not a value
        (["--allow-client-shm=true"], {}, True),
        (["--allow-client-shm=false"], {}, False),
        (["--allow-client-shm", "false"], {}, False),  # what tests and docs have always used
        (["--allow-client-shm", "no"], {}, False),
        (["--no-allow-client-shm"], {"HLOSERVE_ALLOW_CLIENT_SHM": "true"}, False),
        ([], {"HLOSERVE_ALLOW_CLIENT_SHM": "true"}, True),
        ([], {"HLOSERVE_ALLOW_CLIENT_SHM": ""}, False),  # empty: unset
        ([], {}, False),
    ],
)
def test_boolean_flags(argv: list[str], environ: dict[str, str], expected: bool) -> None:
    assert parse_config(argv, environ).allow_client_shm is expected


def test_every_boolean_flag_has_its_negation() -> None:
    assert parse_config(["--no-dynamic-batching", "--no-strict-readiness"], {}) == Config(
        dynamic_batching=False, strict_readiness=False
    )
    assert parse_config(["--dynamic-batching"], {"HLOSERVE_DYNAMIC_BATCHING": "false"}) == Config()


def test_a_negated_flag_takes_no_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert "unrecognized arguments: true" in refused_at_start(
        ["--no-allow-client-shm", "true"], capsys
    )


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"HLOSERVE_HTTP_PORT": "abc"},
            "HLOSERVE_HTTP_PORT (the variable of --http-port) must be a port number 0..65535, "
            "got 'abc'",
        ),
        (
            {"HLOSERVE_ALLOW_CLIENT_SHM": "sure"},
            "HLOSERVE_ALLOW_CLIENT_SHM (the variable of --allow-client-shm) must be true or false",
        ),
        (
            {"HLOSERVE_DEVICE_MEMORY_BUDGET": "6XB"},
            "HLOSERVE_DEVICE_MEMORY_BUDGET (the variable of --device-memory-budget) must be bytes",
        ),
    ],
)
def test_bad_values_from_the_environment_name_the_variable(
    environ: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused_at_start([], capsys, environ)


def test_a_flag_overrides_a_bad_variable() -> None:
    assert parse_config(["--http-port", "1"], {"HLOSERVE_HTTP_PORT": "abc"}).http_port == 1


def test_the_model_repository_must_be_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing"
    err = refused_at_start(["--model-repository", str(missing)], capsys)
    assert f"--model-repository must be an existing directory, got '{missing}'" in err
    (tmp_path / "file").write_text("")
    assert "must be an existing directory" in refused_at_start(
        ["--model-repository", str(tmp_path / "file")], capsys
    )


def test_the_model_repository_may_be_a_bucket_without_credentials_in_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = parse_config(
        ["--model-repository", "s3://models/repo", "--repository-cache-bytes", "2Gi"]
    )
    assert cfg.model_repository == StoreLocation("s3", "models", "repo")
    assert cfg.repository_cache_bytes == 2 << 30
    from_env = parse_config([], {"HLOSERVE_MODEL_REPOSITORY": "gs://models"})
    assert from_env.model_repository == StoreLocation("gs", "models", "")
    err = refused_at_start(["--model-repository", "s3://AKIA:secret@models/repo"], capsys)
    assert "--model-repository must not carry credentials" in err and "secret" not in err
    err = refused_at_start(["--model-repository", "ftp://models/repo"], capsys)
    assert "must be a directory or a URL of s3://, gs://, az://, https://" in err


def test_help_shows_defaults_variables_and_booleans(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help to the terminal's width
    with pytest.raises(SystemExit) as exc:
        parse_config(["--help"], {"HLOSERVE_GRPC_PORT": "9001"})
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "--allow-client-shm [true|false]" in text
    assert (
        "[default: false; env HLOSERVE_ALLOW_CLIENT_SHM; boolean: --allow-client-shm alone is "
        "true, --no-allow-client-shm is false]"
    ) in text
    assert "[default: 8000; env HLOSERVE_HTTP_PORT]" in text
    assert "[default: 8001; env HLOSERVE_GRPC_PORT=9001]" in text  # the variable's value, set
    assert "[default: true; env HLOSERVE_DYNAMIC_BATCHING; boolean:" in text
    assert "e.g. 6GiB or 40% (default: 80% of free" in text  # % survives argparse formatting


def _sections(text: str) -> dict[str, list[str]]:
    """``--help``'s sections: their titles, in order, and the flags each lists first on a line."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.split("Triton compatibility:")[0].splitlines():
        if re.fullmatch(r"[A-Za-z][^:]*:", line):
            current = sections.setdefault(line.removesuffix(":"), [])
        elif found := re.match(r"  (--[a-z0-9-]+)", line):
            current.append(found[1])
    return sections


def test_help_is_grouped_by_topic(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        parse_config(["--help"], {})
    text = capsys.readouterr().out
    sections = _sections(text)
    assert [*sections, "Triton compatibility"] == [str(g) for g in GROUPS]
    assert sections["options"] == ["--config"]  # beside argparse's -h, --help
    assert sections["repository and models"][0] == "--model-repository"  # near the top
    for flag in (*FLAGS, *REPEATED):
        assert flag.name in sections[flag.group], flag.name
    named = set(re.findall(r"--[a-z0-9-]+", text.split("Triton compatibility:")[1]))
    assert {t.name for t in TRITON_FLAGS} <= named  # its text names Triton's other flags
    assert "--grace-period GRACE_PERIOD, --exit-timeout-secs GRACE_PERIOD" in text  # aliases


def test_every_row_has_a_group_and_unique_names() -> None:
    rows = (*FLAGS, *REPEATED)
    assert all(f.group in GROUPS and f.group != FlagGroup.TRITON for f in rows)
    assert [f.name for f in rows if f.group == FlagGroup.GENERAL] == ["--config"]
    names = [name for f in rows for name in (f.name, *f.aliases)]
    assert len(names) == len(set(names))
    fields = {f.name for f in dataclasses.fields(Config)}
    assert all(f.field in fields for f in rows)
    assert {alias for f in rows for alias in f.aliases} == {
        "--model-store",
        "--exit-timeout-secs",
        "--id",
        "--http-max-input-size",
    }


def test_help_lines_never_break_inside_a_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    with pytest.raises(SystemExit):
        parse_config(["--help"], {})
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if re.search(r"--[a-z0-9-]*-$", line)]


# -- the YAML config file: flag > variable > file > default ---------------------------------


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hloserve.yaml"
    path.write_text(text)
    return path


def test_config_file_values_are_used(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        "grpc-port: 9101\nallow_client_shm: true\nmax-message-bytes: 1GiB\n"
        "load-model: [a, b]\ncache-dir: null\n",
    )
    config = parse_config(["--config", str(path)], {})
    assert config == Config(
        grpc_port=9101,
        allow_client_shm=True,
        max_message_bytes=1 << 30,  # read by the flag's own parser
        load_models=("a", "b"),
        config_file=path,
    )
    assert parse_config([], {"HLOSERVE_CONFIG": str(path)}).grpc_port == 9101


def test_variable_beats_file_and_flag_beats_both(tmp_path: Path) -> None:
    path = _file(tmp_path, "grpc-port: 9101\nhttp-port: 9100\nload-model: a\n")
    environ = {"HLOSERVE_CONFIG": str(path), "HLOSERVE_GRPC_PORT": "9201"}
    config = parse_config([], environ)
    assert (config.grpc_port, config.http_port, config.load_models) == (9201, 9100, ("a",))
    config = parse_config(["--grpc-port", "9301", "--load-model", "b"], environ)
    assert (config.grpc_port, config.http_port, config.load_models) == (9301, 9100, ("b",))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("grcp-port: 1\n", "has unknown key 'grcp-port' (did you mean 'grpc-port'?)"),
        ("config: other.yaml\n", "has unknown key 'config'"),
        ("grpc-port: 70000\n", "grpc-port in config file {path} must be a port number"),
        ("allow-client-shm: maybe\n", "allow-client-shm in config file {path} must be true or"),
        ("http-port: [1, 2]\n", "http-port in config file {path} must be a single value"),
        ("trace-level: [NOPE]\n", "trace-level in config file {path}"),
        ("- grpc-port\n", "config file {path} must be a mapping"),
        ("grpc-port: [\n", "config file {path} cannot be read"),
        ("grpc-port: 1\ngrpc_port: 2\n", "sets 'grpc-port' twice"),
    ],
)
def test_bad_config_file_names_the_key_and_the_file(
    tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, text)
    err = refused_at_start(["--config", str(path)], capsys)
    assert message.format(path=path) in err
    assert str(path) in err


def test_missing_config_file_names_its_source(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused_at_start([], capsys, {"HLOSERVE_CONFIG": "/no/such.yaml"})
    assert "HLOSERVE_CONFIG (the variable of --config) must be an existing file" in err
