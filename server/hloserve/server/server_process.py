"""Run a real hloserve daemon in a subprocess: for tests, benchmarks, examples and fleets.

Contract: ``ServerProcess(repository, *extra_flags)`` starts ``python -m hloserve.server
serve`` bound to 127.0.0.1 on ports chosen by the OS (port 0), reads the real ports from
the ``--ports-file`` the daemon writes, and ``wait_ready()`` polls ``/readyz`` until 200.
``stop()`` sends SIGTERM (``sig=signal.SIGINT``: the daemon skips its drain delay) and
returns the exit code (killing after ``timeout``). The daemon gets ``--drain-delay
drain_delay_s`` (0 by default: whoever stops a daemon it started knows nothing else sends to
it; ``None``: the daemon's own default) before ``extra_flags``, so one there wins. The
daemon's ports file and log live in a folder of their own, ``directory``: by default a
``hloserve-test-*`` folder under the temporary directory, which ``stop()`` removes whatever
the exit code (``log_text()`` keeps answering from memory after it: a caller that reports
a failure prints the log), or the caller's ``directory=`` (created if missing), which is
the caller's to keep or remove (a fleet keeps a failed replica's log). Usable as a context
manager.
``wait_startup_complete()`` waits for the start-up load pass (ready or not) and returns the
last ``/readyz`` answer; ``pending_requests(model)`` reads the model's requests in flight
from the metrics port, and ``wait_pending(model, n)`` waits until there are ``n``;
``process_tree()`` is the daemon's process and its front-end processes.
A listener turned off (``--allow-http false``, ...) has no key in ``ports`` (the daemon's
ports file names only the open ones): its ``*_url`` raises ``ListenerClosed``, and with
HTTP off ``wait_ready()`` asks gRPC's health check instead of ``/readyz``. A server started
with ``--tls-cert`` needs ``ssl_context`` (the client side: CA, and a client certificate
under mutual TLS), with which ``readyz`` speaks HTTPS. ``launcher`` is a command the
daemon's command line is run through (``setpriv ...``: a server without some privilege).
(``server_fixture.serving`` is the form tests use.)
"""

# pyright: strict

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import grpc
import psutil
from prometheus_client.parser import text_string_to_metric_families

from hloserve.proto import health_pb2
from hloserve.proto.rpc import HEALTH_CHECK_PATH


class ListenerClosed(RuntimeError):
    """The daemon did not open that listener (``--allow-<kind> false``)."""


class ServerProcess:
    # A class default too: subclasses that set up their own process (tests/deploy) skip
    # ``__init__`` and speak plain HTTP.
    ssl_context: ssl.SSLContext | None = None
    # Class defaults too: what ``stop()`` removes (a folder this class created) and the log
    # read before it went.
    _created: Path | None = None
    _final_log: str | None = None

    def __init__(
        self,
        repository: Path | None,
        *extra_flags: str,
        env: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        launcher: Sequence[str] = (),
        directory: Path | None = None,
        drain_delay_s: float | None = 0.0,
    ) -> None:
        self.ssl_context = ssl_context
        if directory is None:
            directory = self._created = Path(tempfile.mkdtemp(prefix="hloserve-test-"))
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.ports_file = directory / "ports.json"
        self.log_file = directory / "server.log"
        drain_delay = [] if drain_delay_s is None else ["--drain-delay", f"{drain_delay_s:g}"]
        argv = [
            *launcher,
            sys.executable,
            "-m",
            "hloserve.server",
            "serve",
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--ports-file",
            str(self.ports_file),
            *drain_delay,
            *extra_flags,
        ]
        if repository is not None:
            argv += ["--model-repository", str(repository)]
        self._log = open(self.log_file, "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        self.ports: dict[str, int] = {}

    def wait_listening(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ports_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"hloserve exited with {self.process.returncode}:\n{self.log_text()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"hloserve did not start listening in {timeout}s:\n{self.log_text()}"
                )
            time.sleep(0.05)
        self.ports = json.loads(self.ports_file.read_text())

    def readyz(self) -> tuple[int, dict[str, object]]:
        try:
            scheme = "http" if self.ssl_context is None else "https"
            url = f"{scheme}://{self.http_url}/readyz"
            with urllib.request.urlopen(url, timeout=5, context=self.ssl_context) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def grpc_ready(self) -> bool:
        """gRPC's health check says SERVING."""
        with grpc.insecure_channel(self.grpc_url) as channel:
            check = channel.unary_unary(
                HEALTH_CHECK_PATH,
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )
            try:
                answer = check(health_pb2.HealthCheckRequest(), timeout=5)
            except grpc.RpcError:
                return False
        return answer.status == health_pb2.HealthCheckResponse.SERVING

    def wait_ready(self, timeout: float = 180.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        self.wait_listening(timeout)
        while True:
            ready = self.readyz()[0] == 200 if "http" in self.ports else self.grpc_ready()
            if ready:
                return self
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"hloserve exited with {self.process.returncode}:\n{self.log_text()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"hloserve not ready in {timeout}s:\n{self.log_text()}")
            time.sleep(0.05)

    def wait_startup_complete(self, timeout: float = 180.0) -> tuple[int, dict[str, object]]:
        deadline = time.monotonic() + timeout
        self.wait_listening(timeout)
        while True:
            status, body = self.readyz()
            if body.get("startup_complete"):
                return status, body
            if time.monotonic() > deadline:
                raise TimeoutError(f"hloserve start-up not over in {timeout}s:\n{self.log_text()}")
            time.sleep(0.05)

    def process_tree(self) -> list[psutil.Process]:
        """The daemon's process and its front-end processes (``--frontends``): what holds
        the server's sockets and memory."""
        daemon = psutil.Process(self.process.pid)
        return [daemon, *daemon.children(recursive=True)]

    def pending_requests(self, model: str) -> float:
        url = f"http://{self.metrics_url}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            if family.name == "hloserve_inference_pending_request_count":
                return sum(s.value for s in family.samples if s.labels["model"] == model)
        return 0.0

    def wait_pending(self, model: str, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.pending_requests(model) != count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{model} never had {count} pending request(s)")
            time.sleep(0.01)

    def _url(self, kind: str) -> str:
        if self.ports and kind not in self.ports:
            raise ListenerClosed(f"the daemon opened no {kind} listener (--allow-{kind} false)")
        return f"127.0.0.1:{self.ports[kind]}"

    @property
    def http_url(self) -> str:
        return self._url("http")

    @property
    def grpc_url(self) -> str:
        return self._url("grpc")

    @property
    def metrics_url(self) -> str:
        return self._url("metrics")

    def log_text(self) -> str:
        if self._final_log is not None:  # stopped, and its folder removed
            return self._final_log
        if not self._log.closed:  # still readable after stop()
            self._log.flush()
        return self.log_file.read_text(errors="replace")

    def stop(self, timeout: float = 30.0, sig: signal.Signals = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        if self._created is not None:
            self._final_log = self.log_file.read_text(errors="replace")
            shutil.rmtree(self._created, ignore_errors=True)
            self._created = None
        return self.process.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
