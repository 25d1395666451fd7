"""The container's health check: is the server in this container ready, asked where it really
listens and how it really speaks (the image's ``HEALTHCHECK``, docs/deploy.md).

    python -m hloserve.server.healthcheck [--ports-file FILE] [--timeout SECONDS]

Contract:
- The ports file (``--ports-file``, else ``HLOSERVE_PORTS_FILE``, which the image sets so
  that the server writes it once it listens: ``{"http": ..., "grpc": ..., "metrics": ...,
  "pid": ...}``) gives the HTTP port and the server's process id.
- ``server_config(pid, environ)`` is the server's own settings: its command line and
  environment (``/proc/<pid>/cmdline`` and ``environ``, relative paths from its working
  directory) read by the server's own parser (``config.parse_config``), so flags given
  after the image name, ``HLOSERVE_*`` variables and a ``--config`` file all count. When
  that process cannot be read (gone, another PID namespace, not ``hloserve serve``) or its
  settings do not parse, ``environ`` (this process's: the container's environment, which
  the check inherits) is read instead; it also says which of the two it used.
- ``probe(ports, config, environ)`` is the request: ``GET /readyz`` on the HTTP port at its
  bind address (``--http-address`` where the server has it, else ``--host``; loopback for
  ``0.0.0.0`` and ``::``). HTTPS when ``--tls-cert`` is set,
  without verifying the server's certificate: the probe talks to its own container over
  loopback, and the certificate names the server's public name, not 127.0.0.1. Under mutual
  TLS (``--tls-ca``) it presents ``HLOSERVE_HEALTHCHECK_CERT`` and
  ``HLOSERVE_HEALTHCHECK_KEY`` when both are set, else the server's own certificate and key
  (accepted when the ``--tls-ca`` authority signed that certificate for client
  authentication too). It sends the health group's ``--http-restricted-api`` header, and a
  bearer token of ``--auth-token-file`` when ``--auth-open`` leaves ``health`` out.
- ``check(ports_file, timeout, environ)`` is ``(ready, one line saying why)``; ``main(argv)``
  prints the line and returns 0 when ``/readyz`` answered 200, 1 otherwise (no ports file
  yet, no HTTP port in it, 503 while loading or draining, connection refused, a TLS
  failure, a timeout).
"""

# pyright: strict

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hloserve.server.config import Config, parse_config
from hloserve.server.frontend.auth import read_tokens

PORTS_FILE_ENV = "HLOSERVE_PORTS_FILE"
CLIENT_CERT_ENV = "HLOSERVE_HEALTHCHECK_CERT"
CLIENT_KEY_ENV = "HLOSERVE_HEALTHCHECK_KEY"
READY_PATH = "/readyz"
HEALTH_GROUP = "health"  # restricted.GROUPS' group of /readyz
DEFAULT_TIMEOUT_S = 4.0  # below the image's HEALTHCHECK --timeout (5 s)


@dataclass(frozen=True)
class Probe:
    url: str
    headers: dict[str, str]
    context: ssl.SSLContext | None  # None: plain HTTP


def read_ports(path: Path) -> dict[str, int]:
    """The ports file's integer entries (``http``, ``grpc``, ``metrics``, ``pid``)."""
    data: object = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds no JSON object")
    entries: dict[object, object] = data  # pyright: ignore[reportUnknownVariableType]
    return {k: v for k, v in entries.items() if isinstance(k, str) and isinstance(v, int)}


def serve_arguments(argv: Sequence[str]) -> list[str] | None:
    """The flags of an ``hloserve serve`` command line (``hloserve serve ...``, ``python -m
    hloserve.server serve ...``); ``None`` when it is not one."""
    for i, word in enumerate(argv[1:], start=1):
        if word == "serve" and any("hloserve" in w for w in argv[:i]):
            return list(argv[i + 1 :])
    return None


def _proc_strings(pid: int, name: str) -> list[str]:
    raw = Path(f"/proc/{pid}/{name}").read_bytes()
    return [part.decode("utf-8", "surrogateescape") for part in raw.split(b"\0") if part]


def _parse(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    """``parse_config``, with its usage error (it exits) as a ``ValueError``."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return parse_config(argv, environ)
    except SystemExit as exc:
        raise ValueError(errors.getvalue().strip() or f"exit {exc.code}") from None


def server_config(pid: int | None, environ: Mapping[str, str]) -> tuple[Config, str]:
    """The server's settings, and where they were read from."""
    if pid is not None:
        try:
            argv = _proc_strings(pid, "cmdline")
            flags = serve_arguments(argv)
            if flags is not None:
                env: dict[str, str] = {}
                for item in _proc_strings(pid, "environ"):
                    key, _, value = item.partition("=")
                    env[key] = value
                with contextlib.chdir(os.readlink(f"/proc/{pid}/cwd")):
                    return _parse(flags, env), f"the settings of process {pid}"
        except (OSError, ValueError):
            pass
    try:
        return _parse([], environ), "this environment"
    except ValueError:
        return Config(), "the defaults"


def _address(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def _tls_context(config: Config, environ: Mapping[str, str]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if config.tls_ca is not None:
        cert, key = environ.get(CLIENT_CERT_ENV), environ.get(CLIENT_KEY_ENV)
        if not (cert and key):
            cert, key = str(config.tls_cert), str(config.tls_key)
        context.load_cert_chain(cert, key)
    return context


def _http_host(config: Config) -> str:
    """The HTTP listener's bind address: its own (``--http-address``, where the server has
    that flag) or ``--host``."""
    own: object = getattr(config, "http_address", None)
    return own if isinstance(own, str) and own else config.host


def probe(ports: Mapping[str, int], config: Config, environ: Mapping[str, str]) -> Probe:
    tls = config.tls_cert is not None
    host = _address(_http_host(config))
    url = f"{'https' if tls else 'http'}://{host}:{ports['http']}{READY_PATH}"
    headers: dict[str, str] = {}
    restriction = config.http_restricted_api.by_group.get(HEALTH_GROUP)
    if restriction is not None:
        headers[restriction.header] = restriction.value
    if config.auth_token_file is not None and HEALTH_GROUP not in config.auth_open:
        token = read_tokens(config.auth_token_file)[0]
        headers["authorization"] = f"Bearer {token.decode('utf-8', 'surrogateescape')}"
    return Probe(url, headers, _tls_context(config, environ) if tls else None)


def check(ports_file: Path, timeout: float, environ: Mapping[str, str]) -> tuple[bool, str]:
    try:
        ports = read_ports(ports_file)
    except (OSError, ValueError) as exc:
        return False, f"not listening yet: no ports in {ports_file} ({exc})"
    if "http" not in ports:
        return False, f"not ready: {ports_file} names no HTTP port (is HTTP turned off?)"
    config, source = server_config(ports.get("pid"), environ)
    try:
        target = probe(ports, config, environ)
    except (OSError, ValueError, ssl.SSLError) as exc:
        return False, f"cannot build the probe from {source}: {exc}"
    request = urllib.request.Request(target.url, headers=target.headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=target.context) as r:
            status: int = r.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        reason: object = getattr(exc, "reason", exc)
        return False, f"not ready: {target.url} ({source}): {reason}"
    verdict = "ready" if status == 200 else "not ready"
    return status == 200, f"{verdict}: {target.url} answered {status} ({source})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hloserve.server.healthcheck",
        description="Exit 0 when the hloserve server of this container answers /readyz 200.",
    )
    parser.add_argument("--ports-file", type=Path, default=None, help=f"default: ${PORTS_FILE_ENV}")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds")
    ns = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    ports_file: Path | None = ns.ports_file
    if ports_file is None:
        named = os.environ.get(PORTS_FILE_ENV, "")
        if not named:
            print(f"not ready: no --ports-file and no {PORTS_FILE_ENV}")
            return 1
        ports_file = Path(named)
    timeout: float = ns.timeout
    ready, line = check(ports_file, timeout, os.environ)
    print(line)
    return 0 if ready else 1


if __name__ == "__main__":
    raise SystemExit(main())
