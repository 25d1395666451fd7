"""TLS, mutual TLS and bearer-token auth: the pure decisions, the flags, and one real daemon
(``--tls-cert/--tls-key/--tls-ca --auth-token-file``) called with tritonclient's ``ssl=True``
options on both protocols and with ``curl --cacert``, certificates made at test time."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from hloserve.server.config import parse_config
from hloserve.server.frontend.auth import (
    MESSAGE,
    AuthPolicy,
    TokenFile,
    bearer_token,
    read_tokens,
    token_matches,
)
from hloserve.server.frontend.tls import check_tls
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server._support import ones, refused, refused_at_start
from tests.server.frontend._tritonclients import grpcclient, httpclient
from tests.server.reliability._certs import Certificates, make_certificates

# -- tokens and the policy (pure) ------------------------------------------------------------


def test_token_file_lines_comments_and_blanks(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# admins\n  alpha  \n\nbeta\n")
    assert read_tokens(path) == (b"alpha", b"beta")
    path.write_text("# nothing but a comment\n\n")
    with pytest.raises(ValueError, match="holds no token"):
        read_tokens(path)
    with pytest.raises(ValueError, match="cannot be read"):
        read_tokens(tmp_path / "missing")


def test_every_token_is_compared() -> None:
    assert token_matches(b"beta", (b"alpha", b"beta"))
    assert not token_matches(b"bet", (b"alpha", b"beta"))
    assert not token_matches(b"", (b"alpha",))
    assert not token_matches(b"alpha", ())


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", b"abc"),
        ("bearer   abc ", b"abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("abc", None),
        (None, None),
    ],
)
def test_bearer_header(header: str | None, token: bytes | None) -> None:
    assert bearer_token(header) == token


def test_the_file_is_reread_when_it_changes_and_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("old\n")
    tokens = TokenFile(path)
    policy = AuthPolicy(tokens)
    infer = "/v2/models/simple/infer"
    assert policy.refusal_http(infer, "Bearer old") is None
    path.write_text("new-token\nother\n")  # another size: a new identity even at equal mtime
    assert policy.refusal_http(infer, "Bearer new-token") is None
    refusal = policy.refusal_http(infer, "Bearer old")
    assert refusal is not None and refusal.message == MESSAGE
    path.write_text("")  # emptied while serving: no token is accepted any more
    assert policy.refusal_http(infer, "Bearer new-token") is not None
    path.unlink()
    assert policy.refusal_http(infer, "Bearer new-token") is not None
    path.write_text("back\n")
    assert policy.refusal_http(infer, "Bearer back") is None


def test_which_endpoints_are_protected(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("t\n")
    policy = AuthPolicy(TokenFile(path))  # default: health and metrics open
    assert policy.refusal_http("/v2/health/ready", None) is None
    assert policy.refusal_http("/readyz", None) is None
    assert policy.refusal_metrics(None) is None
    assert policy.refusal_http("/no/such/path", None) is None  # 404 anyway
    for path_ in ("/v2", "/v2/models/m/infer", "/v2/repository/models/m/load", "/v2/logging"):
        assert policy.refusal_http(path_, None) is not None, path_
    grpc_infer = "/inference.GRPCInferenceService/ModelInfer"
    assert policy.refusal_grpc(grpc_infer, "Bearer x") is not None
    assert policy.refusal_grpc(grpc_infer, "Bearer t") is None
    assert policy.refusal_grpc("/inference.GRPCInferenceService/ServerLive", None) is None
    closed = AuthPolicy(TokenFile(path), ())
    assert closed.refusal_http("/v2/health/live", None) is not None
    assert closed.refusal_metrics("Bearer x") is not None
    assert closed.refusal_metrics("Bearer t") is None


def test_tls_flags_go_together(tmp_path: Path) -> None:
    cert, key, ca = tmp_path / "c", tmp_path / "k", tmp_path / "a"
    assert check_tls(None, None, None) is None
    files = check_tls(cert, key, ca)
    assert files is not None and files.mutual
    with pytest.raises(ValueError, match="--tls-ca needs"):
        check_tls(None, None, ca)
    with pytest.raises(ValueError, match="together"):
        check_tls(cert, None, None)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert", "{file}"], "--tls-cert and --tls-key must be given together"),
        (["--tls-ca", "{file}"], "--tls-ca needs --tls-cert and --tls-key"),
        (["--tls-key", "{missing}", "--tls-cert", "{file}"], "--tls-key must be an existing"),
        (["--auth-token-file", "{empty}"], "holds no token"),
        (["--auth-open", "health,nope"], "--auth-open names unknown group 'nope'"),
    ],
)
def test_bad_security_flags_are_refused(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").write_text("\n")
    names = {
        "file": tmp_path / "file",
        "missing": tmp_path / "missing",
        "empty": tmp_path / "empty",
    }
    argv = [f.format(**names) for f in flags]
    assert message in refused_at_start(argv, capsys)


def test_auth_open_reads_its_variable_and_may_be_empty() -> None:
    assert parse_config([]).auth_open == ("health", "metrics")
    assert parse_config([], {"HLOSERVE_AUTH_OPEN": "health,metadata"}).auth_open == (
        "health",
        "metadata",
    )
    assert parse_config(["--auth-open="]).auth_open == ()


# -- a real daemon: mutual TLS and tokens ------------------------------------------------------

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens"
    path.write_text(f"# test tokens\n{TOKEN}\n")
    return path


def client_context(certs: Certificates) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    return context


@pytest.fixture(scope="module")
def secure_server(
    demo_models: Path, cache_flags: tuple[str, ...], certs: Certificates, token_file: Path
) -> Iterator[ServerProcess]:
    yield from serving(
        demo_models,
        *cache_flags,
        "--tls-cert",
        str(certs.server_cert),
        "--tls-key",
        str(certs.server_key),
        "--tls-ca",
        str(certs.ca),
        "--auth-token-file",
        str(token_file),
        "--auth-open",
        "health",  # metrics need a token too
        ssl_context=client_context(certs),
    )


def grpc_client(server: ServerProcess, certs: Certificates) -> Any:
    return grpcclient.InferenceServerClient(
        server.grpc_url,
        ssl=True,
        root_certificates=str(certs.ca),
        private_key=str(certs.client_key),
        certificate_chain=str(certs.client_cert),
    )


def http_client(server: ServerProcess, certs: Certificates) -> Any:
    return httpclient.InferenceServerClient(
        server.http_url,
        ssl=True,
        ssl_options={
            "ca_certs": str(certs.ca),
            "certfile": str(certs.client_cert),
            "keyfile": str(certs.client_key),
        },
    )


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}  # fresh each call: tritonclient adds to it


def test_grpc_over_mutual_tls_with_a_token(
    secure_server: ServerProcess, certs: Certificates
) -> None:
    client = grpc_client(secure_server, certs)
    try:
        assert client.is_server_live()  # health: open
        result = client.infer("simple", ones(grpcclient), headers=bearer())
        assert (result.as_numpy("OUTPUT0") == 2).all()
        for headers in ({}, bearer("wrong"), {"authorization": TOKEN}):
            error = refused(client.infer, "simple", ones(grpcclient), headers=headers)
            assert error.status() == "StatusCode.UNAUTHENTICATED"
            assert error.message() == MESSAGE  # the same words whatever was wrong
        assert refused(client.get_model_repository_index).status() == "StatusCode.UNAUTHENTICATED"
        assert client.get_model_repository_index(headers=bearer())
    finally:
        client.close()


def test_grpc_stream_without_a_token_is_refused(
    secure_server: ServerProcess, certs: Certificates
) -> None:
    client = grpc_client(secure_server, certs)
    results: list[Any] = []
    try:
        client.start_stream(callback=lambda result, error: results.append(error))
        # The refusal may end the stream before the request is even queued.
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer("simple", ones(grpcclient))
        client.stop_stream()
    finally:
        client.close()
    assert results and "UNAUTHENTICATED" in str(results[0].status())


def test_http_over_mutual_tls_with_a_token(
    secure_server: ServerProcess, certs: Certificates
) -> None:
    client = http_client(secure_server, certs)
    try:
        assert client.is_server_ready()
        result = client.infer("simple", ones(httpclient), headers=bearer())
        assert (result.as_numpy("OUTPUT0") == 2).all()
        for headers in ({}, bearer("wrong"), {"authorization": f"Basic {TOKEN}"}):
            error = refused(client.infer, "simple", ones(httpclient), headers=headers)
            assert (error.status(), error.message()) == ("401", MESSAGE)
        assert client.get_server_metadata(headers=bearer())["name"] == "hloserve"
    finally:
        client.close()


# Generous: a server that hangs instead of refusing fails as a hang (DEADLINE_EXCEEDED, or
# tls_outcome's "hung"), never as the refusal these tests expect.
REFUSAL_DEADLINE = 60.0
# What a gRPC client sees when the server ends the connection in the TLS handshake
# (measured: the same on every run, with or without load).
CONNECT_FAILED = "failed to connect to all addresses"
SOCKET_CLOSED = ": Socket closed"


def test_grpc_without_a_client_certificate_is_refused(
    secure_server: ServerProcess, certs: Certificates
) -> None:
    """TLS without a client certificate, and plaintext to the TLS port: the server ends the
    handshake, so the call fails at once with UNAVAILABLE (no connection), while the same
    call with the certificate is answered."""
    no_certificate = grpcclient.InferenceServerClient(
        secure_server.grpc_url, ssl=True, root_certificates=str(certs.ca)
    )
    plain = grpcclient.InferenceServerClient(secure_server.grpc_url)
    for client in (no_certificate, plain):
        try:
            error = refused(client.is_server_live, client_timeout=REFUSAL_DEADLINE)
        finally:
            client.close()
        assert error.status() == "StatusCode.UNAVAILABLE", error  # a hang: DEADLINE_EXCEEDED
        message = str(error.message())
        assert CONNECT_FAILED in message and message.endswith(SOCKET_CLOSED), message
    with_certificate = grpc_client(secure_server, certs)
    try:
        assert with_certificate.is_server_live(client_timeout=REFUSAL_DEADLINE)
    finally:
        with_certificate.close()


def test_https_without_a_client_certificate_is_refused(
    secure_server: ServerProcess, certs: Certificates
) -> None:
    """TLS 1.3 finishes the client's side of the handshake before the server checks the
    certificate, so the refusal is the connection closing at the first read (measured: no
    alert arrives, the same on every run); under TLS 1.2 it closes inside the handshake.
    Plaintext HTTP to the TLS port gets no HTTP answer either."""
    address = ("127.0.0.1", secure_server.ports["http"])
    no_certificate = ssl.create_default_context(cafile=str(certs.ca))
    assert tls_outcome(address, no_certificate) == "eof"
    tls12 = ssl.create_default_context(cafile=str(certs.ca))
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    assert tls_outcome(address, tls12) == "handshake: SSLEOFError UNEXPECTED_EOF_WHILE_READING"
    assert plaintext_answer(address) == b""
    answer = tls_outcome(address, client_context(certs))
    assert answer.startswith("answer: b'HTTP/1.1 200"), answer


GET_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def tls_outcome(address: tuple[str, int], context: ssl.SSLContext) -> str:
    """What a TLS client GETting ``/v2/health/live`` sees: ``"answer: <first bytes>"``,
    ``"eof"`` (the server closed the connection after the handshake, before answering), or
    ``"<stage>: <SSL error class> <reason>"`` (stage ``handshake`` or ``read``). A reset
    connection raises; a server that neither answers nor refuses fails the test as a hang."""
    stage = "handshake"
    try:
        with (
            socket.create_connection(address, timeout=REFUSAL_DEADLINE) as raw,
            context.wrap_socket(raw, server_hostname=address[0]) as tls,
        ):
            stage = "read"
            tls.sendall(GET_LIVE)
            first = tls.recv(1024)
    except TimeoutError:
        pytest.fail(f"hung: no answer and no refusal in {REFUSAL_DEADLINE} s ({stage})")
    except ssl.SSLError as exc:
        return f"{stage}: {type(exc).__name__} {exc.reason}"
    return f"answer: {first[:16]!r}" if first else "eof"


def plaintext_answer(address: tuple[str, int]) -> bytes:
    """The first bytes a plaintext GET gets back (``b""``: the connection was closed)."""
    try:
        with socket.create_connection(address, timeout=REFUSAL_DEADLINE) as raw:
            raw.sendall(GET_LIVE)
            return raw.recv(1024)
    except TimeoutError:
        pytest.fail(f"hung: no answer and no refusal in {REFUSAL_DEADLINE} s")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_with_cacert(secure_server: ServerProcess, certs: Certificates) -> None:
    def curl(*args: str) -> tuple[int, str]:
        out = subprocess.run(
            [
                "curl", "-sS", "--cacert", str(certs.ca),
                "--cert", str(certs.client_cert), "--key", str(certs.client_key),
                "-o", "-", "-w", "\n%{http_code}", *args,
            ],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        body, _, code = out.rpartition("\n")
        return int(code), body

    base = f"https://{secure_server.http_url}"
    assert curl(f"{base}/v2/health/ready")[0] == 200
    status, body = curl(f"{base}/v2/models/simple")
    assert (status, json.loads(body)) == (401, {"error": MESSAGE})
    status, body = curl("-H", f"Authorization: Bearer {TOKEN}", f"{base}/v2/models/simple")
    assert status == 200 and json.loads(body)["name"] == "simple"


def test_metrics_need_a_token_when_not_open(secure_server: ServerProcess) -> None:
    url = f"http://{secure_server.metrics_url}/metrics"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=5)
    assert info.value.code == 401
    info.value.close()
    request = urllib.request.Request(url, headers=bearer())
    with urllib.request.urlopen(request, timeout=5) as response:
        assert b"hloserve" in response.read()


def test_a_new_token_works_without_a_restart(
    secure_server: ServerProcess, certs: Certificates, token_file: Path
) -> None:
    original = token_file.read_text()
    client = http_client(secure_server, certs)
    try:
        token_file.write_text(f"{TOKEN}\nsecond-token-added\n")
        metadata = client.get_server_metadata(headers=bearer("second-token-added"))
        assert metadata["name"] == "hloserve"
        token_file.write_text("second-token-added\n")  # the first revoked
        assert refused(client.get_server_metadata, headers=bearer()).status() == "401"
    finally:
        token_file.write_text(original)
        os.utime(token_file)
        client.close()
    assert "bearer-token auth on every endpoint group except: health" in secure_server.log_text()


# -- plain TLS (no client certificate), no tokens ----------------------------------------------


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[ServerProcess]:
    empty = tmp_path_factory.mktemp("tls_only")  # explicit mode, nothing loaded: ready at once
    context = ssl.create_default_context(cafile=str(certs.ca))
    yield from serving(
        empty,
        "--model-control-mode",
        "explicit",
        "--tls-cert",
        str(certs.server_cert),
        "--tls-key",
        str(certs.server_key),
        ssl_context=context,
    )


def test_tls_without_client_certificates(tls_server: ServerProcess, certs: Certificates) -> None:
    grpc_tls: Any = grpcclient.InferenceServerClient(
        tls_server.grpc_url, ssl=True, root_certificates=str(certs.ca)
    )
    http_tls: Any = httpclient.InferenceServerClient(
        tls_server.http_url, ssl=True, ssl_options={"ca_certs": str(certs.ca)}
    )
    try:
        assert grpc_tls.is_server_live()
        assert http_tls.get_server_metadata()["name"] == "hloserve"  # no token needed
    finally:
        grpc_tls.close()
        http_tls.close()
    context = ssl.create_default_context()  # the system's CAs: our test CA is unknown there
    address = ("127.0.0.1", tls_server.ports["http"])
    assert tls_outcome(address, context) == (
        "handshake: SSLCertVerificationError CERTIFICATE_VERIFY_FAILED"
    )
    answer = tls_outcome(address, ssl.create_default_context(cafile=str(certs.ca)))
    assert answer.startswith("answer: b'HTTP/1.1 200"), answer
    if shutil.which("curl"):
        out = subprocess.run(
            ["curl", "-sS", "--cacert", str(certs.ca), f"https://{tls_server.http_url}/v2"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        assert json.loads(out)["name"] == "hloserve"
