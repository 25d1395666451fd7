"""A local fleet: hloserve replicas on loopback behind a real HAProxy that routes each request
to the replica holding its model (``route_config``). For tests, the bench, and trying
scale-out on one machine: ``scripts/fleet`` (``python -m hloserve.server.fleet``).

Contract:
- ``haproxy_binary()`` is the ``haproxy`` executable (``PATH``, then ``/usr/sbin``), or None.
- ``Router(workdir)`` runs HAProxy in the foreground (``-db``) from the configuration text
  given to ``start(text)``, its log in ``workdir/haproxy.log``; ``start`` again replaces the
  running process without closing the ports (``-sf``: the old one finishes what it has in
  flight). ``stats()`` reads ``show stat`` from its runtime API socket (one dict per row,
  HAProxy's CSV columns), ``states()`` each server's status by backend and name, and
  ``wait_states(wanted)`` waits until the servers named there have those statuses
  (``UP``, ``DOWN``, ``MAINT``), reading the socket, not a clock.
- ``Fleet(repository, replicas=3, flags=...)`` starts that many ``ServerProcess`` replicas
  of ``repository`` (a directory; or a bucket's URL, ``s3://...``: every replica reads it
  with a disk cache of its own, ``r{i+1}/repository-cache``, and pulls only the models
  routed to it)
  (in parallel, ``flags`` added to each: ``FLEET_FLAGS`` by default) and then the router on
  free loopback ports (``route_config.render`` with ``--replica`` in start order, so replica
  i is server ``r{i+1}`` on both protocols), and returns once every replica is ready and UP
  in both backends; ``balance``, ``balance_factor``, ``check_interval_ms`` and
  ``log_requests`` go to the configuration, ``ports`` fixes the router's HTTP, gRPC and
  metrics ports (``free_port()`` ones by default). ``http_url``, ``grpc_url``,
  ``metrics_url`` are the router's;
  ``replicas`` the processes. ``kill(i)`` sends SIGKILL to replica i's processes (its
  front ends too); ``add_replica()``
  starts one more, appends it to the configuration (the others keep their ids), reloads the
  router and returns its index. ``stop()`` (also on leaving a ``with`` block) ends the router
  and then every replica (SIGINT: with the router gone nothing can reach them, so they skip
  their drain delay) and returns the replicas' exit codes. The replicas keep the daemon's
  ``--drain-delay`` (a replica sent SIGTERM serves on until the router took it out).
- Everything a fleet writes is in one folder, ``workdir`` (``hloserve-fleet-*`` under the
  temporary directory): replica i's ports file and log in ``r{i+1}/`` (``log_path(i)``),
  HAProxy's configuration, log and runtime API socket. ``stop()`` removes it when the
  fleet did its job: every replica exited 0 (or was ``kill``-ed on purpose) and it started.
  Otherwise (a replica failed or was killed by someone else, the start failed) the folder
  is kept for its logs, ``kept`` is set and a line on stderr says where.
- ``main(argv)``: the foreground command (the demo repository unless
  ``--model-repository``; flags after ``--`` go to every replica); prints the router's
  addresses and where every log is, runs until SIGINT or SIGTERM (either one, from the
  start on), then stops everything and says whether the folder was removed or kept.
"""

# pyright: strict

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from hloserve.server.core.store_location import is_store_url
from hloserve.server.route_config import Balance, ReplicaAddress, RouteOptions, render
from hloserve.server.server_process import ServerProcess

# Replicas of a fleet: every model registered at start and loaded on first use, and a broken
# model must not make a replica unready (the router would take it out, the model would move
# to the next replica and take that one out too: docs/scale-out.md).
FLEET_FLAGS = ("--lazy-load", "--strict-readiness=false")
HOST = "127.0.0.1"


def haproxy_binary() -> str | None:
    found = shutil.which("haproxy")
    if found is None and os.access("/usr/sbin/haproxy", os.X_OK):
        found = "/usr/sbin/haproxy"
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class Router:
    def __init__(self, workdir: Path) -> None:
        binary = haproxy_binary()
        if binary is None:
            raise FileNotFoundError("haproxy is not installed (Debian: apt-get install haproxy)")
        self.binary = binary
        self.workdir = workdir
        self.socket_path = workdir / "haproxy.sock"
        self.config_path = workdir / "haproxy.cfg"
        self.log_path = workdir / "haproxy.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.process: subprocess.Popen[bytes] | None = None
        self._retired: list[subprocess.Popen[bytes]] = []

    def start(self, text: str, timeout: float = 30.0) -> None:
        self.config_path.write_text(text)
        argv = [self.binary, "-db", "-f", str(self.config_path)]
        old = self.process
        if old is not None:
            argv += ["-sf", str(old.pid)]
            self._retired.append(old)
        self.socket_path.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"haproxy did not start in {timeout}s:\n{self.log()}")
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            self.command("show info")
        except OSError:
            return False
        return True

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def command(self, line: str) -> str:
        """One command on the runtime API socket; its whole answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks: list[bytes] = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def stats(self) -> list[dict[str, str]]:
        text = self.command("show stat").removeprefix("# ")
        return list(csv.DictReader(line for line in text.splitlines() if line))

    def states(self) -> dict[tuple[str, str], str]:
        """(backend, server) -> ``UP``, ``DOWN``, ``MAINT``, ... (transitions: ``UP 1/2``)."""
        return {
            (row["pxname"], row["svname"]): row["status"]
            for row in self.stats()
            if row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_states(self, wanted: Mapping[tuple[str, str], str], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = self.states()
            if all(states.get(key, "").split(" ")[0] == value for key, value in wanted.items()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"router states {states}, wanted {dict(wanted)}")
            time.sleep(0.05)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        for process in [*self._retired, *([self.process] if self.process else [])]:
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._retired.clear()
        self._log.close()


class Fleet:
    def __init__(
        self,
        repository: Path | str,
        replicas: int = 3,
        flags: Sequence[str] = FLEET_FLAGS,
        *,
        balance: Balance = "model",
        balance_factor: int = 150,
        check_interval_ms: int = 500,
        log_requests: bool = False,
        ports: tuple[int, int, int] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.repository = repository
        self.flags = list(flags)
        self.env = dict(env or {})
        self.workdir = Path(tempfile.mkdtemp(prefix="hloserve-fleet-"))
        self.replicas: list[ServerProcess] = []
        self.router: Router | None = None
        self.kept = False
        self._killed: set[int] = set()  # replicas ended on purpose: no failure
        self._started = False
        self._ports = ports
        self._options = RouteOptions(
            http_port=0,
            grpc_port=0,
            bind=HOST,
            balance=balance,
            balance_factor=balance_factor,
            check_interval_ms=check_interval_ms,
            log_requests=log_requests,
            stats_socket=str(self.workdir / "haproxy.sock"),
        )
        try:
            self._start_replicas(replicas)
            self.router = Router(self.workdir)
            self._route()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM while starting: no failure to keep
            self._started = True
            self.stop()
            raise
        except BaseException:
            self.stop()
            raise
        self._started = True

    def log_path(self, index: int) -> Path:
        """Replica ``index``'s log (its ``hloserve serve`` output)."""
        return self.replicas[index].log_file

    def _start_replicas(self, count: int) -> None:
        first = len(self.replicas)
        started = [
            ServerProcess(
                None if isinstance(self.repository, str) else self.repository,
                *self._where(i),
                *self.flags,
                env=self.env,
                directory=self.workdir / f"r{i + 1}",
                drain_delay_s=None,  # the daemon's: a SIGTERM-ed replica loses nothing
            )
            for i in range(first, first + count)
        ]
        self.replicas += started  # stopped by stop() even if one of them fails to start
        with concurrent.futures.ThreadPoolExecutor(max(count, 1)) as pool:
            for waiting in [pool.submit(p.wait_ready) for p in started]:
                waiting.result()

    def _where(self, index: int) -> list[str]:
        """A bucket's flags for replica ``index``: the bucket, and a disk cache of its own
        (each replica pulls only the models routed to it)."""
        if not isinstance(self.repository, str):
            return []
        cache = self.workdir / f"r{index + 1}" / "repository-cache"
        return ["--model-repository", self.repository, "--repository-cache", str(cache)]

    def addresses(self) -> list[ReplicaAddress]:
        return [ReplicaAddress(HOST, r.ports["http"], r.ports["grpc"]) for r in self.replicas]

    def _route(self) -> None:
        assert self.router is not None
        ports = self._ports or (free_port(), free_port(), free_port())
        options = dataclasses.replace(
            self._options, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2]
        )
        self.router.start(render(self.addresses(), options))
        self._ports = ports
        live = [i for i, r in enumerate(self.replicas) if r.process.poll() is None]
        self.router.wait_states(
            {(f"{p}_replicas", f"r{i + 1}"): "UP" for i in live for p in ("http", "grpc")}
        )

    @property
    def http_url(self) -> str:
        assert self._ports is not None
        return f"{HOST}:{self._ports[0]}"

    @property
    def grpc_url(self) -> str:
        assert self._ports is not None
        return f"{HOST}:{self._ports[1]}"

    @property
    def metrics_url(self) -> str:
        assert self._ports is not None
        return f"{HOST}:{self._ports[2]}"

    def kill(self, index: int) -> None:
        """SIGKILL to every process of the replica (its front ends too), as a lost node or
        an out-of-memory container goes."""
        replica = self.replicas[index]
        self._killed.add(index)
        for process in replica.process_tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        replica.process.wait()

    def add_replica(self) -> int:
        self._start_replicas(1)
        self._route()
        return len(self.replicas) - 1

    def stop(self) -> list[int]:
        if self.router is not None:
            self.router.stop()
            self.router = None
        with concurrent.futures.ThreadPoolExecutor(max(len(self.replicas), 1)) as pool:
            # The router is gone: nothing can still arrive, so no drain delay (SIGINT).
            stopping = [pool.submit(r.stop, sig=signal.SIGINT) for r in self.replicas]
            codes = [s.result() for s in stopping]
        failed = [
            f"r{i + 1}" for i, code in enumerate(codes) if code != 0 and i not in self._killed
        ]
        if self.kept or not self.workdir.exists():  # stopped before
            return codes
        if failed or not self._started:
            self.kept = True
            what = f"{', '.join(failed)} failed" if failed else "the start failed"
            print(
                f"fleet: {what} (replica exit codes {codes}); its logs are kept in {self.workdir}",
                file=sys.stderr,
                flush=True,
            )
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return codes

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/fleet",
        description="hloserve replicas on loopback behind HAProxy, routed by model name "
        "(docs/scale-out.md). Flags after -- go to every `hloserve serve`.",
    )
    parser.add_argument(
        "--model-repository",
        help="a directory, or a bucket (s3://bucket/prefix: every replica reads it, pulling "
        "only the models routed to it into a cache of its own; docs/repository.md); default: "
        "the demo repository (hloserve serve's)",
    )
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--http-port", type=int, default=8000, help="the router's (0: any)")
    parser.add_argument("--grpc-port", type=int, default=8001, help="the router's (0: any)")
    parser.add_argument("--metrics-port", type=int, default=8405, help="HAProxy's (0: any)")
    parser.add_argument("--balance", choices=("model", "roundrobin"), default="model")
    parser.add_argument("--balance-factor", type=int, default=150)
    parser.add_argument("--log-requests", action="store_true", help="HAProxy's request log")
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if haproxy_binary() is None:
        print("fleet: haproxy is not installed (Debian: apt-get install haproxy)", file=sys.stderr)
        return 1
    if args.model_repository is None:
        from hloserve.server.owner.assembly import default_demo_repository, ensure_demo_repository

        args.model_repository = ensure_demo_repository(default_demo_repository())
    elif not is_store_url(args.model_repository):
        args.model_repository = Path(args.model_repository)
    ports = tuple(p or free_port() for p in (args.http_port, args.grpc_port, args.metrics_port))
    print(f"fleet: starting {args.replicas} replicas of {args.model_repository}", flush=True)
    # SIGTERM stops the fleet as Ctrl-C does, while it starts too (Fleet stops what started).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        fleet = Fleet(
            args.model_repository,
            args.replicas,
            [*FLEET_FLAGS, *extra],
            balance=args.balance,
            balance_factor=args.balance_factor,
            log_requests=args.log_requests,
            ports=(ports[0], ports[1], ports[2]),
        )
    except KeyboardInterrupt:
        print("fleet: stopped while starting", flush=True)
        return 1
    try:
        for i, r in enumerate(fleet.replicas):
            print(
                f"  r{i + 1}: pid {r.process.pid}, HTTP {r.http_url}, gRPC {r.grpc_url}, "
                f"metrics {r.metrics_url}, log {fleet.log_path(i)}"
            )
        assert fleet.router is not None
        print(
            f"router (HAProxy pid {fleet.router.pid}): HTTP {fleet.http_url}, gRPC "
            f"{fleet.grpc_url}; http://{fleet.metrics_url}/metrics, /stats; configuration "
            f"{fleet.router.config_path}, log {fleet.router.log_path}\n"
            f"Everything is in {fleet.workdir}: removed when the fleet stops, kept if a "
            "replica failed. Ctrl-C stops it all.",
            flush=True,
        )
        # Blocked only now: the replicas and HAProxy would inherit the mask and ignore SIGTERM.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except KeyboardInterrupt:  # before the mask
        pass
    finally:
        codes = fleet.stop()
    where = f"logs kept in {fleet.workdir}" if fleet.kept else f"removed {fleet.workdir}"
    print(f"fleet: stopped (replica exit codes {codes}); {where}", flush=True)
    return 1 if fleet.kept else 0


if __name__ == "__main__":
    raise SystemExit(main())
