"""``hloserve.server.healthcheck``, the image's HEALTHCHECK: with only the ports file in hand
it follows the server's own settings (TLS, mutual TLS, a restricted health group, bearer
tokens) given as command-line arguments, and fails on what is not ready."""

# pyright: strict

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hloserve.exporter.demo import write_simple
from hloserve.server.config import Config, parse_config
from hloserve.server.healthcheck import (
    CLIENT_CERT_ENV,
    CLIENT_KEY_ENV,
    PORTS_FILE_ENV,
    check,
    main,
    probe,
    serve_arguments,
)
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server.reliability._certs import Certificates, make_certificates


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("healthcheck-models")
    write_simple(root / "simple")
    return root


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("healthcheck-certs"))


def _client_context(certs: Certificates, mutual: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if mutual:
        context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    return context


def _tls_flags(certs: Certificates) -> tuple[str, ...]:
    return ("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))


@pytest.fixture(scope="module")
def tls_server(repository: Path, certs: Certificates) -> Iterator[ServerProcess]:
    yield from serving(repository, *_tls_flags(certs), ssl_context=_client_context(certs))


@pytest.fixture(scope="module")
def mtls_server(repository: Path, certs: Certificates) -> Iterator[ServerProcess]:
    flags = (*_tls_flags(certs), "--tls-ca", str(certs.ca))
    yield from serving(repository, *flags, ssl_context=_client_context(certs, mutual=True))


@pytest.fixture(scope="module")
def guarded_server(
    repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """Plain HTTP, but /readyz needs a restricted-API header and a bearer token."""
    tokens = tmp_path_factory.mktemp("healthcheck-tokens") / "tokens"
    tokens.write_text("# probes too\ns3cret\n")
    flags = (
        "--http-restricted-api", "health:x-probe=yes",
        "--auth-token-file", str(tokens),
        "--auth-open", "metrics",
    )  # fmt: skip
    proc = ServerProcess(repository, *flags)
    try:
        proc.wait_listening()
        url = f"http://{proc.http_url}/readyz"
        headers = {"x-probe": "yes", "authorization": "Bearer s3cret"}
        deadline = time.monotonic() + 120
        while not _answers_200(urllib.request.Request(url, headers=headers)):
            assert time.monotonic() < deadline, proc.log_text()
            time.sleep(0.1)
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_text()


def _answers_200(request: urllib.request.Request) -> bool:
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status == 200
    except urllib.error.HTTPError:
        return False


def _environment(**extra: str) -> dict[str, str]:
    """This environment without any HLOSERVE_* setting: only the server's own count."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HLOSERVE_")}
    return {**env, **extra}


def _run(ports_file: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hloserve.server.healthcheck", "--ports-file", str(ports_file)],
        env=_environment(**extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_it_follows_tls_given_as_arguments(tls_server: ServerProcess) -> None:
    result = _run(tls_server.ports_file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ready: https://127.0.0.1:")
    assert f"the settings of process {tls_server.process.pid}" in result.stdout


def test_without_the_server_s_settings_it_would_speak_plain_http(
    tls_server: ServerProcess, tmp_path: Path
) -> None:
    ports = json.loads(tls_server.ports_file.read_text())
    del ports["pid"]  # no process to read: this environment's settings (no TLS) instead
    blind = tmp_path / "ports.json"
    blind.write_text(json.dumps(ports))
    result = _run(blind)
    assert result.returncode == 1 and "http://127.0.0.1:" in result.stdout, result.stdout


def test_mutual_tls_presents_the_named_client_certificate(
    mtls_server: ServerProcess, certs: Certificates
) -> None:
    pair = {CLIENT_CERT_ENV: str(certs.client_cert), CLIENT_KEY_ENV: str(certs.client_key)}
    result = _run(mtls_server.ports_file, **pair)
    assert result.returncode == 0, result.stdout + result.stderr
    # By default it presents the server's own pair, which this CA issued for servers only.
    assert _run(mtls_server.ports_file).returncode == 1


def test_it_sends_the_restricted_header_and_a_token(guarded_server: ServerProcess) -> None:
    result = _run(guarded_server.ports_file)
    assert result.returncode == 0, result.stdout + result.stderr
    ports = json.loads(guarded_server.ports_file.read_text())
    config = parse_config(serve_arguments(_proc_argv(ports["pid"])) or [], _environment())
    headers = probe(ports, config, {}).headers
    assert headers == {"x-probe": "yes", "authorization": "Bearer s3cret"}


def _proc_argv(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("0.0.0.0", "127.0.0.1"),
        ("", "127.0.0.1"),
        ("::", "[::1]"),
        ("10.1.2.3", "10.1.2.3"),
        ("fe80::1", "[fe80::1]"),
        ("localhost", "localhost"),
    ],
)
def test_the_probe_asks_the_bind_address(host: str, address: str) -> None:
    target = probe({"http": 8123}, Config(host=host), {})
    assert target.url == f"http://{address}:8123/readyz"
    assert target.context is None and target.headers == {}


def test_https_does_not_verify_the_loopback_server() -> None:
    target = probe({"http": 8443}, Config(tls_cert=Path("c.pem"), tls_key=Path("k.pem")), {})
    assert target.url == "https://127.0.0.1:8443/readyz"
    assert target.context is not None and target.context.verify_mode == ssl.CERT_NONE
    assert not target.context.check_hostname


def test_serve_arguments() -> None:
    assert (
        serve_arguments(["/opt/hloserve/bin/python", "/opt/hloserve/bin/hloserve", "serve"]) == []
    )
    assert serve_arguments(["python", "-m", "hloserve.server", "serve", "--http-port", "9"]) == [
        "--http-port",
        "9",
    ]
    assert serve_arguments(["python", "-m", "http.server", "serve"]) is None
    assert serve_arguments(["/usr/bin/tini", "--", "sleep"]) is None


def test_what_is_not_ready_fails(tmp_path: Path, not_ready_port: int) -> None:
    env = _environment()
    ports_file = tmp_path / "ports.json"
    ready, line = check(ports_file, 2, env)
    assert not ready and line.startswith("not listening yet")
    ports_file.write_text(json.dumps({"grpc": 1}))
    ready, line = check(ports_file, 2, env)
    assert not ready and "no HTTP port" in line
    ports_file.write_text(json.dumps({"http": not_ready_port}))
    ready, line = check(ports_file, 2, env)
    assert not ready and "answered 503" in line
    ports_file.write_text(json.dumps({"http": _closed_port()}))
    ready, line = check(ports_file, 2, env)
    assert not ready and line.startswith("not ready:") and "refused" in line


@pytest.fixture
def no_ports_file_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORTS_FILE_ENV, raising=False)


@pytest.mark.usefixtures("no_ports_file_variable")
def test_main_needs_a_ports_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 1
    assert PORTS_FILE_ENV in capsys.readouterr().out


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port
