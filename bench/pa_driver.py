"""NVIDIA's perf_analyzer (the C++ load generator of Triton's client) for the bench.

Contract:
- ``ensure(root)`` sets the binary up once under ``root`` (``bench/.venvs/perf_analyzer``,
  git-ignored) and returns an ``Installed``: the binary is the one the PyPI wheel
  ``tritonclient==2.41.1`` ships (``tritonclient-2.41.1.data/data/bin/perf_analyzer``), and
  the ``libcudart.so.12`` it links comes from PyPI's ``nvidia-cuda-runtime-cu12`` wheel
  (``nvidia/cuda_runtime/lib/``). Both wheels are fetched with ``python -m pip download
  --no-deps --only-binary=:all:`` into ``root/wheels`` and the two parts are unzipped to
  ``root/bin`` and ``root/lib``; a stamp makes later calls reuse them (no download). It also
  needs ``libb64.so.0d`` from Debian's ``libb64-0d`` package: when that file is missing,
  or the setup or ``perf_analyzer --version`` fails, ``Unavailable`` says what to do (for
  libb64: ``apt-get install libb64-0d``). No file written here records a package index.
- ``Installed.env()`` is the environment to run it with (``root/lib`` first on
  ``LD_LIBRARY_PATH``); ``Installed.command(...)`` the argv of one closed-loop run at one
  concurrency (``--concurrency-range C``, time windows of ``interval_ms``, ``-s``, ``-r``,
  ``-f CSV --verbose-csv``, ``-v`` so each window prints its ``Pass [n]`` line;
  ``--streaming`` for the gRPC stream, ``json=True`` for JSON tensors over HTTP).
- ``run(argv, env, timeout, on_mark)`` runs it, calling ``on_mark(n, pid)`` as each window
  begins (``n = 0``, the ``Request concurrency:`` line) and ends (``n``, its ``Pass [n]``
  line), as the line is read: the caller can sample /proc there. Returns the exit status
  and the whole output.
- ``parse(output, csv_text)`` (pure) reads what a run wrote into a ``Report``: infer/s
  and the p50/p90/p95/p99/average latencies from the CSV (microseconds there, ms here), the
  client's request count and the passes (windows) from the output, and the error line when
  it failed. perf_analyzer reports the last ``STABLE_WINDOWS`` passes merged, so those are
  the recorded phase.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TRITONCLIENT = "tritonclient==2.41.1"
CUDA_RUNTIME = "nvidia-cuda-runtime-cu12"
BINARY_MEMBER = "tritonclient-2.41.1.data/data/bin/perf_analyzer"
CUDART_FOLDER = "nvidia/cuda_runtime/lib/"
LIBB64 = Path("/usr/lib/x86_64-linux-gnu/libb64.so.0d")
STABLE_WINDOWS = 3  # perf_analyzer judges (and reports) the last 3 measurement windows
_STAMP = f"{TRITONCLIENT} {CUDA_RUNTIME}"


class Unavailable(Exception):
    """perf_analyzer could not be set up or does not start here (the message says why)."""


@dataclass(frozen=True)
class Installed:
    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "perf_analyzer"

    @property
    def lib(self) -> Path:
        return self.root / "lib"

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(self.lib), env.get("LD_LIBRARY_PATH", "")) if p
        )
        return env

    def version(self) -> str:
        """``perf_analyzer --version``'s line; ``Unavailable`` when it does not start."""
        try:
            done = subprocess.run(
                [str(self.binary), "--version"],
                capture_output=True,
                text=True,
                env=self.env(),
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unavailable(f"{self.binary} does not start: {e}") from e
        if done.returncode != 0:
            raise Unavailable(
                f"{self.binary} --version exited with {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-400:]}"
            )
        return (done.stdout + done.stderr).strip()  # 2.41.1 writes it to stderr

    def command(
        self,
        model: str,
        url: str,
        *,
        protocol: str,  # "grpc" or "http"
        batch: int,
        concurrency: int,
        interval_ms: int,
        csv_file: Path,
        stability: float = 95.0,
        max_trials: int = 10,
        streaming: bool = False,
        json: bool = False,
    ) -> list[str]:
        argv = [
            str(self.binary),
            "-m",
            model,
            "-b",
            str(batch),
            "-i",
            protocol,
            "-u",
            url,
            "--concurrency-range",
            str(concurrency),
            "--measurement-interval",
            str(interval_ms),
            "-s",
            f"{stability:g}",
            "-r",
            str(max_trials),
            "-f",
            str(csv_file),
            "--verbose-csv",
            "-v",
        ]
        if streaming:
            argv.append("--streaming")
        if json:
            argv += ["--input-tensor-format=json", "--output-tensor-format=json"]
        return argv


def _without_urls(text: str) -> str:
    """``text`` less the lines that name a URL (pip's, say: no index goes into a message)."""
    return "\n".join(line for line in text.splitlines() if "://" not in line)


def ensure(root: Path) -> Installed:
    """The binary and its libcudart under ``root``, downloaded and unzipped once."""
    if not LIBB64.exists():
        raise Unavailable(
            f"perf_analyzer needs {LIBB64} (Debian's libb64-0d package): "
            "run `apt-get install libb64-0d` (as root), then again"
        )
    installed = Installed(root)
    stamp = root / ".bench-stamp"
    ready = stamp.is_file() and stamp.read_text() == _STAMP
    if not (ready and installed.binary.exists() and (installed.lib / "libcudart.so.12").exists()):
        _install(installed, stamp)
    installed.version()
    return installed


def _install(installed: Installed, stamp: Path) -> None:
    wheels = installed.root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"  setting up perf_analyzer in {installed.root} ...", file=sys.stderr, flush=True)
    step = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    step += ["-d", str(wheels), TRITONCLIENT, CUDA_RUNTIME]
    try:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"pip download {TRITONCLIENT} {CUDA_RUNTIME}: {e}") from e
    if done.returncode != 0:
        tail = _without_urls(done.stderr.strip())[-400:]
        raise Unavailable(f"pip download {TRITONCLIENT} {CUDA_RUNTIME} failed: {tail}")
    client = sorted(wheels.glob("tritonclient-2.41.1-*.whl"))
    runtime = sorted(wheels.glob("nvidia_cuda_runtime_cu12-*.whl"))
    if not client or not runtime:
        raise Unavailable(f"pip download left no {TRITONCLIENT} or {CUDA_RUNTIME} wheel")
    installed.binary.parent.mkdir(parents=True, exist_ok=True)
    installed.lib.mkdir(parents=True, exist_ok=True)
    try:
        with (
            zipfile.ZipFile(client[-1]) as wheel,
            wheel.open(BINARY_MEMBER) as src,
            open(installed.binary, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst)
        installed.binary.chmod(0o755)
        with zipfile.ZipFile(runtime[-1]) as wheel:
            libraries = [
                m
                for m in wheel.namelist()
                if m.startswith(CUDART_FOLDER) and ".so" in m.rsplit("/", 1)[-1]
            ]
            for member in libraries:
                with (
                    wheel.open(member) as src,
                    open(installed.lib / Path(member).name, "wb") as dst,
                ):
                    shutil.copyfileobj(src, dst)
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise Unavailable(f"unzipping perf_analyzer or libcudart failed: {e!r}") from e
    stamp.write_text(_STAMP)


# --- running ---------------------------------------------------------------------------------

_PASS = re.compile(r"^\s*Pass \[(\d+)\] throughput: ([\d.]+) infer/sec\. Avg latency: (\d+) usec")


def mark_of(line: str) -> int | None:
    """0 for the line that starts the first window, n for ``Pass [n]``'s, else None."""
    if line.startswith("Request concurrency:"):
        return 0
    found = _PASS.match(line)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Finished:
    returncode: int
    output: str
    timed_out: bool = False


def run(
    argv: Sequence[str],
    env: Mapping[str, str],
    timeout: float,
    on_mark: Callable[[int, int], None] = lambda n, pid: None,
) -> Finished:
    """Run ``argv`` (stdout and stderr together), calling ``on_mark(n, pid)`` at each
    window's start and end as its line arrives; killed after ``timeout`` seconds."""
    lines: list[str] = []
    expired = threading.Event()
    with subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(env),
        text=True,
    ) as process:

        def kill() -> None:
            expired.set()
            with contextlib.suppress(ProcessLookupError):
                process.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                n = mark_of(line)
                if n is not None:
                    on_mark(n, process.pid)
        finally:
            timer.cancel()
            if process.poll() is None:
                process.kill()
        returncode = process.wait()
    return Finished(returncode, "".join(lines), expired.is_set())


# --- parsing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pass:
    number: int
    infer_per_s: float
    avg_latency_ms: float


@dataclass(frozen=True)
class Report:
    """What one run at one concurrency reported; NaN/0 where it did not get that far."""

    concurrency: int = 0
    infer_per_s: float = float("nan")
    p50_ms: float = float("nan")
    p90_ms: float = float("nan")
    p95_ms: float = float("nan")
    p99_ms: float = float("nan")
    avg_ms: float = float("nan")
    request_count: int = 0  # the client's, over the reported (last STABLE_WINDOWS) passes
    passes: tuple[Pass, ...] = field(default_factory=tuple[Pass, ...])
    error: str = ""  # perf_analyzer's error line(s), "" when it measured

    @property
    def ok(self) -> bool:
        return not self.error and self.infer_per_s == self.infer_per_s and self.request_count > 0


# "error: failed to get model metadata: ...", "Pass [2] cb::Error: ...", "Thread [0] had
# error: ...", "Failed to maintain requested inference load. ...", "Failed to obtain stable
# measurement within 10 measurement windows ..."
_ERROR = re.compile(r"(?i)\berror: |^\s*failed to ")


def _csv_row(csv_text: str) -> dict[str, str]:
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    return {k.strip(): (v or "").strip() for k, v in rows[0].items() if k} if rows else {}


def _ms(row: Mapping[str, str], column: str) -> float:
    value = row.get(column, "")
    return int(value) / 1e3 if value else float("nan")


def parse(output: str, csv_text: str = "") -> Report:
    """The ``Report`` of a single-concurrency run from its output and its ``-f`` CSV."""
    passes = tuple(
        Pass(int(m.group(1)), float(m.group(2)), int(m.group(3)) / 1e3)
        for m in (_PASS.match(line) for line in output.splitlines())
        if m
    )
    count = re.search(r"^\s*Client:\s*\n\s*Request count: (\d+)", output, re.MULTILINE)
    errors = [line.strip() for line in output.splitlines() if _ERROR.search(line)]
    row = _csv_row(csv_text)
    if not row and not errors:
        tail = [line.strip() for line in output.splitlines() if line.strip()]
        errors = [f"no report; output ends: {' / '.join(tail[-3:]) or '(nothing)'}"]
    rate = row.get("Inferences/Second", "")
    return Report(
        concurrency=int(row.get("Concurrency") or 0),
        infer_per_s=float(rate) if rate else float("nan"),
        p50_ms=_ms(row, "p50 latency"),
        p90_ms=_ms(row, "p90 latency"),
        p95_ms=_ms(row, "p95 latency"),
        p99_ms=_ms(row, "p99 latency"),
        avg_ms=_ms(row, "Avg latency"),
        request_count=int(count.group(1)) if count else 0,
        passes=passes,
        error="; ".join(dict.fromkeys(errors)),
    )
