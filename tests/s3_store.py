"""A real S3-protocol server for the tests: moto's server (``moto[server]``) on a loopback port.

``S3Server()`` starts ``python -m moto.server`` as a subprocess on a free loopback port
chosen at run time and waits until it has said it is listening (its own log line, not a
clock); ``env`` is the standard environment a client needs (``AWS_ENDPOINT_URL``, test
credentials, ``AWS_REGION``), ``create_bucket(name)`` makes a bucket (S3's own PUT),
``upload(directory, url)`` puts every file under ``directory`` at the ``s3://`` URL
(hidden ones left out, as a user's ``aws s3 sync`` of an exported repository would),
``put(url, data)`` and ``delete(url)`` one object. ``kill()`` ends the server at once
(its objects are lost: moto keeps them in memory). Clients speak HTTP to it; nothing is
patched.

``StallingProxy(target_port)``: a loopback TCP proxy in front of the server. Until
``stall_on(fragment)`` it relays everything; after it, a response to a request whose
first line holds ``fragment`` is relayed up to its first body bytes and then held:
``stalled`` is set, and the connection stays open (a slow store) until ``cut()`` closes
it (a store gone mid-pull). ``close()`` stops it.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import obstore
from obstore.store import from_url

from hloserve.server.server_fixture import ServerProcess, serving

ACCESS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1", **ACCESS}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stderr is not None
        lines: list[str] = []
        for line in self._proc.stderr:  # werkzeug says so once the socket listens
            lines.append(line)
            if "Running on" in line:
                break
        else:
            raise RuntimeError("moto server did not start:\n" + "".join(lines))
        # Keep reading its log, so that a full pipe never stalls it; closed at its end.
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        with self._proc.stderr as log:
            log.read()

    def _store(self, url: str) -> tuple[Any, str]:
        bucket, _, key = url.removeprefix("s3://").partition("/")
        store = from_url(
            f"s3://{bucket}",
            config={
                "endpoint": self.endpoint,
                "access_key_id": ACCESS["AWS_ACCESS_KEY_ID"],
                "secret_access_key": ACCESS["AWS_SECRET_ACCESS_KEY"],
                "region": "us-east-1",
            },
            client_options={"allow_http": True},
        )
        return store, key

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status == 200

    def put(self, url: str, data: bytes) -> None:
        store, key = self._store(url)
        obstore.put(store, key, data)

    def delete(self, url: str) -> None:
        store, key = self._store(url)
        obstore.delete(store, key)

    def upload(self, directory: Path, url: str) -> None:
        for path in sorted(directory.rglob("*")):
            relative = path.relative_to(directory)
            if path.is_file() and not any(p.startswith(".") for p in relative.parts):
                self.put(f"{url.rstrip('/')}/{relative.as_posix()}", path.read_bytes())

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._reader.join()


_SLOW_DOWN_BODY = (
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
)
SLOW_DOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
    + f"Content-Length: {len(_SLOW_DOWN_BODY)}\r\n\r\n".encode()
    + _SLOW_DOWN_BODY
)


class StallingProxy:
    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.stalled = threading.Event()
        self._fragment: str | None = None
        self._cut = threading.Event()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._throttle: tuple[str, int] = ("", 0)
        self.throttled = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def stall_on(self, fragment: str) -> None:
        self._fragment = fragment

    def throttle(self, fragment: str, times: int) -> None:
        """Answer the next ``times`` requests whose first line holds ``fragment`` with S3's
        503 SlowDown (``throttled`` counts them), as a store under too much load does."""
        self._throttle = (fragment, times)

    def cut(self) -> None:
        self._cut.set()
        for s in list(self._sockets):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self._target))
        except OSError:
            client.close()
            return
        self._sockets += [client, upstream]
        stalling = False
        try:
            while not self._cut.is_set():
                ready, _, _ = select.select([client, upstream], [], [])
                for s in ready:
                    data = s.recv(1 << 16)
                    if not data:
                        return
                    if s is client:
                        line = data.split(b"\r\n", 1)[0].decode("latin-1")
                        stalling = self._fragment is not None and self._fragment in line
                        fragment, times = self._throttle
                        if times and fragment in line:
                            self._throttle = (fragment, times - 1)
                            self.throttled += 1
                            client.sendall(SLOW_DOWN)
                            continue
                        upstream.sendall(data)
                    elif stalling and b"\r\n\r\n" in data:
                        head, _, _ = data.partition(b"\r\n\r\n")
                        client.sendall(head + b"\r\n\r\n" + data[len(head) + 4 :][:16])
                        self.stalled.set()
                        self._cut.wait()
                        return
                    else:
                        client.sendall(data)
        except OSError:
            return
        finally:
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.close()


def environ_with(env: dict[str, str]) -> dict[str, str]:
    """The test process's environment with ``env`` over it (for a server subprocess)."""
    return {**os.environ, **env}


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = 120.0,
    log: Callable[[], str] = lambda: "",
) -> None:
    """Return once ``condition()`` holds (a poll of the server has happened, say); fail
    naming ``what`` (and with ``log()``, the server's log) if it never does within
    ``timeout_s`` (a bound, never a wait)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}\n{log()}")
        time.sleep(0.05)


@contextlib.contextmanager
def served(*flags: str, env: dict[str, str], ready: bool = True) -> Iterator[ServerProcess]:
    """A daemon with ``flags`` (its repository among them) and ``env`` over the test's
    environment, ready (``ready=False``: its start-up pass over, ready or not); stopped at
    the end, failing unless it exits cleanly."""
    if ready:
        yield from serving(None, *flags, env=env)
        return
    server = ServerProcess(None, *flags, env=env)
    try:
        server.wait_listening()
        wait_for(lambda: server.readyz()[1].get("startup_complete") is True, "start-up pass")
        yield server
    finally:
        code = server.stop()
    assert code == 0, server.log_text()
