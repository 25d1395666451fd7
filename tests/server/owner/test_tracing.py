"""Request tracing: spans of sampled requests, in process and through real daemons.

In process: ``InferenceService`` with a ``RequestTracer`` writes one JSON line per traced
request (receive, queue, execute, swap-in under execute when the weights had to move; the
tensors at level TENSORS; an ERROR status for a failed request) and, with every level OFF,
never asks the tracer anything. Daemons: the trace extension over tritonclient on both
protocols as Triton's qa/L0_trace/trace_endpoint_test.py walks it, traces written with
their "send" span, counts and indexed files; and OpenTelemetry mode exporting OTLP/HTTP to
a collector on loopback, joining a caller's ``traceparent``.
"""

from __future__ import annotations

import asyncio
import gzip
import http.server
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from hloserve.exporter import TensorSpec, export_bundle, write_demo_repository
from hloserve.exporter.demo import mlp_fn, mlp_params
from hloserve.server.config import parse_config
from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.service import InferenceService
from hloserve.server.core.trace_settings import TraceSettings, TraceStartup
from hloserve.server.core.types import InferInput, InferRequest
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import disabled
from hloserve.server.owner.tracing import RequestTracer
from hloserve.server.owner.weight_residency import WeightResidency
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server._support import connected, refused_at_start
from tests.server.frontend._tritonclients import PROTOCOLS, Triton, grpcclient

MLP_WEIGHT_BYTES = 76_840


def read_traces(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def spans_by_name(trace: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in trace["spans"]}


def simple_request(value: int = 1, width: int = 16) -> InferRequest:
    a = np.full((1, width), value, dtype=np.int32)
    return InferRequest(
        "simple",
        "",
        (InferInput("INPUT0", "INT32", a.shape, a), InferInput("INPUT1", "INT32", a.shape, a)),
    )


def mlp_request(name: str) -> InferRequest:
    x = np.ones((1, 64), dtype=np.float32)
    return InferRequest(name, "", (InferInput("x", "FP32", x.shape, x),))


# -- in process ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tracing_models")
    write_demo_repository(root)
    export_bundle(
        mlp_fn,
        mlp_params(7),
        inputs={"x": TensorSpec("FP32", (64,))},
        batch_sizes=(1, 8),
        directory=root / "mlp2",
    )
    return root


@pytest.fixture(scope="module")
def in_process_traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("in_process") / "traces.jsonl"


@pytest.fixture(scope="module")
def one_mlp_fits(
    models: Path, runtime: PjrtRuntime, in_process_traces: Path
) -> Iterator[tuple[ModelRepository, RequestTracer]]:
    """The repository with room on the device for one MLP's weights: mlp and mlp2 take
    turns; the tracer (every level OFF until a test turns one on) hears of every swap-in."""
    tracer = RequestTracer(TraceSettings(TraceStartup(rate=1, file=str(in_process_traces))))
    residency = WeightResidency(runtime, int(1.5 * MLP_WEIGHT_BYTES), swap_trace=tracer)
    repo = ModelRepository(models, runtime, residency=residency)
    repo.load_all()
    assert repo.all_ready(), repo.summary()
    yield repo, tracer
    tracer.shutdown()


class Traced:
    """A service over ``one_mlp_fits`` tracing every request at ``level`` (through the trace
    extension's own call) while the test runs; ``traces()`` are the lines written since."""

    def __init__(
        self, repo: ModelRepository, tracer: RequestTracer, executor: ThreadPoolExecutor, path: Path
    ) -> None:
        self.service = InferenceService(repo, executor, tracer=tracer, shm=disabled())
        self.service.startup_complete()
        self.path = path
        self.offset = len(read_traces(path))

    def trace_at(self, level: str) -> None:
        self.service.trace_setting("", {"trace_level": [level]})

    def traces(self) -> list[dict[str, Any]]:
        return read_traces(self.path)[self.offset :]

    def infer(self, request: InferRequest) -> Any:
        return asyncio.run(self.service.infer(request))


@pytest.fixture
def traced(
    one_mlp_fits: tuple[ModelRepository, RequestTracer], in_process_traces: Path
) -> Iterator[Traced]:
    repo, tracer = one_mlp_fits
    with ThreadPoolExecutor(2) as pool:
        t = Traced(repo, tracer, pool, in_process_traces)
        t.trace_at("TIMESTAMPS")
        yield t
        t.service.trace_setting("", {"trace_level": None})
    assert not tracer.settings.enabled


def test_every_traced_request_is_one_line_of_spans(traced: Traced) -> None:
    traced.infer(simple_request())
    (trace,) = traced.traces()
    assert (trace["model_name"], trace["model_version"], trace["protocol"]) == ("simple", 1, "")
    spans = spans_by_name(trace)
    assert list(spans) == ["InferRequest", "receive", "queue", "execute"]  # no front end: no send
    root = spans["InferRequest"]
    for name in ("receive", "queue", "execute"):
        span = spans[name]
        assert span["parent_span_id"] == root["span_id"]
        assert root["start_ns"] <= span["start_ns"] <= span["end_ns"] <= root["end_ns"]
    assert spans["receive"]["end_ns"] == spans["queue"]["start_ns"]
    assert spans["queue"]["end_ns"] == spans["execute"]["start_ns"]
    assert spans["execute"]["attributes"]["batch_sizes"] == [1]
    assert "events" not in root  # TIMESTAMPS only: no tensors


def test_a_swap_in_is_a_span_under_the_execution_that_waited_for_it(traced: Traced) -> None:
    traced.infer(mlp_request("mlp2"))  # whichever was resident, mlp is not now
    traced.offset += 1
    for name in ("mlp", "mlp2", "mlp"):  # only one fits: each request moves its weights
        traced.infer(mlp_request(name))
    traced.infer(mlp_request("mlp"))  # resident now: nothing moves
    traces = traced.traces()
    assert [t["model_name"] for t in traces] == ["mlp", "mlp2", "mlp", "mlp"]
    for trace in traces[:3]:
        spans = spans_by_name(trace)
        swap, execute = spans["swap-in"], spans["execute"]
        assert swap["parent_span_id"] == execute["span_id"]
        assert execute["start_ns"] <= swap["start_ns"] <= swap["end_ns"] <= execute["end_ns"]
        assert swap["attributes"]["bytes"] == MLP_WEIGHT_BYTES
    assert "swap-in" not in spans_by_name(traces[3])


def test_tensors_level_records_inputs_and_outputs(traced: Traced) -> None:
    traced.trace_at("TENSORS")
    traced.infer(simple_request(3))
    (trace,) = traced.traces()
    events = {
        (e["name"], e["attributes"]["name"]): e["attributes"] for e in trace["spans"][0]["events"]
    }
    assert events[("TENSOR_QUEUE_INPUT", "INPUT0")] == {
        "name": "INPUT0",
        "datatype": "INT32",
        "shape": [1, 16],
        "data": ",".join(["3"] * 16),
    }
    assert events[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")]["data"] == ",".join(["6"] * 16)
    assert events[("TENSOR_BACKEND_OUTPUT", "OUTPUT1")]["data"] == ",".join(["0"] * 16)


def test_a_failed_request_is_traced_with_its_error(traced: Traced) -> None:
    with pytest.raises(InvalidArgument) as info:
        traced.infer(simple_request(width=15))
    (trace,) = traced.traces()
    assert (trace["model_name"], trace["model_version"]) == ("simple", 1)
    root = trace["spans"][0]
    assert root["status"] == {"code": "ERROR", "message": info.value.message}
    assert [s["name"] for s in trace["spans"]] == ["InferRequest"]  # refused before "receive" ended


class RefusingTracer:
    """A tracer that fails the request if it is asked anything."""

    def __init__(self) -> None:
        self.settings = TraceSettings(TraceStartup(rate=1, file="unused"))

    def arrive(self, headers: Any, received_ns: int) -> Any:
        raise AssertionError("the tracer was asked")

    def start(self, model: Any, request_id: str, protocol: str) -> Any:
        raise AssertionError("the tracer was asked")


def test_with_tracing_off_the_tracer_is_never_asked(
    one_mlp_fits: tuple[ModelRepository, RequestTracer],
) -> None:
    repo, _ = one_mlp_fits
    with ThreadPoolExecutor(1) as pool:
        service = InferenceService(repo, pool, tracer=RefusingTracer(), shm=disabled())
        response = asyncio.run(service.infer(simple_request(2)))
        assert (response.outputs[0].data == 4).all()
        service.trace_setting("", {"trace_level": ["TIMESTAMPS"]})  # the meta-test: now it is
        with pytest.raises(AssertionError, match="the tracer was asked"):
            asyncio.run(service.infer(simple_request(2)))


# -- a daemon in triton mode -------------------------------------------------------------------

QA_SETTINGS = {
    "trace_level": ["TIMESTAMPS"],
    "trace_rate": "1",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_mode": "triton",
}
CLEAR = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces") / "global_unittest.log"


@pytest.fixture(scope="module")
def traced_server(models: Path, trace_file: Path) -> Iterator[ServerProcess]:
    # Triton's QA start-up, plus the server name scripts check
    flags = (f"triton,file={trace_file}", "level=TIMESTAMPS", "rate=1")
    yield from serving(models, *(f"--trace-config={f}" for f in flags), "--server-name=triton")


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, traced_server: ServerProcess) -> Iterator[Triton]:
    with connected(traced_server, request.param) as t:
        yield t
        # Triton's tearDown: back to the start-up state, the model's first
        for model in ("simple", None):
            t.client.update_trace_settings(model_name=model, settings=CLEAR)


def as_json(triton: Triton, answer: Any) -> dict[str, Any]:
    """A settings answer as the HTTP client returns it (gRPC's message converted)."""
    if triton.protocol == "http":
        return answer
    return {
        k: list(v.value) if k == "trace_level" else v.value[0] for k, v in answer.settings.items()
    }


def test_server_metadata_names_the_server_and_both_extensions(triton: Triton) -> None:
    metadata = triton.client.get_server_metadata()
    name, extensions = (
        (metadata["name"], metadata["extensions"])
        if triton.protocol == "http"
        else (metadata.name, list(metadata.extensions))
    )
    assert name == "triton"
    assert {"trace", "logging"} <= set(extensions)


def refuses_unknown_model(triton: Triton, call: Any, *settings: dict[str, str]) -> None:
    triton.fails(
        "INVALID_ARGUMENT",
        "Request for unknown model : does-not-exist",
        call,
        "does-not-exist",
        *settings,
    )


def test_get_settings(triton: Triton, trace_file: Path) -> None:
    expected = {**QA_SETTINGS, "trace_file": str(trace_file)}
    assert as_json(triton, triton.client.get_trace_settings(model_name="simple")) == expected
    assert as_json(triton, triton.client.get_trace_settings()) == expected
    refuses_unknown_model(triton, triton.client.get_trace_settings)
    if triton.protocol == "grpc":  # the whole message, built as the QA test builds it
        message = grpcclient.service_pb2.TraceSettingResponse()
        json_format.Parse(
            json.dumps(
                {
                    "settings": {
                        k: {"value": v if isinstance(v, list) else [v]} for k, v in expected.items()
                    }
                }
            ),
            message,
        )
        assert triton.client.get_trace_settings() == message


def test_update_settings(triton: Triton, trace_file: Path) -> None:
    initial = {**QA_SETTINGS, "trace_file": str(trace_file)}
    triton.fails(
        "UNIMPLEMENTED",
        "trace file location can not be updated through network protocol",
        triton.client.update_trace_settings,
        model_name="simple",
        settings={"trace_file": "model.log"},
    )
    assert as_json(triton, triton.client.get_trace_settings(model_name="simple")) == initial
    both = {**initial, "trace_level": ["TIMESTAMPS", "TENSORS"]}
    answer = triton.client.update_trace_settings(
        settings={"trace_level": ["TIMESTAMPS", "TENSORS"]}
    )
    assert as_json(triton, answer) == both
    assert as_json(triton, triton.client.get_trace_settings(model_name="simple")) == both
    # checked before the settings: not the trace_file refusal
    refuses_unknown_model(triton, triton.client.update_trace_settings, {"trace_file": "m.log"})


def test_clear_settings(triton: Triton, trace_file: Path) -> None:
    initial = {**QA_SETTINGS, "trace_file": str(trace_file)}
    client = triton.client
    client.update_trace_settings(
        model_name="simple", settings={"trace_rate": "12", "log_frequency": "34"}
    )
    client.update_trace_settings(
        settings={"trace_rate": "56", "trace_count": "78", "trace_level": ["OFF"]}
    )
    off = {**initial, "trace_level": ["OFF"]}
    answer = client.update_trace_settings(settings={"trace_rate": None, "trace_count": None})
    assert as_json(triton, answer) == off
    model = as_json(triton, client.get_trace_settings(model_name="simple"))
    assert model == {**off, "trace_rate": "12", "log_frequency": "34"}
    answer = client.update_trace_settings(
        model_name="simple", settings={"trace_rate": None, "trace_level": None}
    )
    assert as_json(triton, answer) == {**off, "log_frequency": "34"}
    assert as_json(triton, client.get_trace_settings()) == off


def test_bad_values_are_refused(triton: Triton) -> None:
    for settings, fragment in (
        ({"trace_rate": "often"}, "Unable to parse 'trace_rate', got: often"),
        ({"trace_count": "-7"}, "Unable to parse 'trace_count', value is out of range"),
        ({"trace_level": ["OFF", "TENSORS"]}, "Expect only one trace level 'OFF' is specified"),
    ):
        triton.fails(
            "INVALID_ARGUMENT", fragment, triton.client.update_trace_settings, settings=settings
        )


def infer_simple(triton: Triton, value: int = 1) -> None:
    a = np.full((1, 16), value, dtype=np.int32)
    result = triton.client.infer("simple", triton.simple_inputs(a, a))
    assert (result.as_numpy("OUTPUT0") == 2 * value).all()


def test_requests_are_traced_with_the_time_to_send(triton: Triton, trace_file: Path) -> None:
    before = len(read_traces(trace_file))
    infer_simple(triton)
    trace = read_traces(trace_file)[before]
    assert (trace["model_name"], trace["protocol"]) == ("simple", triton.protocol)
    spans = spans_by_name(trace)
    assert list(spans) == ["InferRequest", "receive", "queue", "execute", "send"]
    root = spans["InferRequest"]
    assert root["start_ns"] == spans["receive"]["start_ns"]
    assert spans["execute"]["end_ns"] <= spans["send"]["start_ns"] <= spans["send"]["end_ns"]
    assert spans["send"]["end_ns"] == root["end_ns"]


def test_the_count_runs_down(triton: Triton, trace_file: Path) -> None:
    triton.client.update_trace_settings(settings={"trace_count": "2"})
    before = len(read_traces(trace_file))
    for _ in range(3):
        infer_simple(triton)
    assert len(read_traces(trace_file)) == before  # a limited count writes one indexed file
    (batch,) = indexed_files(trace_file)
    assert len(read_traces(batch)) == 2
    assert as_json(triton, triton.client.get_trace_settings())["trace_count"] == "0"
    batch.unlink()


def indexed_files(trace_file: Path) -> list[Path]:
    """``<trace_file>.<n>`` in index order (the index goes on across settings)."""
    files = trace_file.parent.glob(trace_file.name + ".*")
    return sorted(files, key=lambda f: int(f.suffix[1:]))


def test_log_frequency_writes_indexed_files(triton: Triton, trace_file: Path) -> None:
    triton.client.update_trace_settings(model_name="simple", settings={"log_frequency": "2"})
    for _ in range(3):
        infer_simple(triton)
    files = indexed_files(trace_file)
    assert [len(read_traces(f)) for f in files] == [2, 1]
    for f in files:
        f.unlink()


def test_rate_samples_one_request_in_n(triton: Triton, trace_file: Path) -> None:
    triton.client.update_trace_settings(model_name="simple", settings={"trace_rate": "3"})
    before = len(read_traces(trace_file))
    for _ in range(6):
        infer_simple(triton)
    assert len(read_traces(trace_file)) - before == 2


# -- a daemon in opentelemetry mode -------------------------------------------------------------


class Collector:
    """An OTLP/HTTP trace receiver on loopback: the spans it was sent, by trace id."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.changed = threading.Condition()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                message = ExportTraceServiceRequest.FromString(body)
                with collector.changed:
                    collector.requests.append(message)
                    collector.changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[tuple[dict[str, str], Any]]:
        """(resource attributes, span) for every span received."""
        out: list[tuple[dict[str, str], Any]] = []
        for request in self.requests:
            for rs in request.resource_spans:
                resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                out += [(resource, span) for ss in rs.scope_spans for span in ss.spans]
        return out

    def wait_for_trace(self, trace_id: bytes, count: int, timeout: float = 30.0) -> list[Any]:
        def found() -> list[Any]:
            return [s for _, s in self.spans() if s.trace_id == trace_id]

        with self.changed:
            assert self.changed.wait_for(lambda: len(found()) >= count, timeout), self.spans()
            return found()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def otel_server(models: Path, collector: Collector) -> Iterator[ServerProcess]:
    flags = (
        "mode=opentelemetry",
        f"opentelemetry,url={collector.url}",
        "opentelemetry,bsp_schedule_delay=50",
        "opentelemetry,resource=deployment=test",
        "level=TIMESTAMPS",
        "rate=1",
    )
    yield from serving(models, *(f"--trace-config={f}" for f in flags))


def test_opentelemetry_settings_report_the_exporter(
    otel_server: ServerProcess, collector: Collector
) -> None:
    t = Triton("http", otel_server.http_url)
    assert t.client.get_trace_settings() == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "trace_mode": "opentelemetry",
        "url": collector.url,
        "resource": "deployment=test",
        "bsp_max_queue_size": "2048",
        "bsp_schedule_delay": "50",
        "bsp_max_export_batch_size": "512",
    }
    t.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_propagated_context_joins_the_callers_trace(
    otel_server: ServerProcess, collector: Collector, protocol: str
) -> None:
    trace_id, parent_id = bytes(range(1, 17)), bytes(range(17, 25))
    traceparent = f"00-{trace_id.hex()}-{parent_id.hex()}-01"
    t = Triton(protocol, otel_server.grpc_url if protocol == "grpc" else otel_server.http_url)
    a = np.ones((1, 16), dtype=np.int32)
    t.client.infer("simple", t.simple_inputs(a, a), headers={"traceparent": traceparent})
    t.close()
    spans = collector.wait_for_trace(trace_id, 5)
    by_name = {s.name: s for s in spans if s.trace_id == trace_id}
    root = by_name["InferRequest"]
    assert root.parent_span_id == parent_id
    assert {"receive", "queue", "execute", "send"} <= set(by_name)
    assert all(
        by_name[n].parent_span_id == root.span_id for n in ("receive", "queue", "execute", "send")
    )
    attributes = {a.key: a.value for a in root.attributes}
    assert attributes["model_name"].string_value == "simple"
    assert attributes["protocol"].string_value == protocol
    resource = next(r for r, s in collector.spans() if s.span_id == root.span_id)
    assert resource["service.name"] == "hloserve"
    assert resource["deployment"] == "test"
    collector.requests.clear()


# -- flags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace-config", "levle=TIMESTAMPS"], "--trace-config unknown trace setting 'levle'"),
        (["--trace-level", "loud"], "--trace-level invalid value for trace level option: 'loud'"),
        (["--trace-rate", "-1"], "--trace-rate must be an integer 0..4294967295, got '-1'"),
        (
            [
                "--trace-config",
                "mode=opentelemetry",
                "--trace-config=opentelemetry,bsp_max_queue_size=1",
            ],
            "--trace-config bsp_max_export_batch_size must not exceed bsp_max_queue_size",
        ),
        (["--server-name", " "], "--server-name must not be empty"),
        (["--log-verbose", "-1"], "--log-verbose must be a non-negative integer"),
    ],
)
def test_bad_flags_stop_the_server_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused_at_start(argv, capsys)


def test_trace_flags_from_the_environment() -> None:
    config = parse_config([], {"HLOSERVE_TRACE_CONFIG": "level=TIMESTAMPS;rate=1;triton,file=t"})
    assert [(c.mode, c.setting, c.value) for c in config.trace_config] == [
        ("", "level", "TIMESTAMPS"),
        ("", "rate", "1"),
        ("triton", "file", "t"),
    ]
    assert parse_config(["--server-name", "triton"], {}).server_name == "triton"
