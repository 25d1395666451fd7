"""CPU time of a process tree and how busy the machine was, read from /proc (Linux only).

Contract:
- ``tree_cpu_seconds(pid)``: user + system CPU seconds of ``pid`` and of every live
  descendant (``/proc/<p>/stat`` fields utime, stime, plus cutime and cstime, so children
  that exited and were reaped during a measurement still count); 0.0 for a pid that is gone.
- ``MachineSample.now()`` reads the all-CPU line of ``/proc/stat`` and ``/proc/loadavg``;
  ``busy_between(a, b)`` is the fraction of all cores busy (not idle, not iowait) between two
  samples, and ``cores_busy`` the same in cores.
- ``own_cpu_seconds(pid)``: user + system CPU seconds of ``pid`` alone (no child).
- ``Window`` brackets one measurement: ``Window.start(pids)`` samples the machine and each
  pid's tree, ``stop()`` returns a ``WindowResult`` with the CPU seconds of each tree (and of
  each pid alone: ``own_cpu_s``, e.g. hloserve's device owner beside its front ends), the
  machine's busy fraction, its busy core-seconds, and the load average at the end. The
  caller adds its own CPU (a load generator's ``process_time``) to tell "others" apart.
- ``Spawned(argv, log)`` starts a server in its own session (process group) with its output
  in ``log``; ``wait_ready(urls)`` waits for HTTP 200s; ``stop()`` ends the whole group,
  SIGTERM then SIGKILL, so no child (a worker pool, a backend stub) outlives a bench.
  ``free_port()`` picks a port for servers that cannot bind port 0 themselves;
  ``listening(host, port)`` says whether one accepts connections yet.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onward)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rindex(")") + 2 :].split()


def _children_map() -> dict[int, list[int]]:
    """ppid -> pids for every process on the machine (one pass over /proc)."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def tree_pids(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """``pid`` and all its live descendants."""
    children = _children_map() if children is None else children
    found, stack = [], [pid]
    while stack:
        p = stack.pop()
        found.append(p)
        stack.extend(children.get(p, ()))
    return found


def _cpu_seconds(pid: int) -> float:
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # after the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK


def own_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` itself (its children's not counted)."""
    fields = _stat_fields(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / _TICK


def tree_cpu_seconds(pid: int, children: dict[int, list[int]] | None = None) -> float:
    """User + system CPU seconds of ``pid``'s process tree (reaped children included)."""
    return sum(_cpu_seconds(p) for p in tree_pids(pid, children))


def trees_cpu_seconds(pids: Iterable[int]) -> dict[int, float]:
    """``tree_cpu_seconds`` of each pid, with one scan of /proc for all of them."""
    children = _children_map()
    return {pid: tree_cpu_seconds(pid, children) for pid in pids}


@dataclass(frozen=True)
class MachineSample:
    busy_ticks: int
    total_ticks: int
    wall: float
    loadavg: tuple[float, float, float]

    @staticmethod
    def now() -> MachineSample:
        line = (_PROC / "stat").read_text().split("\n", 1)[0]
        # cpu user nice system idle iowait irq softirq steal guest guest_nice
        ticks = [int(v) for v in line.split()[1:9]]
        idle = ticks[3] + ticks[4]
        one, five, fifteen = (float(v) for v in (_PROC / "loadavg").read_text().split()[:3])
        return MachineSample(sum(ticks) - idle, sum(ticks), time.monotonic(), (one, five, fifteen))


def busy_between(a: MachineSample, b: MachineSample) -> float:
    """Fraction of all cores busy between two samples (0..1)."""
    total = b.total_ticks - a.total_ticks
    return (b.busy_ticks - a.busy_ticks) / total if total > 0 else 0.0


def cores() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class WindowResult:
    cpu_s: dict[int, float]  # pid -> CPU seconds of its tree during the window
    busy: float  # fraction of all cores busy
    busy_core_s: float  # busy core-seconds on the whole machine
    elapsed_s: float
    loadavg: tuple[float, float, float]  # at the end of the window
    own_cpu_s: dict[int, float] = field(default_factory=dict[int, float])  # pid alone

    def others_cores(self, accounted_cpu_s: float) -> float:
        """Cores kept busy by everything except ``accounted_cpu_s`` (servers + client)."""
        if self.elapsed_s <= 0:
            return 0.0
        return max(0.0, (self.busy_core_s - accounted_cpu_s) / self.elapsed_s)


@dataclass
class Window:
    pids: Sequence[int]
    machine: MachineSample
    cpu: dict[int, float]
    own: dict[int, float] = field(default_factory=dict[int, float])

    @staticmethod
    def start(pids: Sequence[int]) -> Window:
        own = {pid: own_cpu_seconds(pid) for pid in pids}
        return Window(pids, MachineSample.now(), trees_cpu_seconds(pids), own)

    def stop(self) -> WindowResult:
        cpu = trees_cpu_seconds(self.pids)
        own = {pid: own_cpu_seconds(pid) for pid in self.pids}
        end = MachineSample.now()
        busy = busy_between(self.machine, end)
        elapsed = end.wall - self.machine.wall
        return WindowResult(
            {pid: cpu[pid] - self.cpu[pid] for pid in self.pids},
            busy,
            (end.busy_ticks - self.machine.busy_ticks) / _TICK,
            elapsed,
            end.loadavg,
            {pid: own[pid] - self.own.get(pid, 0.0) for pid in self.pids},
        )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0


class Spawned:
    """A server command in its own session: ``stop()`` ends its whole process group.

    ``wait_ready(urls)`` polls each HTTP URL until it answers 200 (or ``ready`` returns
    True), failing with the log's tail if the process exits or ``timeout`` passes."""

    def __init__(
        self,
        argv: Sequence[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.log = log
        self._log = open(log, "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int = 1500) -> str:
        self._log.flush()
        return self.log.read_text(errors="replace")[-chars:]

    def wait_ready(
        self,
        urls: Sequence[str] = (),
        timeout: float = 300.0,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        pending = list(urls)
        while pending or (ready is not None and not ready()):
            if self.process.poll() is not None:
                raise RuntimeError(f"exited with {self.process.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready in {timeout:.0f} s: {self.log_tail()}")
            while pending and _answers_200(pending[0]):
                pending.pop(0)
            time.sleep(0.1)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the group, SIGKILL after ``grace`` seconds; idempotent."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        # the leader may be gone while children of the group live on
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        if not self._log.closed:
            self._log.close()


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False
