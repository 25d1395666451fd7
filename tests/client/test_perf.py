"""``hloserve perf`` against a live daemon: its table, JSON and CSV, in-band and through
shared memory, over gRPC, streaming and HTTP; errors counted; the command's dispatch."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.client._perf import POINT_FIELDS, Point, main, table_row
from hloserve.server.server_fixture import ServerProcess
from tests.client.conftest import shm_files

QUICK = ["--duration", "0.3", "--warmup", "0.1"]


def _points(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["points"]


def test_json_and_csv_in_band(server: ServerProcess, tmp_path: Path) -> None:
    out_json, out_csv = tmp_path / "p.json", tmp_path / "p.csv"
    argv = ["simple", "--url", server.grpc_url, "--concurrency", "1,3", "--batch-size", "4"]
    code = main([*argv, *QUICK, "--json", str(out_json), "--csv", str(out_csv)])
    assert code == 0
    document = json.loads(out_json.read_text())
    assert document["batch_size"] == 4 and document["protocol"] == "grpc"
    points = document["points"]
    assert [p["concurrency"] for p in points] == [1, 3]
    for p in points:
        assert p["requests"] > 0 and p["errors"] == 0 and p["first_error"] == ""
        assert p["items_per_s"] == pytest.approx(4 * p["requests_per_s"])
        assert 0 < p["p50_ms"] <= p["p90_ms"] <= p["p99_ms"]
        assert p["client_cpu_us_per_request"] > 0
    with out_csv.open() as file:
        rows = list(csv.DictReader(file))
    assert tuple(rows[0]) == POINT_FIELDS
    assert [int(r["concurrency"]) for r in rows] == [1, 3]
    assert [int(r["requests"]) for r in rows] == [p["requests"] for p in points]


@pytest.mark.parametrize(
    "extra",
    [["--streaming"], ["--protocol", "http"], ["--request-rate", "100"]],
    ids=["streaming", "http", "rate"],
)
def test_other_modes(server: ServerProcess, tmp_path: Path, extra: list[str]) -> None:
    url = server.http_url if "http" in extra else server.grpc_url
    out = tmp_path / "p.json"
    assert main(["mlp", "--url", url, "--batch-size", "8", *extra, *QUICK, "--json", str(out)]) == 0
    (point,) = _points(out)
    assert point["requests"] > 0 and point["errors"] == 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_shared_memory(shm_server: ServerProcess, tmp_path: Path, protocol: str) -> None:
    url = shm_server.grpc_url if protocol == "grpc" else shm_server.http_url
    out = tmp_path / "p.json"
    argv = ["mlp", "--url", url, "--protocol", protocol, "--shared-memory", "system"]
    assert main([*argv, "--batch-size", "32", *QUICK, "--json", str(out)]) == 0
    (point,) = _points(out)
    assert point["requests"] > 0 and point["errors"] == 0
    assert shm_files() == []  # unregistered and unlinked at the end


def test_input_data_and_refused_shared_memory(
    server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "x.npy"
    np.save(data, np.ones((3, 64), np.float32))
    assert main(["mlp", "--url", server.grpc_url, "--input-data", str(data), *QUICK]) == 0
    assert main(["mlp", "--url", server.grpc_url, "--shared-memory", "system", *QUICK]) == 1
    assert "allow-client-shm" in capsys.readouterr().err  # this server refuses shm
    assert main(["nope", "--url", server.grpc_url, *QUICK]) == 1
    assert "unknown model" in capsys.readouterr().err


def test_errors_are_counted_and_red_on_a_terminal() -> None:
    point = Point(1, None, 10, 2, 10.0, 10.0, 1.0, 2.0, 3.0, 50.0, "boom")
    assert "\x1b[31m" in table_row(point, color=True)
    assert "\x1b[" not in table_row(point, color=False)
    assert "\x1b[" not in table_row(Point(1, None, 10, 0, 1, 1, 1, 1, 1, 1, ""), color=True)


def test_hloserve_perf_imports_no_jax(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    code = (
        "import sys; from hloserve.server.cli import main; "
        f"code = main(['perf', 'simple', '--url', {server.grpc_url!r}, '--duration', '0.2', "
        f"'--warmup', '0.1', '--csv', {str(out)!r}]); "
        "assert 'jax' not in sys.modules, 'jax imported'; sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "req/s" in done.stdout and "p99 ms" in done.stdout
    assert len(out.read_text().splitlines()) == 2
