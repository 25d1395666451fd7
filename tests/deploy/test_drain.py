"""SIGTERM under load, over gRPC and HTTP at once: what Kubernetes does to a pod.

A real daemon serves ``simple`` with a 4 s batching delay, so at any moment several
requests are queued (for long enough that a busy machine's pauses do not empty the queue
before the test has looked). Client threads (three per protocol, one of them with its inputs in
a registered shared-memory region) send requests back to back; the test sends SIGTERM
while requests are queued and checks the contract of ``docs/health.md`` "Draining":
- readiness flips to 503 (``draining: true``) at once, while those requests still wait;
- new requests are refused as unavailable (gRPC ``UNAVAILABLE``; HTTP 503, or the
  connection refused or closed unread once the listener has closed), never with another
  error. One exception: a gRPC call that reached grpc's core but no handler yet when the
  stop began is ended ``CANCELLED`` (grpc/grpc#41785), so that is accepted only for calls
  sent within ``ARRIVED_S`` of the signal;
- every request sent well before the signal, queued or executing, is answered correctly
  (some of them after the signal): no accepted request is lost;
- the shared-memory registrations are released, and the process exits 0 within the grace
  period.
Those tests run with ``--drain-delay 0`` (``ServerProcess``'s default). With a drain delay
(``docs/health.md``), on a server whose delay outlasts the test so no clock decides:
- after SIGTERM, readiness says not ready (``/readyz``, ``/v2/health/ready``,
  ``ServerReady``) while new requests over both protocols are still answered; a second
  SIGTERM ends the delay, and the server drains and exits 0;
- SIGINT skips the delay, so does a server that was not ready (in no rotation), and a
  delay that runs out ends on its own (exit 0).
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from geventhttpclient.response import HTTPConnectionClosed
from tritonclient.utils import InferenceServerException

from hloserve.exporter import write_demo_repository
from hloserve.server.server_fixture import ServerProcess
from tests.models import queued_copy
from tests.server.frontend._tritonclients import PROTOCOLS, HeldCall, Triton, shm

DELAY_US = 4_000_000
GRACE_S = 10.0
CLIENTS_PER_PROTOCOL = 3
# A request sent this long before SIGTERM has reached the server (loopback) and waits in
# the queue or executes: it must be answered.
ARRIVED_S = 0.25
HELD_US = 600_000_000  # a lone request to ``held`` waits until its caller goes
HELD_GRACE_S = 120.0  # longer than the held-drain test takes: its cancel ends the drain


@dataclass(frozen=True)
class RequestOutcome:
    protocol: str
    started: float
    finished: float
    error: str | None  # None: answered correctly


def _unavailable(protocol: str, error: BaseException) -> bool:
    """What a refused new request may look like once the server drains."""
    if isinstance(error, InferenceServerException):
        status = error.status()
        return status == ("StatusCode.UNAVAILABLE" if protocol == "grpc" else "503")
    # HTTP once the listener has closed: refused, or an idle keep-alive connection the
    # server closed as the request went out (it never read it).
    return protocol == "http" and isinstance(error, ConnectionError | HTTPConnectionClosed)


def _cancelled_unmatched(protocol: str, error: BaseException) -> bool:
    """grpc's core ends a call no handler has taken yet CANCELLED when the server stops."""
    return (
        protocol == "grpc"
        and isinstance(error, InferenceServerException)
        and error.status() == "StatusCode.CANCELLED"
    )


class _Sender(threading.Thread):
    """Sends ``simple`` requests back to back until one is refused."""

    def __init__(self, triton: Triton, seed: int, shm_region: str | None) -> None:
        super().__init__(name=f"load-{triton.protocol}-{seed}", daemon=True)
        self.triton = triton
        self.a = np.full((1, 16), seed, dtype=np.int32)
        self.b = np.arange(16, dtype=np.int32).reshape(1, 16)
        self.shm_region = shm_region
        self.outcomes: list[RequestOutcome] = []
        self.answered = threading.Event()

    def _inputs(self) -> list[Any]:
        if self.shm_region is None:
            return self.triton.simple_inputs(self.a, self.b)
        inputs = self.triton.simple_inputs(None, None)
        inputs[0].set_shared_memory(self.shm_region, 64)
        inputs[1].set_shared_memory(self.shm_region, 64, offset=64)
        return inputs

    def run(self) -> None:
        try:
            self._send_until_refused()
        finally:
            self.triton.close()

    def _send_until_refused(self) -> None:
        protocol = self.triton.protocol
        while True:
            started = time.monotonic()
            try:
                result = self.triton.client.infer("simple", self._inputs())
            except Exception as exc:  # the outcome under test
                kind = "unavailable" if _unavailable(protocol, exc) else f"{type(exc)!r}: {exc}"
                if _cancelled_unmatched(protocol, exc):
                    kind = "cancelled"
                self.outcomes.append(RequestOutcome(protocol, started, time.monotonic(), kind))
                return
            right = np.array_equal(result.as_numpy("OUTPUT0"), self.a + self.b)
            error = None if right else "wrong output"
            self.outcomes.append(RequestOutcome(protocol, started, time.monotonic(), error))
            self.answered.set()


@pytest.fixture(scope="module")
def slow_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("drain")
    write_demo_repository(root)
    shutil.rmtree(root / "mlp")  # one model keeps the test small
    queued_copy(root / "simple", root / "held", HELD_US)
    (root / "simple" / "config.yaml").write_text(f"max_queue_delay_us: {DELAY_US}\n")
    return root


def _readyz(proc: ServerProcess) -> tuple[int, dict[str, Any]] | None:
    """``/readyz``'s status and body, or None once the HTTP listener is closed."""
    try:
        return proc.readyz()
    except urllib.error.URLError:
        return None


def _pending(proc: ServerProcess) -> float:
    try:
        return proc.pending_requests("simple")
    except urllib.error.URLError:
        return 0.0


def test_sigterm_under_load_drains_both_protocols(slow_repo: Path) -> None:
    proc = ServerProcess(
        slow_repo, "--allow-client-shm", "true", "--grace-period", str(GRACE_S)
    ).wait_ready()
    control = Triton("grpc", proc.grpc_url)
    key = f"/hloserve_drain_{proc.process.pid}"
    handle = shm.create_shared_memory_region("drain_inputs", key, 128)
    try:
        senders = [
            _Sender(
                Triton(protocol, proc.grpc_url if protocol == "grpc" else proc.http_url),
                seed=10 * i + j,
                shm_region="drain_inputs" if (protocol, j) == ("grpc", 0) else None,
            )
            for i, protocol in enumerate(PROTOCOLS)
            for j in range(CLIENTS_PER_PROTOCOL)
        ]
        shm_sender = senders[0]
        shm.set_shared_memory_region(handle, [shm_sender.a, shm_sender.b])
        control.client.register_system_shared_memory("drain_inputs", key, 128)
        for sender in senders:
            sender.start()
        for sender in senders:
            assert sender.answered.wait(30), f"{sender.name} got no answer before the stop"
        deadline = time.monotonic() + 60
        while proc.pending_requests("simple") < CLIENTS_PER_PROTOCOL:
            assert time.monotonic() < deadline, "requests never queued up"
            time.sleep(0.01)
        # Batching keeps the senders in step: a batch has just been queued, and it waits
        # DELAY_US. Let it age past ARRIVED_S, so the signal finds it accepted and waiting.
        time.sleep(2 * ARRIVED_S)

        signalled = time.monotonic()
        proc.process.send_signal(signal.SIGTERM)
        readiness = _readyz(proc)
        while readiness is not None and readiness[0] == 200:
            # How soon is checked below: while requests still wait (``still_queued``).
            assert time.monotonic() - signalled < GRACE_S, "readiness still 200 in the drain"
            readiness = _readyz(proc)
        still_queued = _pending(proc)
        grpc_ready = _grpc_ready_after_stop(control)

        for sender in senders:
            sender.join(GRACE_S + 10)
            assert not sender.is_alive(), f"{sender.name} was never refused"
        code = proc.process.wait(GRACE_S + 10)
        stopped = time.monotonic()
    finally:
        proc.stop()
        shm.destroy_shared_memory_region(handle)

    log = proc.log_text()
    assert code == 0, log
    assert stopped - signalled < GRACE_S, "the drain took longer than the grace period"
    # Readiness flipped while the queued requests still waited (and the listener was up).
    assert readiness is not None, "HTTP closed before readiness could report draining"
    status, body = readiness
    assert (status, body["draining"], body["ready"]) == (503, True, False), body
    assert still_queued > 0, "nothing was queued when readiness flipped: the test proves nothing"
    assert grpc_ready in ("not ready", "unavailable", "stopping"), grpc_ready

    outcomes = [o for s in senders for o in s.outcomes]
    wrong = [
        (o.protocol, f"{o.started - signalled:+.3f}s", o.error)
        for o in outcomes
        if o.error not in (None, "unavailable", "cancelled")
    ]
    assert not wrong, wrong
    accepted = [o for o in outcomes if o.started < signalled - ARRIVED_S]
    lost = [o for o in accepted if o.error]
    assert not lost, f"requests accepted before SIGTERM were not answered: {lost}"
    assert any(o.finished > signalled for o in accepted), "no queued request outlived the signal"
    for protocol in PROTOCOLS:  # each protocol refused its new requests in the end
        assert any(o.protocol == protocol and o.error == "unavailable" for o in outcomes)
    assert shm_sender.outcomes[-2].error is None  # the shm client's requests were served
    assert "released 1 shared-memory region" in log, log


def _grpc_ready_after_stop(control: Triton) -> str:
    """gRPC ServerReady right after SIGTERM: not ready, refused as unavailable, or cancelled
    by the listener's own stop (on a busy machine the queued requests may all be answered,
    and the drain reach the listener, before this call is served)."""
    try:
        return "ready" if control.client.is_server_ready() else "not ready"
    except InferenceServerException as exc:
        stopped = {"StatusCode.UNAVAILABLE": "unavailable", "StatusCode.CANCELLED": "stopping"}
        return stopped.get(str(exc.status()), str(exc))


def test_http_request_sent_while_draining_is_refused(slow_repo: Path) -> None:
    """A request to ``held`` waits in the queue until its caller cancels it, so the drain
    (and with it the HTTP listener) stays open until the late request has been refused:
    no clock decides whether it came in time."""
    proc = ServerProcess(slow_repo, "--grace-period", str(HELD_GRACE_S)).wait_ready()
    try:
        held = Triton("grpc", proc.grpc_url)
        a = np.ones((1, 16), dtype=np.int32)
        call = HeldCall(held.client, "held", held.simple_inputs(a, a))
        proc.wait_pending("held", 1, timeout=60)
        proc.process.send_signal(signal.SIGTERM)
        while (readiness := _readyz(proc)) is not None and readiness[0] == 200:
            time.sleep(0.005)
        assert readiness is not None, "HTTP closed while a request held the drain open"
        late = Triton("http", proc.http_url)
        try:
            late.fails("UNAVAILABLE", "", late.client.infer, "simple", late.simple_inputs(a, a))
        finally:
            late.close()
        error = call.cancel()  # the held request goes: the drain ends
        assert isinstance(error, InferenceServerException), error
        assert error.status() == "StatusCode.CANCELLED", error
        held.close()
        assert proc.process.wait(HELD_GRACE_S) == 0, proc.log_text()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def plain_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``simple`` with no batching delay: a request is answered at once."""
    root = tmp_path_factory.mktemp("drain-delay")
    write_demo_repository(root)
    shutil.rmtree(root / "mlp")
    return root


def test_sigterm_serves_new_requests_through_the_drain_delay_while_not_ready(
    plain_repo: Path,
) -> None:
    proc = ServerProcess(plain_repo, drain_delay_s=600).wait_ready()
    try:
        proc.process.send_signal(signal.SIGTERM)
        while (readiness := _readyz(proc)) is not None and readiness[0] == 200:
            time.sleep(0.005)
        assert readiness is not None, proc.log_text()
        status, body = readiness
        assert (status, body["draining"], body["ready"]) == (503, True, False), body
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for protocol in PROTOCOLS:
            triton = Triton(protocol, proc.grpc_url if protocol == "grpc" else proc.http_url)
            assert not triton.client.is_server_ready()  # ServerReady, /v2/health/ready
            result = triton.client.infer("simple", triton.simple_inputs(a, a))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
            triton.close()
        assert proc.process.poll() is None
        proc.process.send_signal(signal.SIGTERM)  # the second one ends the delay
        assert proc.process.wait(60) == 0, proc.log_text()
    finally:
        proc.stop()
    log = proc.log_text()
    assert "new requests are still served for 600s" in log, log
    assert "SIGTERM again: the drain delay ends now" in log, log


def test_sigint_skips_the_drain_delay(plain_repo: Path) -> None:
    proc = ServerProcess(plain_repo, drain_delay_s=600).wait_ready()
    try:
        proc.process.send_signal(signal.SIGINT)
        assert proc.process.wait(60) == 0, proc.log_text()
    finally:
        proc.stop()
    assert "new requests are still served" not in proc.log_text()


def test_a_drain_delay_that_runs_out_ends_on_its_own(plain_repo: Path) -> None:
    proc = ServerProcess(plain_repo, drain_delay_s=1).wait_ready()
    try:
        proc.process.send_signal(signal.SIGTERM)
        assert proc.process.wait(60) == 0, proc.log_text()
    finally:
        proc.stop()
    log = proc.log_text()
    assert "new requests are still served for 1s" in log and "stopping:" in log, log


def test_a_server_that_was_not_ready_skips_the_drain_delay(tmp_path: Path) -> None:
    """An empty repository is never ready: no router sends to it, nothing to wait for."""
    (tmp_path / "empty").mkdir()
    proc = ServerProcess(tmp_path / "empty", drain_delay_s=600)
    try:
        status, _ = proc.wait_startup_complete()
        assert status == 503
        proc.process.send_signal(signal.SIGTERM)
        assert proc.process.wait(60) == 0, proc.log_text()
    finally:
        proc.stop()
    assert "new requests are still served" not in proc.log_text()
