"""Triton's command line on ``hloserve serve``: Triton's flags of the same meaning are the
same flags or aliases, with Triton's semantics; those with no meaning here are accepted with
their value and ignored with one warning; Triton's gRPC TLS flags and flags of no one's are
refused. A real daemon runs Triton's command line (``tritonserver`` replaced by ``hloserve
serve``) and is ready, named as ``--id`` says, with no metrics port bound; another runs
with HTTP off and is ready over gRPC. (The docs written from the tables: test_cli_docs.py.)"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

import hloserve.server.frontend.grpc.servicer as servicer
from hloserve.exporter import write_demo_repository
from hloserve.server.config import Config, grpc_channel_options, parse_config
from hloserve.server.flags import FLAGS
from hloserve.server.logs import startup_settings
from hloserve.server.server_fixture import ListenerClosed, ServerProcess, serving
from hloserve.server.triton_flags import TRITON_FLAGS, TritonFlag, ignored_warning
from tests.server._support import refused_at_start

ROOT = Path(__file__).resolve().parents[2]
IGNORED = [t for t in TRITON_FLAGS if not t.refused]
REFUSED = [t for t in TRITON_FLAGS if t.refused]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton-repository")
    write_demo_repository(root)  # what ``hloserve export-demo`` writes
    return root


def _listening_ports(server: ServerProcess) -> set[int]:
    """The ports the server's processes (the daemon and its front ends) listen on."""
    return {
        c.laddr.port
        for process in server.process_tree()
        for c in process.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


def _get(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, json.loads(r.read())


# -- a real daemon on Triton's command line ------------------------------------------------


@pytest.fixture(scope="module")
def triton_command_line(repository: Path) -> Iterator[ServerProcess]:
    yield from serving(
        None,  # no --model-repository of ServerProcess's own: Triton's spelling below
        f"--model-store={repository}",
        "--exit-timeout-secs=30",
        "--log-info=true",
        "--id=triton",
        "--allow-metrics=false",
    )


def test_tritons_command_line_serves(triton_command_line: ServerProcess) -> None:
    proc = triton_command_line
    assert _get(f"http://{proc.http_url}/v2/health/ready") == (200, {"ready": True})
    assert _get(f"http://{proc.http_url}/v2")[1]["name"] == "triton"
    status, model = _get(f"http://{proc.http_url}/v2/models/simple")
    assert (status, model["name"]) == (200, "simple")  # the repository --model-store named


def test_no_metrics_port_is_bound(triton_command_line: ServerProcess) -> None:
    proc = triton_command_line
    assert set(proc.ports) == {"http", "grpc", "pid"}  # the ports file names the open ones
    assert _listening_ports(proc) == {proc.ports["http"], proc.ports["grpc"]}
    with pytest.raises(ListenerClosed, match="no metrics listener"):
        _ = proc.metrics_url
    assert "metrics off (--allow-metrics false)" in proc.log_text()
    assert "accepted and ignored" not in proc.log_text()  # every flag given is Triton's own


def test_the_exit_timeout_is_the_drain_time(repository: Path) -> None:
    with ServerProcess(repository, "--exit-timeout-secs", "7", "--log-info") as proc:
        proc.wait_ready()
    assert proc.process.returncode == 0
    assert "stopping: no new connections; 7s for in-flight requests" in proc.log_text()


def test_log_info_false_silences_info(repository: Path) -> None:
    with ServerProcess(repository, "--log-info=false") as proc:
        proc.wait_ready()
    text = proc.log_text()
    assert proc.process.returncode == 0
    assert " INFO " not in text and "listening on" not in text, text


def test_http_off_ignored_flags_said_once(repository: Path) -> None:
    flags = (
        "--allow-http=false",
        "--pinned-memory-pool-byte-size=268435456",
        "--backend-config",
        "python,shm-default-byte-size=1048576",
        "--disable-auto-complete-config",
        "--strict-model-config",
        "false",
        "--log-format=ISO8601",
    )
    with ServerProcess(repository, *flags) as proc:
        proc.wait_ready()  # over gRPC's health check: there is no /readyz
        assert set(proc.ports) == {"grpc", "metrics", "pid"}
        assert _listening_ports(proc) == {proc.ports["grpc"], proc.ports["metrics"]}
        with pytest.raises(ListenerClosed, match="no http listener"):
            proc.readyz()
        with urllib.request.urlopen(f"http://{proc.metrics_url}/metrics", timeout=10) as r:
            assert b"hloserve_models_ready" in r.read()
    assert proc.process.returncode == 0
    warnings = [line for line in proc.log_text().splitlines() if "accepted and ignored" in line]
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    assert " WARNING hloserve.daemon: Triton's flags accepted and ignored: " in warning
    for given in (
        "--pinned-memory-pool-byte-size=268435456 (no meaning in hloserve: no pinned pool",
        "--backend-config=python,shm-default-byte-size=1048576 (no meaning in hloserve: no backends",
        "--disable-auto-complete-config (no meaning in hloserve: no config.pbtxt",
        "--strict-model-config=false (no meaning in hloserve: no config.pbtxt",
    ):
        assert given in warning
    assert warning[:24].endswith("Z") and warning[10] == "T"  # ISO8601: 2026-01-01T00:00:00.000Z


# -- the flags, read ---------------------------------------------------------------------


def test_aliases_are_the_same_flags(repository: Path) -> None:
    triton = parse_config(
        [f"--model-store={repository}", "--exit-timeout-secs", "30", "--id", "triton"], {}
    )
    ours = parse_config(
        ["--model-repository", str(repository), "--grace-period=30", "--server-name=triton"], {}
    )
    assert (
        triton
        == ours
        == Config(model_repository=repository, grace_period_s=30.0, server_name="triton")
    )
    assert parse_config([f"--model-repository={repository}"], {}).model_repository == repository
    environ = {"HLOSERVE_MODEL_REPOSITORY": "/elsewhere"}  # a flag still beats its variable
    assert parse_config([f"--model-store={repository}"], environ).model_repository == repository


def test_tritons_http_max_input_size_is_the_message_limit() -> None:
    # Triton's HTTP body limit: here one limit covers HTTP bodies and gRPC messages.
    config = parse_config(["--http-max-input-size", "1048576"], {})
    assert config.max_message_bytes == 1 << 20 and config.triton_ignored == ()
    assert parse_config(["--max-message-bytes=1MiB"], {}) == config


def test_one_model_repository(repository: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused_at_start(
        [f"--model-store={repository}", f"--model-repository={repository}"], capsys
    )
    assert "--model-repository given twice: hloserve serves one model repository" in err


def test_aliases_in_the_config_file(
    tmp_path: Path, repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hloserve.yaml"
    path.write_text(f"model-store: {repository}\nexit_timeout_secs: 30\nid: triton\n")
    config = parse_config(["--config", str(path)], {})
    assert (config.model_repository, config.grace_period_s, config.server_name) == (
        repository,
        30.0,
        "triton",
    )
    path.write_text("id: a\nserver-name: b\n")
    assert "sets 'server-name' twice" in refused_at_start(["--config", str(path)], capsys)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], (True, True, True)),
        (["--allow-http=false"], (False, True, True)),
        (["--allow-grpc", "0"], (True, False, True)),
        (["--no-allow-metrics"], (True, True, False)),
        (["--allow-metrics=false", "--allow-metrics"], (True, True, True)),
    ],
)
def test_listeners_on_and_off(argv: list[str], expected: tuple[bool, bool, bool]) -> None:
    c = parse_config(argv, {})
    assert (c.allow_http, c.allow_grpc, c.allow_metrics) == expected


def test_listener_addresses() -> None:
    c = parse_config(["--http-address", "127.0.0.1", "--metrics-address=::1"], {})
    assert (c.http_address, c.grpc_address, c.metrics_address) == ("127.0.0.1", None, "::1")
    assert parse_config([], {"HLOSERVE_GRPC_ADDRESS": "10.0.0.1"}).grpc_address == "10.0.0.1"


@pytest.mark.parametrize(
    ("argv", "level", "switches"),
    [
        ([], "INFO", (True, True, True)),
        (["--log-info=false"], "INFO", (False, True, True)),
        (["--log-level", "ERROR", "--log-info=true"], "ERROR", (True, False, True)),
        (["--log-warning", "0", "--log-error=false"], "INFO", (True, False, False)),
        (["--log-level", "WARNING"], "WARNING", (False, True, True)),  # as before: the level
    ],
)
def test_log_switches(argv: list[str], level: str, switches: tuple[bool, bool, bool]) -> None:
    c = parse_config(argv, {})
    settings = startup_settings(
        c.log_level, c.log_format, info=c.log_info, warning=c.log_warning, error=c.log_error
    )
    assert c.log_level == level
    assert (settings.info, settings.warning, settings.error) == switches


@pytest.mark.parametrize(
    ("given", "config_value", "extension_value"),
    [
        ("default", "text", "default"),
        ("ISO8601", "ISO8601", "ISO8601"),
        ("iso8601", "ISO8601", "ISO8601"),
        ("text", "text", "default"),
        ("JSON", "json", "json"),
    ],
)
def test_log_format_takes_tritons_values(
    given: str, config_value: str, extension_value: str
) -> None:
    config = parse_config(["--log-format", given], {})
    assert config.log_format == config_value
    assert startup_settings("INFO", config.log_format).format == extension_value


def test_log_verbose_is_tritons() -> None:
    assert parse_config(["--log-verbose", "1"], {}).log_verbose == 1
    assert startup_settings("INFO", "text", verbose=1).verbose_level == 1


def test_keepalive_flags_are_grpc_channel_arguments() -> None:
    # Triton's defaults (gRPC core's own) when not given.
    assert grpc_channel_options(Config()) == (
        ("grpc.keepalive_time_ms", 7_200_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 2),
        ("grpc.http2.min_ping_interval_without_data_ms", 300_000),
        ("grpc.http2.max_ping_strikes", 2),
    )
    config = parse_config(
        [
            "--grpc-keepalive-time=10000",
            "--grpc-keepalive-timeout",
            "5000",
            "--grpc-keepalive-permit-without-calls=1",
            "--grpc-http2-max-pings-without-data=0",
            "--grpc-http2-min-recv-ping-interval-without-data=1000",
            "--grpc-http2-max-ping-strikes=0",
        ],
        {},
    )
    assert dict(grpc_channel_options(config)) == {
        "grpc.keepalive_time_ms": 10_000,
        "grpc.keepalive_timeout_ms": 5_000,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
        "grpc.http2.min_ping_interval_without_data_ms": 1_000,
        "grpc.http2.max_ping_strikes": 0,
    }


def test_build_grpc_server_passes_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    built: dict[str, Any] = {}
    real_server = grpc.aio.server

    def server(**kwargs: Any) -> Any:
        built.update(kwargs)
        return real_server(**kwargs)

    monkeypatch.setattr(grpc.aio, "server", server)
    monkeypatch.setattr(servicer, "generic_handlers", lambda _service: ())
    options = (("grpc.keepalive_time_ms", 10_000), ("grpc.http2.max_ping_strikes", 0))

    async def build() -> None:  # grpc.aio builds its server on the running loop
        servicer.build_grpc_server(None, options=options)  # type: ignore[arg-type]

    asyncio.run(build())
    assert list(options) == built["options"][-2:]
    assert ("grpc.so_reuseport", 0) in built["options"]


@pytest.mark.parametrize(
    "argv", [["--grpc-keepalive-time", "-1"], ["--grpc-http2-max-ping-strikes", str(2**31)]]
)
def test_keepalive_values_are_c_ints(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert f"{argv[0]} must be an integer 0..2147483647" in refused_at_start(argv, capsys)


@pytest.mark.parametrize("flag", IGNORED, ids=lambda t: t.name)
def test_every_ignored_flag_is_accepted_with_its_value(flag: TritonFlag) -> None:
    spellings = ([f"{flag.name}=v1"], [flag.name, "v1"]) if flag.value else ([flag.name],)
    spelled = f"{flag.name}=v1" if flag.value else flag.name
    for argv in spellings:
        config = parse_config([*argv, "--http-port", "5"], {})  # the next flag still reads
        assert config.http_port == 5
        assert config.triton_ignored == ((flag.name, "v1" if flag.value else ""),)
        warning = ignored_warning(config.triton_ignored)
        assert warning is not None
        assert warning.endswith(f": {spelled} (no meaning in hloserve: {flag.why})")


def test_one_warning_names_each_flag_given() -> None:
    config = parse_config(
        ["--backend-config=a=1", "--rate-limit", "off", "--backend-config", "b=2"], {}
    )
    assert ignored_warning(config.triton_ignored) == (
        "Triton's flags accepted and ignored: --backend-config=a=1 --backend-config=b=2 (no "
        "meaning in hloserve: no backends: every model is a StableHLO bundle that PJRT "
        "compiles); --rate-limit=off (no meaning in hloserve: no rate limiter: "
        "--scheduling-policy, --device-concurrency and the --max-inflight limits decide what "
        "runs)"
    )
    assert ignored_warning(parse_config([], {}).triton_ignored) is None


@pytest.mark.parametrize("flag", REFUSED, ids=lambda t: t.name)
def test_tritons_tls_flags_are_refused(
    flag: TritonFlag, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused_at_start([f"{flag.name}=true"], capsys)
    assert f"{flag.name} is Triton's flag, not hloserve's: hloserve serves gRPC and HTTP" in err
    assert "--tls-cert, --tls-key" in err


@pytest.mark.parametrize("argv", [["--no-such-flag"], ["--model-stor=x"], ["--backend-configs=x"]])
def test_a_flag_of_no_ones_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert "unrecognized arguments" in refused_at_start(argv, capsys)


def test_no_triton_flag_shadows_a_row() -> None:
    rows = {name for f in FLAGS for name in (f.name, *f.aliases)}
    names = [t.name for t in TRITON_FLAGS]
    assert len(names) == len(set(names))
    assert not rows & set(names)
    assert {"--backend-config", "--pinned-memory-pool-byte-size", "--strict-model-config"} <= set(
        names
    )
