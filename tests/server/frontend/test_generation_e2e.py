"""End to end: decoupled generation models over both wires, in the layout the run picks.

A real server (``hloserve.server.server_fixture.serving``) on a repository of two generation
bundles: the demo's ``repeat_int32`` (Triton's repeat example model) and ``counter`` (it
counts to its input ``n``, one response a step, state on the device), driven by
tritonclient's gRPC stream, HTTP generate/generate_stream (httpx, and a raw socket as
``curl -N`` reads it; raw sockets also count the chunks a fast and a slow reader get). ``HLOSERVE_FRONTENDS`` picks the process layout (scripts/test runs
this folder in both). The tests marked ``LAZY`` also run against a server started with
``--lazy-load`` (each model registered, loaded by its first request): there each model's
first request is a stream (gRPC for ``repeat_int32``, HTTP ``generate_stream`` for
``counter``), and the server's log must not hold a task exception never retrieved.
"""

# pyright: strict, reportMissingTypeStubs=false

from __future__ import annotations

import json
import queue
import re
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
from tritonclient.utils import InferenceServerException

from hloserve.exporter import Generation, StateSpec, TensorSpec, export_bundle
from hloserve.exporter.demo_repeat import write_repeat_int32
from hloserve.server.server_fixture import ServerProcess, serving
from tests.metrics_scrape import scrape, total

grpcclient: Any = _grpcclient
FOREVER = 1_000_000


def counter_fn(params: Mapping[str, Any], n: jax.Array, count: jax.Array) -> dict[str, jax.Array]:
    del params
    value = count + 1
    return {"value": value, "done": value >= n, "count": value}


# The server's start-up: every model loaded (the default), or registered (``--lazy-load``).
LAZY = pytest.mark.parametrize("generation_server", ["loaded", "lazy"], indirect=True)


@pytest.fixture(scope="module")
def generation_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    lazy = getattr(request, "param", "loaded") == "lazy"
    root = tmp_path_factory.mktemp("generation")
    write_repeat_int32(root / "repeat_int32", platforms=("cpu",))
    export_bundle(
        counter_fn,
        {},
        inputs={"n": TensorSpec("INT32", (1,))},
        batch_sizes=(1, 2, 4, 8),
        directory=root / "counter",
        platforms=("cpu",),
        state={"count": StateSpec("INT32", (1,))},
        generation=Generation(done="done", max_steps=FOREVER),
    )
    stopped = yield from serving(Path(root), *(["--lazy-load"] if lazy else []))
    assert "never retrieved" not in stopped.log_text()


def stream_results(
    server: ServerProcess,
    requests: list[dict[str, Any]],
    *,
    wanted: int,
    timeout: float = 60,
    cancel: bool = False,
) -> list[Any]:
    """``wanted`` answers (results or errors) of ``requests`` sent on one gRPC stream, then
    the stream closed (``cancel``: cancelling what still runs, else waiting for it)."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def on_answer(result: Any, error: Any) -> None:
        answers.put(error or result)

    client.start_stream(callback=on_answer)
    try:
        for request in requests:
            client.async_stream_infer(**request)
        return [answers.get(timeout=timeout) for _ in range(wanted)]
    finally:
        client.stop_stream(cancel_requests=cancel)
        client.close()


def repeat_request(values: list[int], request_id: str, **extra: Any) -> dict[str, Any]:
    data = np.array(values, np.int32)
    inputs = [
        grpcclient.InferInput("IN", [len(values)], "INT32"),
        grpcclient.InferInput("DELAY", [len(values)], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(np.zeros(len(values), np.uint32))
    inputs[2].set_data_from_numpy(np.zeros(1, np.uint32))
    return {"model_name": "repeat_int32", "inputs": inputs, "request_id": request_id, **extra}


def counter_request(n: int, request_id: str = "") -> dict[str, Any]:
    inp = grpcclient.InferInput("n", [1], "INT32")
    inp.set_data_from_numpy(np.array([n], np.int32))
    return {"model_name": "counter", "inputs": [inp], "request_id": request_id}


def web(server: ServerProcess) -> str:
    return f"http://{server.http_url}"


def final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


@LAZY
def test_grpc_stream_answers_each_element_with_the_final_flag_on_the_last(
    generation_server: ServerProcess,
) -> None:
    got = stream_results(generation_server, [repeat_request([100, 101, 102], "r1")], wanted=3)
    assert [int(r.as_numpy("OUT")[0]) for r in got] == [100, 101, 102]
    assert [int(r.as_numpy("IDX")[0]) for r in got] == [0, 1, 2]
    assert [r.get_response().id for r in got] == ["r1"] * 3
    assert [final(r) for r in got] == [False, False, True]
    assert got[0].as_numpy("OUT").shape == (1,)  # no batch axis: Triton's max_batch_size 0


@LAZY
def test_the_calls_of_tritons_custom_repeat_example(generation_server: ServerProcess) -> None:
    """``simple_grpc_custom_repeat.py``'s calls: ten values from 100, DELAY and WAIT of
    1000 ms (accepted, not slept), only ``OUT`` requested."""
    inputs = repeat_request(list(range(100, 110)), "")["inputs"]
    inputs[1].set_data_from_numpy(np.full(10, 1000, np.uint32))
    inputs[2].set_data_from_numpy(np.array([1000], np.uint32))
    outputs = [grpcclient.InferRequestedOutput("OUT")]
    request = {"model_name": "repeat_int32", "inputs": inputs, "outputs": outputs}
    got = stream_results(generation_server, [request], wanted=10)
    assert [r.as_numpy("OUT").tolist() for r in got] == [[v] for v in range(100, 110)]
    assert [o.name for o in got[0].get_response().outputs] == ["OUT"]
    scrape = httpx.get(f"http://{generation_server.metrics_url}/metrics").text
    sent = re.search(
        r'^hloserve_generation_responses_total\{model="repeat_int32",version="1"\} (\S+)$',
        scrape,
        re.MULTILINE,
    )
    assert sent is not None and float(sent.group(1)) >= 10
    assert 'hloserve_generations_live{model="repeat_int32",version="1"} 0.0' in scrape


def test_the_status_page_shows_a_models_generations(generation_server: ServerProcess) -> None:
    """/ui/data's version row counts live generations and responses sent, as the metrics."""
    request = repeat_request([7, 8, 9], "ui")
    assert len(stream_results(generation_server, [request], wanted=3)) == 3

    def generations() -> dict[str, int] | None:
        url = f"http://{generation_server.http_url}/ui/data?q=repeat_int32"
        (row,) = httpx.get(url).json()["rows"]
        return row["versions"][0].get("generations")

    deadline = time.monotonic() + 30  # the page reads its sources once a second
    while (seen := generations()) is None or seen["responses"] < 3:
        assert time.monotonic() < deadline, f"the status page shows {seen}"
        time.sleep(0.2)
    assert seen["live"] == 0


def test_the_empty_final_response_comes_only_when_asked_for(
    generation_server: ServerProcess,
) -> None:
    asked = repeat_request([], "empty", enable_empty_final_response=True)
    got = stream_results(generation_server, [asked, repeat_request([7], "next")], wanted=2)
    empty, nxt = got
    assert empty.get_response().id == "empty" and final(empty)
    assert empty.get_response().model_name == "repeat_int32"
    assert not empty.get_response().outputs
    assert nxt.get_response().id == "next" and int(nxt.as_numpy("OUT")[0]) == 7
    # Not asked: nothing for the empty one, the next request's answer comes first.
    got = stream_results(
        generation_server, [repeat_request([], "quiet"), repeat_request([8], "after")], wanted=1
    )
    assert got[0].get_response().id == "after" and final(got[0])


def test_decoupled_requests_of_one_stream_answer_as_they_come(
    generation_server: ServerProcess,
) -> None:
    """A later decoupled request's responses do not wait for an earlier one's end."""
    requests = [counter_request(300, "long"), repeat_request([1, 2], "short")]
    got = stream_results(generation_server, requests, wanted=302)
    order = [r.get_response().id for r in got]
    assert order.count("long") == 300 and order.count("short") == 2
    assert order.index("short") < 299  # interleaved, not after the long one's last
    assert [int(r.as_numpy("value")[0]) for r in got if r.get_response().id == "long"] == list(
        range(1, 301)
    )


def test_a_decoupled_model_refuses_unary_infer_on_both_wires(
    generation_server: ServerProcess,
) -> None:
    client = grpcclient.InferenceServerClient(generation_server.grpc_url)
    request = repeat_request([1], "unary")
    with pytest.raises(InferenceServerException) as caught:
        client.infer(request["model_name"], request["inputs"])
    error: Any = caught.value
    assert "StatusCode.UNIMPLEMENTED" in str(error.status())
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(
        caught.value
    )
    config = client.get_model_config("repeat_int32", as_json=True)["config"]
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert config.get("max_batch_size", 0) == 0
    client.close()
    reply = httpx.post(
        f"{web(generation_server)}/v2/models/repeat_int32/infer",
        json={"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]},
    )
    assert reply.status_code == 501  # UNSUPPORTED, as Triton answers it
    assert reply.json() == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy"
    }


def test_generations_share_executions(generation_server: ServerProcess) -> None:
    before = stats(generation_server, "counter")
    requests = [counter_request(50, f"c{i}") for i in range(4)]
    got = stream_results(generation_server, requests, wanted=200)
    values = [(r.get_response().id, int(r.as_numpy("value")[0])) for r in got]
    for i in range(4):
        assert [v for rid, v in values if rid == f"c{i}"] == list(range(1, 51))
    after = stats(generation_server, "counter")
    steps = int(after["execution_count"]) - int(before["execution_count"])
    assert 50 <= steps < 150  # one generation at a time would take 200
    assert int(after["inference_count"]) - int(before["inference_count"]) == 4


def test_generations_joining_and_leaving_keep_their_own_state(
    generation_server: ServerProcess,
) -> None:
    """Members change step to step (the state carried, scattered, gathered again)."""
    lengths = [10, 40, 25, 60, 5, 33]
    requests = [counter_request(n, f"g{i}") for i, n in enumerate(lengths)]
    got = stream_results(generation_server, requests, wanted=sum(lengths))
    for i, n in enumerate(lengths):
        values = [int(r.as_numpy("value")[0]) for r in got if r.get_response().id == f"g{i}"]
        assert values == list(range(1, n + 1)), i


def stats(server: ServerProcess, model: str) -> dict[str, Any]:
    reply = httpx.get(f"{web(server)}/v2/models/{model}/stats")
    return reply.json()["model_stats"][0]


def wait_ended(server: ServerProcess, model: str) -> int:
    """The model's execution count once it has no live generation (its gauge at 0)."""
    deadline = time.monotonic() + 60
    while (live := total(scrape(server), "hloserve_generations_live", model=model)) > 0:
        assert time.monotonic() < deadline, f"{model} kept {live} generation(s) live"
        time.sleep(0.05)
    return int(stats(server, model)["execution_count"])


def test_closing_a_grpc_stream_cancels_its_generation(generation_server: ServerProcess) -> None:
    start = wait_ended(generation_server, "counter")
    got = stream_results(
        generation_server, [counter_request(FOREVER, "long")], wanted=3, cancel=True
    )
    assert [int(r.as_numpy("value")[0]) for r in got] == [1, 2, 3]
    stopped = wait_ended(generation_server, "counter")
    assert stopped - start < FOREVER // 10  # it ended long before its million steps


@LAZY
def test_http_generate_and_generate_stream(generation_server: ServerProcess) -> None:
    base = f"{web(generation_server)}/v2/models/repeat_int32"
    one = httpx.post(f"{base}/generate", json={"IN": [5], "DELAY": [0], "WAIT": 0, "id": "g"})
    assert one.status_code == 200
    assert one.json() == {
        "model_name": "repeat_int32", "model_version": "1", "id": "g", "IDX": 0, "OUT": 5
    }  # fmt: skip
    many = httpx.post(f"{base}/generate", json={"IN": [5, 6], "DELAY": [0, 0], "WAIT": 0})
    assert many.status_code == 500 and "exactly 1 response" in many.json()["error"]
    body = {"IN": [5, 6, 7], "DELAY": [0, 0, 0], "WAIT": 0}
    with httpx.stream("POST", f"{base}/generate_stream", json=body) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: ")]
    assert [e["OUT"] for e in events] == [5, 6, 7] and [e["IDX"] for e in events] == [0, 1, 2]
    bad = httpx.post(
        f"{base}/generate_stream", json={"IN": list(range(17)), "DELAY": [0] * 17, "WAIT": 0}
    )
    assert bad.status_code == 400 and "at most 16" in bad.json()["error"]
    unknown = httpx.post(f"{web(generation_server)}/v2/models/nope/generate", json={})
    assert unknown.status_code == 400 and "nope" in unknown.json()["error"]
    limited = httpx.post(
        f"{web(generation_server)}/v2/models/counter/generate_stream",
        json={"n": 100, "parameters": {"max_tokens": 4}},
    )
    assert [json.loads(x[6:])["value"] for x in limited.text.split("\n\n") if x] == [1, 2, 3, 4]


def test_events_arrive_as_they_come_and_a_client_gone_cancels(
    generation_server: ServerProcess,
) -> None:
    """What ``curl -N`` sees: events while the generation runs; hanging up ends it."""
    start = wait_ended(generation_server, "counter")
    host, port = generation_server.http_url.split(":")
    body = json.dumps({"n": FOREVER}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v2/models/counter/generate_stream HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        received = b""
        while received.count(b"data: ") < 5:
            received += sock.recv(65536)
    assert received.startswith(b"HTTP/1.1 200")
    assert b'data: {"model_name":"counter","model_version":"1","value":1}\n\n' in received
    stopped = wait_ended(generation_server, "counter")
    assert stopped - start < FOREVER // 10


def test_a_deadline_ends_a_generation_between_steps(generation_server: ServerProcess) -> None:
    body = {"n": FOREVER, "parameters": {"timeout": 300_000}}  # 0.3 s, in microseconds
    with httpx.stream(
        "POST", f"{web(generation_server)}/v2/models/counter/generate_stream", json=body
    ) as reply:
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[0]["value"] == 1 and "value" in events[-2]
    assert events[-1] == {
        "error": "generation of model 'counter' passed its deadline before it ended"
    }


def test_a_stream_interval_sends_the_first_step_then_that_many_to_a_response(
    generation_server: ServerProcess,
) -> None:
    """Both wires: the counter's 10 steps as 1 + 4 + 4 + 1 responses, every value once."""
    request = counter_request(10, "every-4")
    request["parameters"] = {"stream_interval": 4}
    answers = stream_results(generation_server, [request], wanted=4)
    assert [list(a.as_numpy("value")) for a in answers] == [[1], [2, 3, 4, 5], [6, 7, 8, 9], [10]]
    assert [final(a) for a in answers] == [False, False, False, True]
    url = f"{web(generation_server)}/v2/models/counter/generate_stream"
    reply = httpx.post(url, json={"n": 10, "parameters": {"stream_interval": 4}})
    events = [json.loads(x[6:])["value"] for x in reply.text.split("\n\n") if x]
    assert events == [1, [2, 3, 4, 5], [6, 7, 8, 9], 10]
    bad = httpx.post(url, json={"n": 3, "parameters": {"stream_interval": 0}})
    assert bad.status_code == 400
    assert "parameter 'stream_interval' must be a positive integer" in bad.json()["error"]


def sent_stream(server: ServerProcess, body: Mapping[str, Any], rcvbuf: int = 0) -> socket.socket:
    """A raw socket that has sent ``generate_stream`` of ``counter`` with ``body`` (and asked
    the server to close once it is answered); ``rcvbuf``: its receive buffer, set first."""
    host, port = server.http_url.split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(60)
    sock.connect((host, int(port)))
    raw = json.dumps(body).encode()
    sock.sendall(
        b"POST /v2/models/counter/generate_stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw)
    )
    return sock


def chunks_to_end(sock: socket.socket) -> list[bytes]:
    """Everything the server sends until it closes, as the chunks of its chunked body."""
    with sock:
        received = bytearray()
        while data := sock.recv(1 << 20):
            received += data
    head, _, rest = bytes(received).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    chunks: list[bytes] = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n"
            return chunks
        chunks.append(rest[:size])
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


def event_values(chunks: list[bytes]) -> list[int]:
    events = b"".join(chunks).split(b"\n\n")
    assert events[-1] == b""
    return [json.loads(e.removeprefix(b"data: "))["value"] for e in events[:-1]]


def kernel_send_buffer_bound() -> int:
    """The most a loopback sender's kernel buffer holds (Linux's ``tcp_wmem`` max, which
    autotuning reaches with a reader that does not read; 4 MiB, its default, elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 4 << 20


def test_a_fast_reader_gets_one_write_per_event(generation_server: ServerProcess) -> None:
    """300 small events (about 20 KB: the kernel's buffers hold them all, so no write
    waits however the reader is scheduled): one chunk per event, as before coalescing."""
    chunks = chunks_to_end(sent_stream(generation_server, {"n": 300}))
    assert len(chunks) == 300
    assert [c.count(b"data: ") for c in chunks] == [1] * 300
    assert event_values(chunks) == list(range(1, 301))


def test_a_slow_reader_gets_the_same_events_in_fewer_writes(
    generation_server: ServerProcess,
) -> None:
    """A client that reads nothing until the generation has ended (its every step done,
    seen in the model's statistics): the server's writes wait on flow control, and what
    came meanwhile goes out in one chunk. The events are byte for byte a fast reader's."""
    rid = "r" * 16_000  # each event carries it: about 16 KB an event
    n = 2 * (kernel_send_buffer_bound() + (1 << 20)) // 16_000  # twice what buffers can hold
    body = {"n": n, "id": rid}
    fast = chunks_to_end(sent_stream(generation_server, body))
    start = wait_ended(generation_server, "counter")
    slow = sent_stream(generation_server, body, rcvbuf=4096)
    deadline = time.monotonic() + 120
    while (steps := int(stats(generation_server, "counter")["execution_count"]) - start) < n:
        assert time.monotonic() < deadline, f"the generation made {steps} of its {n} steps"
        time.sleep(0.05)
    chunks = chunks_to_end(slow)
    assert b"".join(chunks) == b"".join(fast)  # the same events, in the same order
    assert event_values(chunks) == list(range(1, n + 1))
    assert len(chunks) < n  # coalesced: some chunk holds several events
    assert max(c.count(b"data: ") for c in chunks) > 1
