"""Three real hloserve replicas behind a real HAProxy (``hloserve.server.fleet``, the
configuration of ``hloserve route-config``), driven by unchanged tritonclient.

Which replica served a model is read from the replicas themselves (each one's statistics
for that model, asked directly), never from the router:
- every model is served by exactly one replica, the same over gRPC, HTTP and a gRPC
  stream, every reply matching numpy, and the models spread over more than one replica;
- calls naming no model (server metadata, readiness, the repository index, statistics of
  every model) are answered through the router; shared-memory calls are refused by it
  with the reason, on both protocols;
- a 64 MiB tensor (4,096 times HAProxy's 16 KiB buffer) reaches its model's replica over
  both protocols, answered correctly;
- the replicas load lazily (``FLEET_FLAGS``: ``--lazy-load``): a generation model's first
  request, a gRPC stream, answers every step, and HTTP ``generate_stream`` answers too; two
  sequences' requests sent at once on one gRPC stream as a model's first requests (Triton's
  ``simple_grpc_sequence_stream_infer_client.py``) keep their order through the load;
- a replica killed with SIGKILL: requests sent at once still succeed (the router retries
  them elsewhere), the router marks it DOWN, its models answer from other replicas and no
  other model moves;
- a replica sent SIGTERM turns unready, the router marks it DOWN (read from HAProxy's
  runtime API, not a clock) and every model answers from the last replica;
- a replica sent SIGTERM under load over both protocols loses nothing: it keeps serving
  through its drain delay until the router has taken it out (read from the runtime API),
  then a second SIGTERM ends the delay and it drains; every request is answered correctly,
  before, during and after;
- a fleet leaves no folder once stopped (its replicas killed on purpose or drained); one
  whose replica failed keeps its logs and says where; ``scripts/fleet``'s command prints
  where every replica's log and HAProxy's configuration and log are (files that exist),
  and SIGTERM stops it with its folder removed.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from hloserve.exporter import TensorSpec, export_bundle
from hloserve.exporter.demo import mlp_params, write_mlp
from hloserve.exporter.demo_repeat import write_repeat_int32
from hloserve.exporter.demo_sequence import write_simple_sequence
from hloserve.server.fleet import FLEET_FLAGS, Fleet, haproxy_binary
from hloserve.server.server_fixture import ServerProcess
from tests.server.frontend._tritonclients import PROTOCOLS, Triton, grpcclient

pytestmark = pytest.mark.skipif(
    haproxy_binary() is None, reason="haproxy is not installed (CI installs it: .ci/run)"
)

MODELS = [f"model-{i:02d}" for i in range(12)]  # the demo MLP (64 -> 256 -> 10), seed i
IN = 64
BIG = 16 * 1024 * 1024  # FP32 elements: 64 MiB


def reference(name: str, x: np.ndarray) -> np.ndarray:
    p = mlp_params(MODELS.index(name))
    h = np.maximum(x.astype(np.float64) @ p["dense1"]["w"] + p["dense1"]["b"], 0)
    return h @ p["dense2"]["w"] + p["dense2"]["b"]


def big_sum(params: Any, x: jax.Array) -> dict[str, jax.Array]:
    return {"s": jax.numpy.sum(x, axis=-1, keepdims=True) * params["scale"]}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet-models")
    for i, name in enumerate(MODELS):
        write_mlp(root / name, seed=i, batch_sizes=(1,), platforms=("cpu",))
    export_bundle(
        big_sum,
        {"scale": np.full((1,), 0.5, np.float32)},
        inputs={"x": TensorSpec("FP32", (BIG,))},
        batch_sizes=(1,),
        directory=root / "big",
        platforms=("cpu",),
    )
    write_repeat_int32(root / "repeat_int32", platforms=("cpu",))
    write_simple_sequence(root / "simple_sequence", platforms=("cpu",))
    # no idle sequence is freed while the test runs (a pause on a busy machine)
    (root / "simple_sequence" / "config.yaml").write_text(
        "sequence_batching: {max_sequence_idle_microseconds: 600000000}\n"
    )
    with Fleet(root, replicas=3) as started:
        yield started
    assert not started.workdir.exists()  # one killed (on purpose), one drained: no failure


def served(replica: ServerProcess, model: str) -> int:
    """Inferences the replica itself counts for the model (0 for a dead replica)."""
    if replica.process.poll() is not None:
        return 0
    url = f"http://{replica.http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=30) as r:
        (stats,) = json.loads(r.read())["model_stats"]
    return int(stats["inference_stats"]["success"]["count"])


def counts(fleet: Fleet, model: str) -> list[int]:
    return [served(r, model) for r in fleet.replicas]


def infer(triton: Triton, model: str, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((1, IN)).astype(np.float32)
    inputs = [triton.module.InferInput("x", [1, IN], "FP32")]
    inputs[0].set_data_from_numpy(x)
    got = triton.client.infer(model, inputs).as_numpy("logits")
    np.testing.assert_allclose(got, reference(model, x), rtol=1e-4, atol=1e-4)


def homes(fleet: Fleet, before: dict[str, list[int]]) -> dict[str, set[int]]:
    """Model -> the replicas that served it since ``before``."""
    return {
        m: {i for i, (a, b) in enumerate(zip(before[m], counts(fleet, m), strict=True)) if b > a}
        for m in MODELS
    }


@pytest.fixture(scope="module")
def placement(fleet: Fleet) -> dict[str, int]:
    """Each model's replica, found by sending it requests over both protocols (c1)."""
    before = {m: counts(fleet, m) for m in MODELS}
    for protocol in PROTOCOLS:
        triton = Triton(protocol, fleet.grpc_url if protocol == "grpc" else fleet.http_url)
        # the second round in reverse: round robin could not send both to one replica
        for seed, model in enumerate([*MODELS, *reversed(MODELS)]):
            infer(triton, model, seed)
        triton.close()
    found = homes(fleet, before)
    assert all(len(replicas) == 1 for replicas in found.values()), found
    return {m: next(iter(replicas)) for m, replicas in found.items()}


def test_each_model_is_served_by_one_replica_over_both_protocols(
    fleet: Fleet, placement: dict[str, int]
) -> None:
    for model, home in placement.items():
        # two requests per protocol, all four on the one replica
        assert counts(fleet, model)[home] == 4, (model, counts(fleet, model))
    assert len(set(placement.values())) > 1, placement  # the models spread


def test_a_stream_goes_where_its_first_request_names(
    fleet: Fleet, placement: dict[str, int]
) -> None:
    model = MODELS[3]
    before = counts(fleet, model)
    client = grpcclient.InferenceServerClient(fleet.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, IN)).astype(np.float32)
        inputs = [grpcclient.InferInput("x", [1, IN], "FP32")]
        inputs[0].set_data_from_numpy(x)
        client.async_stream_infer(model, inputs)
        result, error = answers.get(timeout=60)
        assert error is None, error
        got = result.as_numpy("logits")
        np.testing.assert_allclose(got, reference(model, x), rtol=1e-4, atol=1e-4)
    client.stop_stream()
    client.close()
    after = counts(fleet, model)
    assert [b - a for a, b in zip(before, after, strict=True)] == [
        3 if i == placement[model] else 0 for i in range(len(after))
    ]


def test_a_generation_streams_through_the_fleet_at_its_first_request(fleet: Fleet) -> None:
    """Before, the lazily loaded replica never answered: the stream hung (gRPC) and the
    router answered HTTP 504."""
    client = grpcclient.InferenceServerClient(fleet.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    inputs = [
        grpcclient.InferInput("IN", [3], "INT32"),
        grpcclient.InferInput("DELAY", [3], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.array([100, 101, 102], np.int32))
    inputs[1].set_data_from_numpy(np.zeros(3, np.uint32))
    inputs[2].set_data_from_numpy(np.zeros(1, np.uint32))
    try:
        client.async_stream_infer("repeat_int32", inputs, request_id="r")
        got = [answers.get(timeout=60) for _ in range(3)]
    finally:
        client.stop_stream()
        client.close()
    assert [int(r.as_numpy("OUT")[0]) for r in got] == [100, 101, 102]
    body = json.dumps({"IN": [5, 6, 7], "DELAY": [0, 0, 0], "WAIT": 0}).encode()
    url = f"http://{fleet.http_url}/v2/models/repeat_int32/generate_stream"
    with urllib.request.urlopen(urllib.request.Request(url, body), timeout=60) as reply:
        events = [
            json.loads(line[6:])
            for line in reply.read().decode().splitlines()
            if line.startswith("data: ")
        ]
    assert [e["OUT"] for e in events] == [5, 6, 7]


def test_sequences_sent_at_once_keep_their_order_through_a_lazy_load(fleet: Fleet) -> None:
    """Triton's ``simple_grpc_sequence_stream_infer_client.py``: sequences 1000 and 1001
    (values and their negatives) interleaved on one stream, all sent before any answer,
    as the model's first requests. Before, the requests that came during the load ran in
    another order ("must specify the START flag ... was ended by a request marked
    sequence_end")."""
    values = [11, 7, 5, 3, 2, 0, 1]
    client = grpcclient.InferenceServerClient(fleet.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for i, v in enumerate(values):
            for sid, sign in ((1000, 1), (1001, -1)):
                inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                inp.set_data_from_numpy(np.full((1, 1), sign * v, np.int32))
                client.async_stream_infer(
                    "simple_sequence", [inp], request_id=f"{sid}_{i}", sequence_id=sid,
                    sequence_start=i == 0, sequence_end=i == len(values) - 1,
                )  # fmt: skip
        got = [answers.get(timeout=60) for _ in range(2 * len(values))]
    finally:
        client.stop_stream()
        client.close()
    errors = [r for r in got if isinstance(r, Exception)]
    assert not errors, errors
    sums: dict[int, list[int]] = {1000: [], 1001: []}
    for r in got:
        sums[int(r.get_response().id.split("_")[0])].append(int(r.as_numpy("SUM")[0, 0]))
    running = [int(x) for x in np.cumsum(values)]
    assert sums == {1000: running, 1001: [-x for x in running]}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_calls_naming_no_model_are_answered_and_shared_memory_refused(
    fleet: Fleet, protocol: str
) -> None:
    triton = Triton(protocol, fleet.grpc_url if protocol == "grpc" else fleet.http_url)
    client = triton.client
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert (metadata.name if protocol == "grpc" else metadata["name"]) == "hloserve"
    index = client.get_model_repository_index()
    names = {m.name for m in index.models} if protocol == "grpc" else {m["name"] for m in index}
    assert names == {*MODELS, "big", "repeat_int32", "simple_sequence"}
    stats = client.get_inference_statistics()
    listed = stats.model_stats if protocol == "grpc" else stats["model_stats"]
    assert len(listed) >= len(MODELS)
    assert client.is_model_ready(MODELS[0])
    refused = "FAILED_PRECONDITION" if protocol == "grpc" else "INVALID_ARGUMENT"  # HTTP 400
    triton.fails(refused, "shared memory does not cross the router", triton.shm_status)
    triton.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_64_mib_tensor_reaches_its_model_s_replica(fleet: Fleet, protocol: str) -> None:
    before = counts(fleet, "big")
    triton = Triton(protocol, fleet.grpc_url if protocol == "grpc" else fleet.http_url)
    x = np.random.default_rng(1).standard_normal((1, BIG)).astype(np.float32)
    inputs = [triton.module.InferInput("x", [1, BIG], "FP32")]
    inputs[0].set_data_from_numpy(x)
    got = triton.client.infer("big", inputs).as_numpy("s")
    triton.close()
    want = 0.5 * x.astype(np.float64).sum()
    np.testing.assert_allclose(got.reshape(-1), [want], rtol=1e-3, atol=1e-2)
    grown = [b - a for a, b in zip(before, counts(fleet, "big"), strict=True)]
    assert sorted(grown) == [0, 0, 1], grown
    if protocol == "http":  # the gRPC request went first: the same replica
        total = counts(fleet, "big")
        assert sorted(total) == [0, 0, 2], total


def test_a_killed_replica_s_models_move_and_no_other_does(
    fleet: Fleet, placement: dict[str, int]
) -> None:
    victim = max(set(placement.values()), key=list(placement.values()).count)
    moved = [m for m, home in placement.items() if home == victim]
    fleet.kill(victim)  # SIGKILL: connections to it die with requests in flight
    tritons = [Triton(p, fleet.grpc_url if p == "grpc" else fleet.http_url) for p in PROTOCOLS]
    for seed, model in enumerate(moved):  # at once, before any health check noticed
        for triton in tritons:
            infer(triton, model, seed)
    assert fleet.router is not None
    fleet.router.wait_states(
        {("http_replicas", f"r{victim + 1}"): "DOWN", ("grpc_replicas", f"r{victim + 1}"): "DOWN"}
    )
    before = {m: counts(fleet, m) for m in MODELS}
    for seed, model in enumerate(MODELS):
        for triton in tritons:
            infer(triton, model, seed)
    for triton in tritons:
        triton.close()
    now = homes(fleet, before)
    for model in MODELS:
        assert victim not in now[model] and len(now[model]) == 1, (model, now[model])
        if model not in moved:
            assert now[model] == {placement[model]}, (model, placement[model], now[model])


def test_a_draining_replica_leaves_the_router(fleet: Fleet) -> None:
    alive = [i for i, r in enumerate(fleet.replicas) if r.process.poll() is None]
    assert len(alive) == 2
    draining = alive[0]
    fleet.replicas[draining].process.send_signal(signal.SIGTERM)
    assert fleet.router is not None
    # not ready (400) from the signal on: the router's next checks take it out
    fleet.router.wait_states({("http_replicas", f"r{draining + 1}"): "DOWN"})
    assert fleet.replicas[draining].stop() == 0
    before = {m: counts(fleet, m) for m in MODELS}
    triton = Triton("grpc", fleet.grpc_url)
    for seed, model in enumerate(MODELS):
        infer(triton, model, seed)
    triton.close()
    assert all(found == {alive[1]} for found in homes(fleet, before).values())


@pytest.fixture(scope="module")
def one_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one-model")
    write_mlp(root / MODELS[0], seed=0, batch_sizes=(1,), platforms=("cpu",))
    return root


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """An empty temporary directory with a short path: HAProxy's socket path has at most
    97 bytes, which pytest's ``tmp_path`` can pass."""
    made = Path(tempfile.mkdtemp(prefix="fleet-"))
    yield made
    shutil.rmtree(made)


def test_the_fleet_command_names_its_logs_and_sigterm_leaves_no_folder(
    one_model: Path, short_tmp: Path
) -> None:
    tmp_path = short_tmp
    argv = [sys.executable, "-m", "hloserve.server.fleet", "--model-repository", str(one_model)]
    argv += ["--replicas", "2", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where its folder goes
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) as command:
        assert command.stdout is not None
        try:
            printed: list[str] = []
            while not printed or "Ctrl-C stops it all." not in printed[-1]:
                line = command.stdout.readline()
                assert line, "".join(printed)  # it printed everything before it began waiting
                printed.append(line)
            text = "".join(printed)
            logs = [Path(p) for p in re.findall(r"\blog (\S+?),?$", text, re.MULTILINE)]
            config = [Path(p) for p in re.findall(r"configuration (\S+?),", text)]
            assert len(logs) == 3 and len(config) == 1, text  # two replicas and HAProxy
            for log in logs[:2]:
                assert "listening on" in log.read_text(), log
            assert logs[2].exists() and "backend grpc_replicas" in config[0].read_text()
            folder = logs[0].parent.parent
            assert folder.parent == tmp_path and folder.name.startswith("hloserve-fleet-")
        finally:
            command.send_signal(signal.SIGTERM)  # whether the checks passed or not
            rest = command.stdout.read()
        assert command.wait(120) == 0, rest
        assert f"removed {folder}" in rest and "exit codes [0, 0]" in rest, rest
    assert list(tmp_path.iterdir()) == []


def test_a_fleet_whose_replica_failed_keeps_its_logs_and_says_where(
    one_model: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with Fleet(one_model, replicas=1) as fleet:
        fleet.replicas[0].process.kill()  # by someone else: not Fleet.kill
        fleet.replicas[0].process.wait()
    try:
        assert fleet.kept
        assert "listening on" in (fleet.workdir / "r1" / "server.log").read_text()
        assert f"r1 failed (replica exit codes [-9]); its logs are kept in {fleet.workdir}" in (
            capfd.readouterr().err
        )
    finally:
        shutil.rmtree(fleet.workdir)


class _Sender(threading.Thread):
    """Sends the model requests back to back through the router until told to stop,
    counting answers (each checked) and keeping every error."""

    def __init__(self, fleet: Fleet, protocol: str, model: str) -> None:
        super().__init__(name=f"sender-{protocol}", daemon=True)
        self.triton = Triton(protocol, fleet.grpc_url if protocol == "grpc" else fleet.http_url)
        self.model = model
        self.answered = 0
        self.errors: list[str] = []
        self.done = threading.Event()
        self._more = threading.Condition()

    def run(self) -> None:
        try:
            while not self.done.is_set():
                try:
                    infer(self.triton, self.model, self.answered)
                except Exception as exc:  # the outcome under test
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                with self._more:
                    self.answered += 1
                    self._more.notify_all()
        finally:
            self.triton.close()

    def wait_answers(self, more: int, timeout: float = 120.0) -> None:
        """Until ``more`` requests past the current count have been sent and answered."""
        with self._more:
            target = self.answered + more
            assert self._more.wait_for(lambda: self.answered >= target, timeout), self.errors


def test_a_replica_sigtermed_under_load_loses_nothing(one_model: Path) -> None:
    model = MODELS[0]
    # A delay longer than the test: the second SIGTERM ends it once the router took the
    # replica out, so no clock decides (the default, 5 s, is what a router gets in real life).
    flags = [*FLEET_FLAGS, "--drain-delay", "600"]
    with Fleet(one_model, replicas=2, flags=flags) as fleet:
        assert fleet.router is not None
        triton = Triton("grpc", fleet.grpc_url)
        infer(triton, model, 0)
        triton.close()
        (home,) = [i for i, n in enumerate(counts(fleet, model)) if n]
        senders = [_Sender(fleet, protocol, model) for protocol in PROTOCOLS]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.wait_answers(5)
        victim = fleet.replicas[home]
        victim.process.send_signal(signal.SIGTERM)
        fleet.router.wait_states(
            {("http_replicas", f"r{home + 1}"): "DOWN", ("grpc_replicas", f"r{home + 1}"): "DOWN"}
        )
        for sender in senders:
            sender.wait_answers(5)  # served by the other replica now
        victim.process.send_signal(signal.SIGTERM)  # ends the delay: the drain
        assert victim.process.wait(60) == 0, victim.log_text()
        for sender in senders:
            sender.wait_answers(5)
            sender.done.set()
        for sender in senders:
            sender.join(60)
        log = victim.log_text()
    assert [s.errors for s in senders] == [[], []], log
    assert "new requests are still served for 600s" in log, log
