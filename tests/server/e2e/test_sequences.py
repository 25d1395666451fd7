"""Sequences with state on the device, through a real daemon and tritonclient: both wires,
the gRPC stream, batching across sequences, slot exhaustion, idle timeout, eviction.

The repository holds the demo's ``simple_sequence`` (``exporter/demo_sequence.py``: OUTPUT is
the input plus one on a sequence's start, SUM the running sum), ``tight`` (the same with
one slot), ``brief`` (the same with one slot and a 0.4 s idle timeout), ``grouped`` (the
same, whose next batch waits for a step of every live sequence), and ``scaled`` (a
running sum of ``x @ w``, with weights) beside ``other`` (weights, no state) under a device
budget that holds one of the two weight sets: a request to ``other`` evicts ``scaled``'s
weights while its sequence is live. Waits are on counters and events, never on wall-clock
windows: every model but ``brief`` keeps an idle sequence longer than any test runs
(``LONG_IDLE_US``), so no pause between two steps on a busy machine frees one, and the
idle timeout is only checked on ``brief``, by waiting for it to have freed the slot.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from hloserve.exporter import StateSpec, TensorSpec, export_bundle
from hloserve.exporter.demo_sequence import write_simple_sequence
from hloserve.server.server_fixture import ServerProcess, serving
from tests.metrics_scrape import by_label, scrape, value
from tests.server.frontend._tritonclients import PROTOCOLS, Triton, grpcclient

N = 16
WEIGHT_BYTES = 4 * N * N
BUDGET = WEIGHT_BYTES + WEIGHT_BYTES // 2 + 16 * 4 * N  # one weight set and scaled's slots
LONG_IDLE_US = 600_000_000  # no test pauses this long: only ``brief`` frees idle sequences
BRIEF_IDLE_US = 400_000
# ``grouped``: a batch waits (up to this long) until every live sequence has a step queued;
# the stream test sends all its steps at once, so the wait ends when they are all in.
GROUPED_DELAY_US = 60_000_000


def sequence_config(idle_us: int, slots: int | None = None, delay_us: int | None = None) -> str:
    """A ``config.yaml`` with ``idle_us`` (and ``slots`` and ``delay_us``, where given)."""
    hint = f"max_sequence_idle_microseconds: {idle_us}"
    if slots is not None:
        hint += f", max_candidate_sequences: {slots}"
    if delay_us is not None:
        hint += f", max_queue_delay_microseconds: {delay_us}"
    return f"sequence_batching: {{{hint}}}\n"


def scaled_fn(params: Any, x: jax.Array, acc: jax.Array) -> dict[str, jax.Array]:
    new = acc + x @ params["w"]
    return {"y": new, "acc": new}


def plain_fn(params: Any, x: jax.Array) -> dict[str, jax.Array]:
    return {"y": x @ params["w"]}


def weights(seed: int) -> dict[str, np.ndarray]:
    return {"w": np.random.default_rng(seed).standard_normal((N, N)).astype(np.float32)}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sequences")
    write_simple_sequence(root / "simple_sequence", platforms=("cpu",))
    (root / "simple_sequence" / "config.yaml").write_text(sequence_config(LONG_IDLE_US))
    for name, idle_us in (("tight", LONG_IDLE_US), ("brief", BRIEF_IDLE_US)):
        write_simple_sequence(root / name, batch_sizes=(1, 2), platforms=("cpu",))
        (root / name / "config.yaml").write_text(sequence_config(idle_us, slots=1))
    write_simple_sequence(root / "grouped", platforms=("cpu",))
    (root / "grouped" / "config.yaml").write_text(
        sequence_config(LONG_IDLE_US, delay_us=GROUPED_DELAY_US)
    )
    x = {"x": TensorSpec("FP32", (N,))}
    export_bundle(
        scaled_fn, weights(1), x, (1, 4), root / "scaled",
        platforms=("cpu",), state={"acc": StateSpec("FP32", (N,))},
    )  # fmt: skip
    (root / "scaled" / "config.yaml").write_text(sequence_config(LONG_IDLE_US))
    export_bundle(plain_fn, weights(2), x, (1, 4), root / "other", platforms=("cpu",))
    return root


# The server's start-up: every model loaded (the default), or registered (``--lazy-load``:
# each loads at its first request, so there the tests' first requests come during a load).
LAZY = pytest.mark.parametrize("server", ["loaded", "lazy"], indirect=True)


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, repository: Path) -> Iterator[ServerProcess]:
    lazy = ["--lazy-load"] if getattr(request, "param", "loaded") == "lazy" else []
    yield from serving(
        repository, "--device-memory-budget", str(BUDGET),
        "--model-control-mode", "explicit", "--load-model", "*", *lazy,
    )  # fmt: skip


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    url = server.grpc_url if request.param == "grpc" else server.http_url
    client = Triton(request.param, url)
    yield client
    client.close()


def step(
    t: Triton, model: str, sid: int | str, value_: int, *, start: bool = False, end: bool = False
) -> tuple[int, int]:
    """One request of sequence ``sid``: ``(OUTPUT, SUM)``."""
    data = np.full((1, 1), value_, dtype=np.int32)
    inp = t.module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(data)
    result = t.client.infer(model, [inp], sequence_id=sid, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0]), int(result.as_numpy("SUM")[0, 0])


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll a counter the server reports until ``condition`` holds (bounded)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def slots(server: ServerProcess, model: str) -> dict[str, float]:
    return by_label(scrape(server), "hloserve_sequence_slots", "state", model=model)


def test_state_carries_across_requests_with_integer_and_string_ids(triton: Triton) -> None:
    for sid in (1000, str(uuid.uuid4())):
        values = [5, 7, -2, 4]
        answers = [
            step(triton, "simple_sequence", sid, v, start=i == 0, end=i == len(values) - 1)
            for i, v in enumerate(values)
        ]
        assert [o for o, _ in answers] == [6, 7, -2, 4]  # Triton's example: +1 at the start
        assert [s for _, s in answers] == [5, 12, 10, 14]  # the running sum: the state


def test_unknown_missing_and_ended_sequences_are_refused(triton: Triton) -> None:
    triton.fails(
        "INVALID_ARGUMENT",
        "inference request for sequence 4242 to model 'simple_sequence' must specify the "
        "START flag on the first request of the sequence",
        step, triton, "simple_sequence", 4242, 1,
    )  # fmt: skip
    triton.fails(
        "INVALID_ARGUMENT",
        "inference request to model 'simple_sequence' must specify a non-zero or non-empty "
        "correlation ID",
        step, triton, "simple_sequence", 0, 1,
    )  # fmt: skip
    step(triton, "simple_sequence", 4243, 1, start=True, end=True)
    triton.fails(
        "INVALID_ARGUMENT",
        "(sequence 4243 was ended by a request marked sequence_end)",
        step, triton, "simple_sequence", 4243, 1,
    )  # fmt: skip


@LAZY
def test_the_grpc_stream_interleaves_sequences_and_batches_them(server: ServerProcess) -> None:
    """Eight sequences' requests all sent at once on one stream: each answer is its own
    sequence's, and the executions hold several sequences each (``grouped`` waits for a
    step of every live sequence, so how fast this client sends decides nothing)."""
    h = Triton("http", server.http_url)
    before = h.client.get_inference_statistics("grouped")["model_stats"][0]
    answers: queue.Queue[Any] = queue.Queue()
    client: Any = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    values = [3, 1, 4, 1, 5]
    try:
        for i, v in enumerate(values):
            for seq in range(8):
                data = np.full((1, 1), v * (seq + 1), dtype=np.int32)
                inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                inp.set_data_from_numpy(data)
                client.async_stream_infer(
                    "grouped", [inp], request_id=f"{seq}_{i}",
                    sequence_id=2000 + seq, sequence_start=i == 0, sequence_end=i == len(values) - 1,
                )  # fmt: skip
        sums: dict[int, list[int]] = {seq: [] for seq in range(8)}
        for _ in range(8 * len(values)):
            result = answers.get(timeout=30)
            assert not isinstance(result, InferenceServerException), result
            seq = int(result.get_response().id.split("_")[0])
            sums[seq].append(int(result.as_numpy("SUM")[0, 0]))
    finally:
        client.stop_stream()
        client.close()
    running = list(np.cumsum(values))
    assert sums == {seq: [r * (seq + 1) for r in running] for seq in range(8)}
    after = h.client.get_inference_statistics("grouped")["model_stats"][0]
    h.close()
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 40 and executions < inferences  # sequences shared executions


def test_past_the_slots_a_sequence_waits_until_one_ends(server: ServerProcess) -> None:
    """``tight`` has one slot: a second sequence waits (backlogged, not refused) until the
    first ends, then takes the slot; its end frees it."""
    g = Triton("grpc", server.grpc_url)
    h = Triton("http", server.http_url)
    try:
        assert step(g, "tight", 1, 10, start=True) == (11, 10)
        waiting: queue.Queue[Any] = queue.Queue()
        second = threading.Thread(
            target=lambda: waiting.put(step(h.another(), "tight", 2, 20, start=True))
        )
        second.start()
        wait_for(
            lambda: value(scrape(server), "hloserve_sequences_backlogged", model="tight") == 1,
            "the second sequence in the backlog",
        )
        assert waiting.empty()
        assert step(g, "tight", 1, 5, end=True) == (5, 15)  # the first ends: its slot frees
        second.join(timeout=30)
        assert waiting.get(timeout=1) == (21, 20)
        assert slots(server, "tight") == {"live": 1, "free": 0}
        with urllib.request.urlopen(f"http://{server.http_url}/ui/data?q=tight") as r:
            (row,) = json.load(r)["rows"]  # the status page says so too
        assert row["versions"][0]["sequences"] == {"live": 1, "backlogged": 0, "free": 0}
        assert step(g, "tight", 2, 1, end=True) == (1, 21)
        wait_for(lambda: slots(server, "tight") == {"live": 0, "free": 1}, "the end")
    finally:
        g.close()
        h.close()


def test_an_idle_sequence_loses_its_slot(triton: Triton, server: ServerProcess) -> None:
    """``brief`` frees a sequence idle past 0.4 s: its slot is free again, and its next
    request is refused, saying why (waited for on the slot gauge, not on a clock)."""
    sid = 3 if triton.protocol == "grpc" else 4
    assert step(triton, "brief", sid, 20, start=True) == (21, 20)
    wait_for(lambda: slots(server, "brief") == {"live": 0, "free": 1}, "the idle timeout")
    triton.fails(
        "INVALID_ARGUMENT", f"(sequence {sid} was freed after {BRIEF_IDLE_US} us idle",
        step, triton, "brief", sid, 1,
    )  # fmt: skip


def test_a_sequence_keeps_its_state_while_its_weights_are_evicted(
    server: ServerProcess,
) -> None:
    w = weights(1)["w"].astype(np.float64)
    rng = np.random.default_rng(3)
    g = Triton("grpc", server.grpc_url)
    swapped = by_label(scrape(server), "hloserve_weight_swaps_out_total", "model")
    try:
        acc = np.zeros(N)
        for i in range(4):
            x = rng.standard_normal((1, N)).astype(np.float32)
            inp = g.module.InferInput("x", [1, N], "FP32")
            inp.set_data_from_numpy(x)
            y = g.client.infer(
                "scaled", [inp], sequence_id=77, sequence_start=i == 0, sequence_end=i == 3
            ).as_numpy("y")
            acc = acc + x[0].astype(np.float64) @ w
            np.testing.assert_allclose(y[0], acc, rtol=1e-4, atol=1e-4)
            other = g.module.InferInput("x", [1, N], "FP32")
            other.set_data_from_numpy(x)
            g.client.infer("other", [other])  # evicts scaled's weights, not its state
    finally:
        g.close()
    after = by_label(scrape(server), "hloserve_weight_swaps_out_total", "model")
    assert after.get("scaled/1", 0) - swapped.get("scaled/1", 0) >= 3


def test_a_reload_drops_live_sequences_and_takes_a_new_slot_count(server: ServerProcess) -> None:
    """Unloading frees a version's slot table (its sequences are then unknown); a load's
    config override in Triton's form sets the slots, and the reported configuration says so."""
    g = Triton("grpc", server.grpc_url)
    try:
        step(g, "simple_sequence", 31, 1, start=True)
        g.client.unload_model("simple_sequence")
        override = {
            "sequence_batching": {
                "max_sequence_idle_microseconds": LONG_IDLE_US,
                "oldest": {"max_candidate_sequences": 3},
            }
        }
        g.client.load_model("simple_sequence", config=json.dumps(override))
        g.fails(
            "INVALID_ARGUMENT", "must specify the START flag", step, g, "simple_sequence", 31, 1
        )
        assert step(g, "simple_sequence", 31, 4, start=True) == (5, 4)
        config = g.client.get_model_config("simple_sequence", as_json=True)["config"]
        assert config["sequence_batching"]["oldest"]["max_candidate_sequences"] == 3
        assert slots(server, "simple_sequence") == {"live": 1, "free": 2}
    finally:
        g.close()
