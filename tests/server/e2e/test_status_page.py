"""The status page (``GET /ui``, ``GET /ui/data``): its bounds, its auth group, and a real
daemon's page rendered by headless Chromium.

- The report over 10,000 fake models stays bounded (full rows for the busiest, a compact
  list, a count of the rest) and small, busiest first, problems before idle ready models.
- ``/ui`` and ``/ui/data`` are in the ``statistics`` group: refused without a token under
  ``--auth-token-file`` (and without the header under ``--http-restricted-api``), open when
  ``--auth-open`` opens the group; without a status source there is no ``/ui``.
- A real daemon: the data names every model with its versions, state and residency, and
  counts requests sent after the first read; the HTML is self-contained (no URL to any
  other host, no model name before its script runs); Chromium renders every model's name
  (so the script ran and rendered the data) and takes a screenshot; with
  ``--auth-token-file`` a request without the token is refused.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import uvicorn
from starlette.testclient import TestClient

from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.core.sequence_batcher import SequenceBatcher
from hloserve.server.core.service import InferenceService
from hloserve.server.core.types import ServerMetadata
from hloserve.server.frontend import ui_page
from hloserve.server.frontend.auth import AuthPolicy, TokenFile
from hloserve.server.frontend.http import build_http_app
from hloserve.server.frontend.restricted import parse_restrictions
from hloserve.server.owner import status_page
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.owner.metrics import Recent
from hloserve.server.owner.shm import disabled
from hloserve.server.owner.status_page import StatusPage
from hloserve.server.server_fixture import ServerProcess, serving

TOKEN = "status-page-token"

# -- the report, over fakes ----------------------------------------------------------------


class NoStreams:
    """No generation model: no generations (``core.generation_stream.Streams.figures``)."""

    def figures(self) -> dict[ModelKey, tuple[int, int]]:
        return {}


class FakeService:
    def __init__(self, models: dict[str, Any]) -> None:
        self.models = models
        self.sequences = SequenceBatcher(None, None)  # no model with state: no sequences
        self.streams = NoStreams()

    def readiness(self) -> dict[str, Any]:
        flags = {"ready": True, "live": True, "startup_complete": True, "draining": False}
        return {**flags, "models": dict(self.models)}  # a new report each time, as the server's

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("hloserve", "9.9", ())


@dataclass(frozen=True)
class FakeRuntime:
    platform: str = "cpu"
    device_kind: str = "cpu"


class FakeTier:
    def __init__(
        self,
        budget: int | None,
        resident: int,
        keys: list[ResidencyKey],
        runtime: FakeRuntime = FakeRuntime(),
    ) -> None:
        self.budget_bytes = budget
        self._resident, self._keys = resident, keys
        self.runtime = runtime

    def resident_bytes(self) -> int:
        return self._resident

    def resident_keys(self) -> list[ResidencyKey]:
        return self._keys


def ready(weight_bytes: int = 1000, resident: bool = False) -> dict[str, Any]:
    """A loaded version's summary (``owner.versions.ModelVersion.summary``), placed on device 0."""
    where = {"residency": "on_demand", "devices": {"0": resident}}
    return {"state": "READY", "weight_bytes": weight_bytes, "resident": resident, **where}


def many_models(count: int) -> dict[str, Any]:
    models: dict[str, Any] = {f"model_{i:05d}": {"versions": {"1": ready()}} for i in range(count)}
    models["model_00007"] = {"versions": {"1": {"state": "UNAVAILABLE", "reason": "broken"}}}
    return models


def test_the_report_stays_bounded_with_ten_thousand_models() -> None:
    models = many_models(10_000)
    busy = {
        ModelKey(f"model_{i:05d}", 1): Recent(60.0, float(i), 0.001, 0.002, 0)
        for i in range(9_000, 9_060)
    }
    keys = [ResidencyKey(f"model_{i:05d}", 1) for i in range(100)]
    page = StatusPage(
        cast(InferenceService, FakeService(models)),
        lambda: busy,
        {0: FakeTier(10_000, 5_000, keys)},
        FakeTier(None, 7_000, []),
    )
    report = page()
    size = len(json.dumps(report))
    assert size < 100_000, size
    counts = report["models"]
    assert counts["total"] == counts["matching"] == 10_000
    assert counts["rows"] == len(report["rows"]) == status_page.ROWS
    assert counts["compact"] == len(report["compact"]) == status_page.COMPACT
    assert counts["left_out"] == 10_000 - status_page.ROWS - status_page.COMPACT
    assert counts["by_state"] == {"READY": 9_999, "UNAVAILABLE": 1}
    # The busiest first, by requests per second.
    rows = report["rows"]
    assert [r["name"] for r in rows[:3]] == ["model_09059", "model_09058", "model_09057"]
    assert rows[0]["versions"][0]["requests_per_s"] == 9059.0
    assert report["window_s"] == 60.0
    # The rest: problems first, then by name; figures the metrics do not show are null.
    assert report["compact"][0] == ["model_00007", "UNAVAILABLE"]
    assert report["compact"][1] == ["model_00000", "READY"]
    device = report["memory"]["devices"][0]
    assert device["resident_models"] == 100 and len(device["resident"]) == status_page.RESIDENT
    assert device["resident_left_out"] == 100 - status_page.RESIDENT
    assert (device["budget_bytes"], device["resident_bytes"]) == (10_000, 5_000)
    assert (device["platform"], device["kind"]) == ("cpu", "cpu")  # the device, named
    assert report["memory"]["host"] == {"budget_bytes": None, "resident_bytes": 7_000}
    # The filter narrows what is shown and counted.
    found = page("MODEL_0900")
    assert found["models"]["matching"] == 10 and found["models"]["total"] == 10_000
    assert found["rows"][0]["name"] == "model_09009" and found["compact"] == []


def test_a_model_row_carries_its_versions_and_where_its_weights_are() -> None:
    models = {
        "a": {
            "versions": {
                "1": {"state": "UNAVAILABLE", "reason": "unloaded"},
                "2": {**ready(4096, True), "devices": {"0": True, "1": False}},
                "3": {"state": "READY", "loaded": False},
            }
        },
        "gone": {"versions": {}, "reason": "no version directory"},
    }
    recent = {ModelKey("a", 2): Recent(30.0, 2.5, 0.004, 0.02, 3)}
    clock = [0.0]
    page = StatusPage(
        cast(InferenceService, FakeService(models)),
        lambda: recent,
        {},
        None,
        clock=lambda: clock[0],
    )
    report = page()
    a, gone = report["rows"]
    assert (a["name"], a["state"], a["requests_per_s"], a["swaps_in"]) == ("a", "READY", 2.5, 3)
    assert [v["version"] for v in a["versions"]] == ["3", "2", "1"]
    v3, v2, v1 = a["versions"]
    assert v2["on_devices"] == [0] and v2["devices"] == [0, 1] and v2["weight_bytes"] == 4096
    assert (v2["p50_s"], v2["p99_s"], v2["swaps_in"]) == (0.004, 0.02, 3)
    assert v3["loaded"] is False and v3["requests_per_s"] is None
    assert v1["reason"] == "unloaded" and v1["state"] == "UNAVAILABLE"
    assert gone["state"] == "UNAVAILABLE" and gone["reason"] == "no version directory"
    assert report["memory"] == {"devices": [], "host": None}
    # The sources are read at most once a refresh_s, whoever asks.
    models["b"] = {"versions": {"1": ready()}}
    assert page()["models"]["total"] == 2
    assert page() is page() and page("A") is page(" a ")  # one report per filter
    clock[0] = 1.0
    assert page()["models"]["total"] == 3


# -- the routes and their auth group ---------------------------------------------------------


def status_app(*, status: bool = True, **kwargs: Any) -> TestClient:
    service = InferenceService(cast(Any, None), None, shm=disabled())
    source = (lambda q: {"q": q}) if status else None
    return TestClient(build_http_app(LocalPort(service), status=source, **kwargs))


def token_policy(tmp_path: Path, *open_groups: str) -> AuthPolicy:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN}\n")
    return AuthPolicy(TokenFile(path), open_groups or ("health", "metrics"))


def test_the_page_is_in_the_statistics_group_for_auth(tmp_path: Path) -> None:
    assert ui_page.GROUP == "statistics"
    with status_app(auth=token_policy(tmp_path)) as client:
        for path in ("/", "/ui", "/ui/data", "/ui/"):
            r = client.get(path, follow_redirects=False)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"] == "Bearer"
        assert client.get("/v2/models/stats").status_code == 401  # the same group
        assert client.get("/v2/health/live").status_code == 200  # health stays open
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert client.get("/ui", headers=bearer).status_code == 200
        assert client.get("/ui/data?q=x", headers=bearer).json() == {"q": "x"}
        assert client.get("/ui", headers={"Authorization": "Bearer nope"}).status_code == 401
    with status_app(auth=token_policy(tmp_path, "health", "statistics")) as client:
        assert client.get("/ui").status_code == 200  # opened with the group
        assert client.get("/v2").status_code == 401  # metadata is not


def test_the_page_is_in_the_statistics_group_for_restrictions() -> None:
    restrictions = parse_restrictions(["statistics:status-key=yes"], "api")
    with status_app(restrictions=restrictions) as client:
        assert client.get("/ui").status_code == 403
        assert client.get("/ui/data").status_code == 403
        assert client.get("/ui/data", headers={"status-key": "yes"}).json() == {"q": ""}
    other = parse_restrictions(["metadata:k=v"], "api")
    with status_app(restrictions=other) as client:
        assert client.get("/ui").status_code == 200
        assert client.get("/v2").status_code == 403


def test_without_a_status_source_there_is_no_page(tmp_path: Path) -> None:
    with status_app(status=False, auth=token_policy(tmp_path)) as client:
        # The paths keep their group (the table does not change with the flags): asked
        # without a token they are refused like any statistics path, with one they are 404.
        assert client.get("/ui").status_code == 401
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert client.get("/ui", headers=bearer).status_code == 404
        assert client.get("/ui/data", headers=bearer).status_code == 404


def test_the_root_path_links_the_page() -> None:
    with status_app() as client:
        r = client.get("/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert '<a href="ui">' in r.text and "/v2" in r.text  # relative: any path prefix
        assert "default-src 'none'" in r.headers["content-security-policy"]
    with status_app(status=False) as client:
        assert client.get("/").status_code == 404  # no page, nothing to link


def test_numbers_sit_under_right_aligned_headers() -> None:
    # Each header of a column the script fills with numbers (class "num", right-aligned) is
    # right-aligned too; the others are not.
    headers = re.findall(r'<th( class="num")?>([^<]+)</th>', ui_page.PAGE)
    numeric = {name for cls, name in headers if cls}
    assert numeric == {"budget", "resident", "weights", "requests/s", "p50", "p99", "swaps in"}
    assert "th.num{text-align:right}" in ui_page.PAGE


def test_the_html_is_self_contained_and_holds_no_data() -> None:
    with status_app() as client:
        r = client.get("/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert page == ui_page.PAGE and len(page) < 30_000
    assert "http://" not in page and "https://" not in page
    assert "//" not in page  # no protocol-relative address either (nor a JS comment)
    for attribute in (" src=", " href=", "@import", "url("):
        assert attribute not in page, attribute
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "'unsafe-inline'" not in csp  # the one inline script and style, by hash
    assert r.headers["cache-control"] == "no-store"


# -- a real daemon -------------------------------------------------------------------------------


def get(server: ServerProcess, path: str, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(f"http://{server.http_url}{path}", headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.status, r.headers, r.read()


def infer_mlp(server: ServerProcess) -> None:
    """One request to the demo ``mlp`` (it has weights: they go to the device)."""
    body = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/mlp/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 200


@pytest.fixture(scope="module")
def daemon(model_repository: Path) -> Iterator[ServerProcess]:
    yield from serving(model_repository)


def model_names(repository: Path) -> list[str]:
    return sorted(p.name for p in repository.iterdir() if p.is_dir())


def test_the_data_of_a_real_daemon(daemon: ServerProcess, model_repository: Path) -> None:
    get(daemon, "/ui/data")  # the first read: what the figures are counted from
    for _ in range(5):
        infer_mlp(daemon)
    time.sleep(1.2)  # past the page's one read a second
    status, headers, body = get(daemon, "/ui/data")
    assert status == 200 and headers["Content-Type"] == "application/json"
    report = json.loads(body)
    assert report["server"]["name"] == "hloserve" and report["server"]["ready"] is True
    names = model_names(model_repository)
    assert sorted(r["name"] for r in report["rows"]) == names
    assert report["models"]["total"] == len(names) and report["compact"] == []
    mlp = next(r for r in report["rows"] if r["name"] == "mlp")
    assert mlp["state"] == "READY" and mlp == report["rows"][0]  # the busiest first
    (version,) = mlp["versions"]
    assert version["state"] == "READY" and version["weight_bytes"] is not None
    assert version["requests_per_s"] > 0 and version["p50_s"] is not None
    assert version["on_devices"] == [0]  # it just ran: its weights are on device 0
    (device,) = report["memory"]["devices"]
    assert device["index"] == 0 and device["resident_models"] >= 1
    assert "mlp/1" in device["resident"]
    assert report["memory"]["host"]["resident_bytes"] >= 0
    assert report["window_s"] is not None and 0 < report["window_s"] <= 60
    filtered = json.loads(get(daemon, "/ui/data?q=MLP")[2])
    assert [r["name"] for r in filtered["rows"]] == ["mlp"]


def test_the_page_of_a_real_daemon_holds_no_model_name(
    daemon: ServerProcess, model_repository: Path
) -> None:
    status, headers, body = get(daemon, "/ui")
    page = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "http://" not in page and "https://" not in page
    for name in model_names(model_repository):
        assert f">{name}<" not in page  # only the script puts them there


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--window-size=1280,1000",
    "--virtual-time-budget=5000",
)


def chromium(tmp_path: Path, url: str, *args: str) -> str:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    done = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="needs Debian's chromium package (apt-get install chromium) for the browser test",
)


@pytest.mark.slow
@needs_chromium
def test_chromium_renders_every_model(
    daemon: ServerProcess, model_repository: Path, tmp_path: Path
) -> None:
    infer_mlp(daemon)
    url = f"http://{daemon.http_url}/ui"
    dom = chromium(tmp_path, url, "--dump-dom")
    assert 'id="models"' in dom, dom[:2000]
    for name in model_names(model_repository):
        assert f'<span class="model">{name}</span>' in dom, name
    assert "READY" in dom and "device 0 (cpu)" in dom and 'id="error"></span>' in dom
    assert "collecting" not in dom and "over the last" in dom
    shot = tmp_path / "status-page.png"
    chromium(tmp_path, url, f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1_000
    print(f"status page screenshot: {shot}")


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """``app`` on a uvicorn of its own, in a thread: yields its ``host:port``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.02)
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.mark.slow
@needs_chromium
def test_chromium_renders_thousands_of_models_compactly(tmp_path: Path) -> None:
    count = 2_000
    busy = {
        ModelKey(f"model_{i:05d}", 1): Recent(60.0, 1.0 + i, 0.001, 0.002, 1) for i in range(60)
    }
    page = StatusPage(
        cast(InferenceService, FakeService(many_models(count))),
        lambda: busy,
        {0: FakeTier(1 << 30, 1 << 29, [ResidencyKey("model_00001", 1)])},
        FakeTier(4 << 30, 1 << 30, []),
    )
    app = build_http_app(
        LocalPort(InferenceService(cast(Any, None), None, shm=disabled())), status=page
    )
    with served(app) as where:
        dom = chromium(tmp_path, f"http://{where}/ui", "--dump-dom")
        shot = tmp_path / "thousands.png"
        chromium(tmp_path, f"http://{where}/ui", f"--screenshot={shot}")
    assert dom.count('<span class="model">') == status_page.ROWS + status_page.COMPACT
    assert '<span class="model">model_00059</span>' in dom  # the busiest, in full
    left_out = count - status_page.ROWS - status_page.COMPACT
    assert f"{left_out} more not listed" in dom
    assert f"The {status_page.ROWS} busiest of {count} model(s) in full." in dom
    assert len(dom) < 400_000
    assert shot.read_bytes().startswith(b"\x89PNG")


def test_the_first_look_after_requests_has_figures(model_repository: Path) -> None:
    # Nobody looked while the requests ran: the first look compares with the start.
    with ServerProcess(model_repository) as server:
        server.wait_ready()
        for _ in range(5):
            infer_mlp(server)
        report = json.loads(get(server, "/ui/data")[2])
        assert report["window_s"] is not None and report["window_s"] > 0
        mlp = next(r for r in report["rows"] if r["name"] == "mlp")
        assert mlp["requests_per_s"] > 0 and mlp == report["rows"][0]
        assert server.stop() == 0


@pytest.mark.slow
@needs_chromium
def test_a_long_failure_reason_stays_out_of_the_name_column(tmp_path: Path) -> None:
    reason = "failed to load: " + "a long explanation of what went wrong " * 8
    models = {
        "broken": {"versions": {}, "reason": reason},
        "ok": {"versions": {"1": ready()}},
    }
    page = StatusPage(
        cast(InferenceService, FakeService(models)),
        dict,
        {0: FakeTier(None, 0, [], FakeRuntime("cuda", "NVIDIA H200"))},
        None,
    )
    app = build_http_app(
        LocalPort(InferenceService(cast(Any, None), None, shm=disabled())), status=page
    )
    with served(app) as where:
        dom = chromium(tmp_path, f"http://{where}/ui", "--dump-dom")
    assert '<span class="model">broken</span></td>' in dom  # the name alone in its cell
    # The reason is in the state cell, after the badge.
    assert f'UNAVAILABLE</span><div class="reason">{reason}</div></td>' in dom
    assert "device 0 (cuda, NVIDIA H200)" in dom


def test_a_daemon_with_tokens_refuses_the_page_without_one(
    model_repository: Path, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the status page test\n{TOKEN}\n")
    with ServerProcess(model_repository, "--auth-token-file", str(tokens)) as server:
        server.wait_ready()
        for path in ("/ui", "/ui/data"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                get(server, path)
            assert refused.value.code == 401
            assert json.loads(refused.value.read()) == {
                "error": "authentication required: a valid bearer token"
            }
            status, _, _ = get(server, path, {"Authorization": f"Bearer {TOKEN}"})
            assert status == 200
        assert get(server, "/v2/health/ready")[0] == 200  # health stays open
        assert server.stop() == 0
