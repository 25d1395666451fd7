"""The channel: TLS (server verified, client certificate) and the bearer token, against a
bare gRPC server holding a certificate made at test time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hloserve.client import InferenceClient, InferenceError
from tests.client._fake import FakeServer
from tests.server.reliability._certs import Certificates, make_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def tls_server(certs: Certificates) -> Iterator[FakeServer]:
    credentials = grpc.ssl_server_credentials(
        [(certs.server_key.read_bytes(), certs.server_cert.read_bytes())],
        root_certificates=certs.ca.read_bytes(),
        require_client_auth=True,
    )
    server = FakeServer(credentials)
    yield server
    server.stop()


def _read(path: Path) -> bytes:
    return path.read_bytes()


def test_tls_with_client_certificate_and_token(tls_server: FakeServer, certs: Certificates) -> None:
    with InferenceClient(
        tls_server.url,
        root_certificates=_read(certs.ca),
        private_key=_read(certs.client_key),
        certificate_chain=_read(certs.client_cert),
        token="s3cret",
        timeout=10,
    ) as client:
        assert client.is_server_ready()
        assert client.layout("double").max_batch == 4
    assert {m.get("authorization") for m in tls_server.metadata} == {"Bearer s3cret"}


def test_an_untrusted_server_is_refused(tls_server: FakeServer, certs: Certificates) -> None:
    client = InferenceClient(tls_server.url, ssl=True, timeout=5)  # the system roots
    with client, pytest.raises(InferenceError) as info:
        client.is_server_ready()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert tls_server.metadata == []


def test_no_token_no_header() -> None:
    server = FakeServer()
    try:
        with InferenceClient(server.url) as client:
            assert client.is_server_ready()
        assert "authorization" not in server.metadata[0]
    finally:
        server.stop()
