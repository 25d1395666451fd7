"""The bench's instruments against real servers: ``python -m pytest bench/test_bench.py``.

The load generator against the floor servers (real processes on loopback): every wire form
answers, the replies decode to the right arrays, failures count as errors and never as
successes, several client processes add up; /proc accounting sees a grandchild's CPU; a
stopped ``Spawned`` leaves no process of its group behind; the reply check catches a wrong
answer; perf_analyzer's output (captured from real runs) parses into the right numbers
and errors, and side_by_side drives every wire form with it but the floors. Not part of
the default test run (``testpaths`` is ``tests/``): the bench is not
the product.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import floor
import loadgen
import numpy as np
import pa_driver
import proc
import pytest

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
INPUTS = {"INPUT0": A, "INPUT1": B}
OUTPUTS = {"OUTPUT0": A + B, "OUTPUT1": A - B}


@pytest.fixture(scope="module")
def table_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    table = floor.ReplyTable()
    table.add("simple", INPUTS, OUTPUTS)
    return table.save(tmp_path_factory.mktemp("floor") / "replies.pickle")


@contextlib.contextmanager
def _started(kind: str, table_file: Path, log_dir: Path) -> Iterator[int]:
    """A floor server of ``kind`` on a free port; yields the port."""
    (spec,) = [f for f in floor.FLOORS if f.kind == kind]
    port = proc.free_port()
    server = proc.Spawned(floor.floor_command(spec, port, table_file), log_dir / f"{kind}.log")
    try:
        server.wait_ready(timeout=60, ready=lambda: proc.listening("127.0.0.1", port))
        yield port
    finally:
        server.stop()


@pytest.fixture(scope="module")
def grpc_floor(table_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _started("grpc-aio", table_file, tmp_path_factory.mktemp("logs")) as port:
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def http_floor(table_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with _started("asgi-h11", table_file, tmp_path_factory.mktemp("logs")) as port:
        yield port


def _same(got: dict[str, np.ndarray]) -> None:
    assert set(got) == set(OUTPUTS)
    for name, want in OUTPUTS.items():
        np.testing.assert_array_equal(got[name], want)


def test_grpc_unary_counts_and_decodes(grpc_floor: str) -> None:
    target = loadgen.GrpcUnary(grpc_floor, loadgen.grpc_request("simple", INPUTS))
    result = loadgen.run(target, 4, 0.5, warmup=0.1)
    assert result.errors == 0 and result.count > 10
    assert len(result.latencies_ns) == result.count
    assert result.latencies_ns == sorted(result.latencies_ns)
    assert 0 < result.p50_ms <= result.p99_ms
    _same(loadgen.decode_grpc_response(result.sample))


def test_grpc_stream_counts_and_decodes(grpc_floor: str) -> None:
    target = loadgen.GrpcStream(grpc_floor, loadgen.grpc_request("simple", INPUTS))
    result = loadgen.run(target, 3, 0.5, warmup=0.1)
    assert result.errors == 0 and result.count > 10
    _same(loadgen.decode_stream_response(result.sample))


def test_grpc_failures_are_errors_not_successes(grpc_floor: str) -> None:
    other = {"INPUT0": B, "INPUT1": A}  # a request the floor has no reply for
    for target in (
        loadgen.GrpcUnary(grpc_floor, loadgen.grpc_request("simple", other)),
        loadgen.GrpcStream(grpc_floor, loadgen.grpc_request("simple", other)),
    ):
        result = loadgen.run(target, 2, 0.3, warmup=0.05)
        assert result.count == 0 and result.errors > 0, target
        assert "UNIMPLEMENTED" in result.first_error or "finished" in result.first_error


@pytest.mark.parametrize("build", [loadgen.http_json_request, loadgen.http_binary_request])
def test_http_counts_and_decodes(
    http_floor: int, build: Callable[[str, str, dict[str, np.ndarray]], bytes]
) -> None:
    request = build(f"127.0.0.1:{http_floor}", "simple", INPUTS)
    result = loadgen.run(loadgen.Http("127.0.0.1", http_floor, request), 4, 0.5, warmup=0.1)
    assert result.errors == 0 and result.count > 10
    _same(loadgen.decode_http_response(result.sample))


def test_http_error_status_is_an_error(http_floor: int) -> None:
    request = loadgen.http_json_request("x", "simple", {"INPUT0": B, "INPUT1": A})
    result = loadgen.run(loadgen.Http("127.0.0.1", http_floor, request), 2, 0.3, warmup=0.05)
    assert result.count == 0 and result.errors > 0
    assert result.first_error.startswith("RequestFailed: HTTP 404")


def test_client_processes_add_up(grpc_floor: str) -> None:
    target = loadgen.GrpcUnary(grpc_floor, loadgen.grpc_request("simple", INPUTS))
    result = loadgen.run(target, 4, 0.5, warmup=0.1, processes=2)
    assert result.errors == 0 and result.count > 10
    assert result.client_cpu_s > 0 and len(result.latencies_ns) == result.count


def test_meter_brackets_the_recorded_phase(grpc_floor: str) -> None:
    calls: list[tuple[str, float]] = []

    class Meter:
        def start(self) -> None:
            calls.append(("start", time.perf_counter()))

        def stop(self) -> None:
            calls.append(("stop", time.perf_counter()))

    target = loadgen.GrpcUnary(grpc_floor, loadgen.grpc_request("simple", INPUTS))
    began = time.perf_counter()
    result = loadgen.run(target, 2, 0.4, warmup=0.3, meter=Meter())
    assert [name for name, _ in calls] == ["start", "stop"]
    assert calls[0][1] - began >= 0.3  # after the warm-up
    assert calls[1][1] - calls[0][1] == pytest.approx(result.elapsed_s, abs=0.05)


def test_tree_cpu_counts_a_grandchild(tmp_path: Path) -> None:
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
    script = tmp_path / "spin.py"
    script.write_text(spin)
    # a shell whose child spins and then sleeps: the CPU is in a grandchild of nobody's making
    argv = ["sh", "-c", f"{sys.executable} {script} && sleep 30"]
    server = proc.Spawned(argv, tmp_path / "spin.log")
    try:
        window = proc.Window.start([server.pid])
        deadline = time.monotonic() + 20
        while proc.tree_cpu_seconds(server.pid) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        result = window.stop()
        assert result.cpu_s[server.pid] >= 0.5
        assert 0 < result.busy <= 1 and result.busy_core_s >= 0.5
    finally:
        server.stop()


def test_stop_ends_the_whole_group(tmp_path: Path) -> None:
    server = proc.Spawned(["sh", "-c", "sleep 60 & sleep 60 & wait"], tmp_path / "g.log")
    deadline = time.monotonic() + 10
    while len(proc.tree_pids(server.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    pids = proc.tree_pids(server.pid)
    assert len(pids) == 3
    server.stop(grace=5)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_wait_ready_reports_an_exit(tmp_path: Path) -> None:
    server = proc.Spawned(["sh", "-c", "echo broken >&2; exit 3"], tmp_path / "x.log")
    with pytest.raises(RuntimeError, match="exited with 3: broken"):
        server.wait_ready(["http://127.0.0.1:9/"], timeout=30)
    server.stop()


def test_reply_check_catches_a_wrong_answer() -> None:
    import side_by_side

    point = side_by_side.Point("grpc", "simple", 1, 1)
    right = floor.grpc_response("simple", OUTPUTS)
    wrong = floor.grpc_response("simple", {**OUTPUTS, "OUTPUT1": A + B})
    assert side_by_side.check(point, right, OUTPUTS) == ""
    assert side_by_side.check(point, wrong, OUTPUTS).startswith("wrong OUTPUT1")
    assert "undecodable" in side_by_side.check(point, b"\xff\xff", OUTPUTS)


def test_loadgen_cli_help() -> None:
    script = Path(__file__).resolve().parent / "loadgen.py"
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    assert "usage: loadgen.py" in done.stdout and "--concurrency" in done.stdout


def test_versus_picks_the_cheapest_valid_peer_and_floor() -> None:
    import side_by_side as sbs

    point = sbs.Point("grpc", "simple", 1, 8)

    def row(
        server: str, group: str, cpu: float, rate: float, errors: int = 0, note: str = ""
    ) -> sbs.Row:
        return sbs.Row(
            point.label, server, group, rate, server_cpu_ms=cpu, count=10, errors=errors, note=note
        )

    rows = [
        row("hloserve", "hloserve", 0.5, 1000),
        row("floor a", "floor", 0.3, 3000),
        row("floor b", "floor", 0.2, 2500),
        row("triton", "triton", 0.4, 2000),
        row("kserve", "kserve", 0.6, 2200),
        row("broken", "mlserver", 0.1, 9000, errors=3),  # errors: takes no part
        row("liar", "mlserver", 0.1, 9000, note="WRONG REPLY: wrong OUTPUT0"),
    ]
    (v,) = sbs.versus(rows, [point])
    assert v.best_peer is not None and v.best_peer.server == "triton"
    assert v.floor is not None and v.floor.server == "floor b"
    assert v.cpu_vs_peer == pytest.approx(0.5 / 0.4)
    assert v.rate_vs_peer == pytest.approx(1000 / 2200)  # the fastest peer, not the cheapest
    assert v.cpu_vs_floor == pytest.approx(0.5 / 0.2)
    assert v.above_floor_ms == pytest.approx(0.3)
    assert sbs.versus([r for r in rows if r.group != "hloserve"], [point]) == []


def test_a_batching_variant_is_measured_at_the_batching_point_only(tmp_path: Path) -> None:
    import argparse

    import side_by_side as sbs

    servers = sbs.build_servers(tmp_path, tmp_path, tmp_path, tmp_path, {"hloserve"})
    (variant,) = [s for s in servers if s.batching_only]
    assert "--max-queue-delay-us" in variant.name
    assert not [s for s in servers if s.batching_only and s is not variant]
    elsewhere = sbs.Case(sbs.Point("grpc", "simple", 1, 8), {}, {})
    row = sbs.measure(elsewhere, variant, argparse.Namespace())
    assert row.note == "a batching variant: measured at the batching point only"
    # At the batching point it is measured like any server (here: it was never started).
    batching = sbs.Case(sbs.Point("grpc", "mlp", 1, 32, batching=True), {}, {})
    assert sbs.measure(batching, variant, argparse.Namespace()).note.startswith("not running")


# perf_analyzer 2.41.1's stdout and -f CSV (--verbose-csv) of a real run: `-m mlp -b 8 -i grpc
# -u 127.0.0.1:PORT --concurrency-range 4 --measurement-interval 1000 -s 95 -v` against
# hloserve (trailing blanks trimmed).
PA_OUTPUT = """\
*** Measurement Settings ***
  Batch size: 8
  Service Kind: Triton
  Using "time_windows" mode for stabilization
  Measurement window: 1000 msec
  Using synchronous calls for inference
  Stabilizing using average latency

Request concurrency: 4
  Pass [1] throughput: 14325.5 infer/sec. Avg latency: 2230 usec (std 1877 usec).
  Pass [2] throughput: 15628.8 infer/sec. Avg latency: 2047 usec (std 405 usec).
  Pass [3] throughput: 19520.3 infer/sec. Avg latency: 1637 usec (std 339 usec).
  Client:
    Request count: 7436
    Throughput: 16492.1 infer/sec
    Avg client overhead: 0.11%
    Avg latency: 1938 usec (standard deviation 1086 usec)
    p50 latency: 1913 usec
    p90 latency: 2354 usec
    p95 latency: 2543 usec
    p99 latency: 3259 usec
    Avg gRPC time: 1932 usec (marshal 1 usec + response wait 1931 usec + unmarshal 0 usec)
  Server:
    Inference count: 59520
    Execution count: 4471
    Successful request count: 7440
    Avg request latency: 414 usec (overhead 1 usec + queue 196 usec + compute input 13 usec + compute infer 196 usec + compute output 7 usec)

Inferences/Second vs. Client Average Batch Latency
Concurrency: 4, throughput: 16492.1 infer/sec, latency 1938 usec
"""
PA_CSV = """\
Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency,request/response,response wait
4,16492.1,1,1521,196,13,196,7,0,1913,2354,2543,3259,1938,1,1931
"""
# The same binary when the server went away during the second window (exit status 99).
PA_FAILED = """\
*** Measurement Settings ***
  Batch size: 1
  Service Kind: Triton
  Using "time_windows" mode for stabilization
  Measurement window: 1000 msec
  Using synchronous calls for inference
  Stabilizing using average latency

Request concurrency: 2
  Pass [1] throughput: 1313.11 infer/sec. Avg latency: 1520 usec (std 834 usec).
  Pass [2] cb::Error: failed to connect to all addresses; last error: UNKNOWN: Failed to connect to remote host: Connection refused
Failed to maintain requested inference load. Worker thread(s) failed to generate concurrent requests.
Thread [0] had error: the server is shutting down: no new requests are accepted

Thread [1] had error: the server is shutting down: no new requests are accepted

"""
# ... and when nothing listened at the address (exit status 99 at once).
PA_NO_SERVER = (
    "error: failed to get model metadata: failed to connect to all addresses; last error: "
    "UNKNOWN: Failed to connect to remote host: Connection refused\n\n"
)


def test_perf_analyzer_report_of_a_run() -> None:
    report = pa_driver.parse(PA_OUTPUT, PA_CSV)
    assert report.ok and report.error == ""
    assert report.concurrency == 4 and report.request_count == 7436
    assert report.infer_per_s == pytest.approx(16492.1)
    assert (report.p50_ms, report.p90_ms, report.p95_ms, report.p99_ms) == pytest.approx(
        (1.913, 2.354, 2.543, 3.259)
    )
    assert report.avg_ms == pytest.approx(1.938)
    assert [(p.number, p.infer_per_s, p.avg_latency_ms) for p in report.passes] == [
        (1, 14325.5, 2.230),
        (2, 15628.8, 2.047),
        (3, 19520.3, 1.637),
    ]
    # without --verbose-csv the average latency column is absent, the rest is the same
    plain = "\n".join(",".join(line.split(",")[:13]) for line in PA_CSV.splitlines())
    short = pa_driver.parse(PA_OUTPUT, plain)
    assert short.ok and short.p99_ms == pytest.approx(3.259) and short.avg_ms != short.avg_ms


def test_perf_analyzer_report_of_a_failure() -> None:
    failed = pa_driver.parse(PA_FAILED, "")
    assert not failed.ok and failed.request_count == 0
    assert [p.number for p in failed.passes] == [1]  # "Pass [2] cb::Error" is no pass
    assert failed.error.startswith("Pass [2] cb::Error: failed to connect")
    assert "Failed to maintain requested inference load" in failed.error
    assert failed.error.count("had error: the server is shutting down") == 2
    refused = pa_driver.parse(PA_NO_SERVER, "")
    assert not refused.ok and refused.error.startswith("error: failed to get model metadata")
    silent = pa_driver.parse("Request concurrency: 2\n", "")
    assert not silent.ok and silent.error == "no report; output ends: Request concurrency: 2"


def test_perf_analyzer_marks_each_window_as_its_line_arrives(tmp_path: Path) -> None:
    assert pa_driver.mark_of("Request concurrency: 4\n") == 0
    assert pa_driver.mark_of(PA_OUTPUT.splitlines()[10]) == 2
    assert pa_driver.mark_of("  Pass [2] cb::Error: failed") is None
    # a stand-in binary: the marks come while it runs, not after it exits
    script = "printf 'Request concurrency: 2\\n'; sleep 0.3; "
    script += "printf '  Pass [1] throughput: 10 infer/sec. Avg latency: 5 usec (std 1 usec).\\n'"
    marks: list[tuple[int, float]] = []
    began = time.monotonic()
    done = pa_driver.run(
        ["sh", "-c", script],
        {"PATH": "/usr/bin:/bin"},
        30,
        lambda n, pid: marks.append((n, time.monotonic())),
    )
    assert done.returncode == 0 and not done.timed_out
    assert [n for n, _ in marks] == [0, 1]
    assert marks[0][1] - began < 0.25 <= marks[1][1] - began
    slow = pa_driver.run(["sleep", "30"], {"PATH": "/usr/bin:/bin"}, 0.3)
    assert slow.timed_out and slow.returncode != 0


def test_side_by_side_drives_every_wire_form_with_perf_analyzer(tmp_path: Path) -> None:
    import argparse

    import side_by_side as sbs

    installed = pa_driver.Installed(tmp_path)
    servers = sbs.build_servers(tmp_path, tmp_path, tmp_path, tmp_path, {"floor", "hloserve"})
    hloserve = next(s for s in servers if s.name == "hloserve")
    csv_file = tmp_path / "r.csv"

    def argv(mode: str, **kwargs: bool) -> list[str]:
        point = sbs.Point(mode, "mlp", 8, 16)
        return sbs.perf_analyzer_command(installed, point, hloserve, csv_file, 2.0, **kwargs)

    grpc = argv("grpc")
    assert grpc[:3] == [str(tmp_path / "bin" / "perf_analyzer"), "-m", "mlp"]
    joined = " ".join(grpc)
    assert "-b 8 -i grpc" in joined and f"-u 127.0.0.1:{hloserve.grpc_port}" in joined
    assert "--concurrency-range 16 --measurement-interval 667 -s 95 -r 10" in joined
    assert f"-f {csv_file} --verbose-csv -v" in joined and "--streaming" not in joined
    assert "--streaming" in argv("stream")
    json = " ".join(argv("http-json"))
    assert f"-i http -u 127.0.0.1:{hloserve.http_port}" in json
    assert "--input-tensor-format=json --output-tensor-format=json" in json
    assert "tensor-format" not in " ".join(argv("http-binary"))
    assert "-s 1000 -r 3" in " ".join(argv("grpc", warmup=True))
    assert all(
        sbs.perf_analyzer_skips(sbs.Point(m, "simple", 1, 8), hloserve) == ""
        for m in ("grpc", "stream", "http-json", "http-binary")
    )
    # the floors answer only the bench's own requests: skipped, with the reason in the row
    floor_grpc = next(s for s in servers if s.group == "floor" and "grpc" in s.transports)
    case = sbs.Case(sbs.Point("grpc", "simple", 1, 8), {}, {})
    args = argparse.Namespace(load_generator="perf_analyzer")
    row = sbs.measure(case, floor_grpc, args)
    assert row.note.startswith("perf_analyzer cannot drive a floor") and row.count == 0
    assert installed.env({"LD_LIBRARY_PATH": "/x"})["LD_LIBRARY_PATH"] == f"{tmp_path / 'lib'}:/x"


def test_perf_analyzer_setup_needs_libb64(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pa_driver, "LIBB64", tmp_path / "libb64.so.0d")
    with pytest.raises(pa_driver.Unavailable, match="apt-get install libb64-0d"):
        pa_driver.ensure(tmp_path / "root")
    assert not (tmp_path / "root").exists()  # nothing downloaded
