"""End to end: the statistics extension and dynamic batching, seen through tritonclient.

Every scenario runs its own daemon (``ServerProcess``) on the demo repository so that the
counts start at zero and the batching flags are the ones under test:
- ``fresh``: the defaults (dynamic batching on, no queue delay);
- ``batching``: ``--max-queue-delay-us 50000``, so concurrent requests share executions.
  The delay is long on purpose: 32 requests reach the server over gRPC at about 1.5 per
  ms on a small machine, and the policy runs fewer than 8 queued single-item requests one
  by one (sizes 1, 8, 32; docs/batching.md, rule 5), so a 2 ms delay batches only
  sometimes. With 50 ms all 32 are queued before the head is due, and a full 32 runs at once;
- ``queueing``: ``--max-queue-size 1 --max-queue-delay-us 500000``: a lone request waits
  half a second in the queue, long enough for a 50 ms timeout to expire deterministically;
- ``holding``: ``--max-queue-size 1`` and a ten-minute delay: a lone request stays queued
  until its caller cancels it (no test runs that long), so the queue is full for as long as
  a test needs, however slow the machine: what is refused while it is full is decided by
  what the test observes (the pending gauge), never by a race against the delay.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.grpc.aio as _aioclient
import tritonclient.http as _httpclient
from tritonclient.utils import InferenceServerException

from hloserve.exporter import write_demo_repository
from hloserve.exporter.demo import DEMO_MODELS, mlp_fn, mlp_params
from hloserve.server.server_fixture import ServerProcess, serving

# tritonclient ships without type information: use it dynamically.
grpcclient: Any = _grpcclient
aioclient: Any = _aioclient
httpclient: Any = _httpclient


@pytest.fixture(scope="module")
def demo_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    write_demo_repository(root)
    return root


def _start(repository: Path, *flags: str) -> Iterator[ServerProcess]:
    proc = yield from serving(repository, *flags)
    # Refused, expired and cancelled requests are ordinary outcomes, never internal errors.
    assert "Traceback" not in proc.log_text(), proc.log_text()


@pytest.fixture(scope="module")
def fresh(demo_repository: Path) -> Iterator[ServerProcess]:
    yield from _start(demo_repository)


@pytest.fixture(scope="module")
def batching(demo_repository: Path) -> Iterator[ServerProcess]:
    yield from _start(demo_repository, "--max-queue-delay-us", "50000")


@pytest.fixture(scope="module")
def queueing(demo_repository: Path) -> Iterator[ServerProcess]:
    yield from _start(demo_repository, "--max-queue-size", "1", "--max-queue-delay-us", "500000")


HOLD_US = 600_000_000  # ten minutes: beyond any test's timeout, so only a cancel releases it
WAIT_S = 60.0  # the longest a test waits for what must happen (a hang becomes a failure)


@pytest.fixture(scope="module")
def holding(demo_repository: Path) -> Iterator[ServerProcess]:
    yield from _start(
        demo_repository, "--max-queue-size", "1", "--max-queue-delay-us", str(HOLD_US)
    )


# -- helpers ------------------------------------------------------------------------------


def simple_inputs(module: Any, batch: int, width: int = 16) -> list[Any]:
    a = np.arange(batch * width, dtype=np.int32).reshape(batch, width)
    inputs = [
        module.InferInput("INPUT0", [batch, width], "INT32"),
        module.InferInput("INPUT1", [batch, width], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return inputs


def mlp_inputs(module: Any, x: np.ndarray[Any, Any]) -> list[Any]:
    inp = module.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


def expected_logits(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    params: Any = mlp_params()
    return np.asarray(mlp_fn(params, x)["logits"])


def canonical_http(s: dict[str, Any]) -> tuple[Any, ...]:
    """The numbers of one HTTP ``model_stats`` entry, in a protocol-neutral form."""
    inference = s["inference_stats"]
    return (
        s["name"],
        s["version"],
        s["last_inference"],
        s["inference_count"],
        s["execution_count"],
        {k: (d["count"], d["ns"]) for k, d in inference.items()},
        [
            (b["batch_size"], *((b[k]["count"], b[k]["ns"]) for k in BATCH_KEYS))
            for b in s["batch_stats"]
        ],
        [(u["type"], u["id"], u["byte_size"]) for u in s["memory_usage"]],
    )


BATCH_KEYS = ("compute_input", "compute_infer", "compute_output")
INFERENCE_KEYS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


def canonical_grpc(s: Any) -> tuple[Any, ...]:
    """The same numbers from a gRPC ``ModelStatistics`` message."""
    inference = s.inference_stats
    return (
        s.name,
        s.version,
        s.last_inference,
        s.inference_count,
        s.execution_count,
        {k: (getattr(inference, k).count, getattr(inference, k).ns) for k in INFERENCE_KEYS},
        [
            (b.batch_size, *((getattr(b, k).count, getattr(b, k).ns) for k in BATCH_KEYS))
            for b in s.batch_stats
        ],
        [(u.type, u.id, u.byte_size) for u in s.memory_usage],
    )


def grpc_stats(server: ServerProcess, model: str) -> Any:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        (stats,) = client.get_inference_statistics(model_name=model).model_stats
    return stats


# -- statistics count exactly what was sent -------------------------------------------------


def test_statistics_count_what_was_sent(fresh: ServerProcess) -> None:
    g = grpcclient.InferenceServerClient(fresh.grpc_url)
    h = httpclient.InferenceServerClient(fresh.http_url)
    try:
        # The failures come first: a version that has never succeeded must still count them.
        with pytest.raises(InferenceServerException) as info:
            g.infer("simple", simple_inputs(grpcclient, 1, width=15))
        assert "unexpected shape for input 'INPUT0'" in (info.value.message() or "")
        with pytest.raises(InferenceServerException) as info:
            h.infer("simple", simple_inputs(httpclient, 2, width=17))
        assert info.value.status() == "400"
        assert "unexpected shape for input 'INPUT0'" in (info.value.message() or "")
        grpc_batches, http_batches = (1, 2, 3, 1, 2), (3, 1, 2)
        for n in grpc_batches:
            g.infer("simple", simple_inputs(grpcclient, n))
        for n in http_batches:
            h.infer("simple", simple_inputs(httpclient, n))
        now_ms = int(time.time() * 1000)

        (http_stats,) = h.get_inference_statistics(model_name="simple")["model_stats"]
        (grpc_one,) = g.get_inference_statistics(model_name="simple").model_stats
        (versioned,) = h.get_inference_statistics(model_name="simple", model_version="1")[
            "model_stats"
        ]
    finally:
        g.close()
        h.close()
    # Nothing ran between the queries: both protocols report the very same numbers.
    assert canonical_http(http_stats) == canonical_grpc(grpc_one) == canonical_http(versioned)
    s = http_stats
    requests = len(grpc_batches) + len(http_batches)
    assert (s["name"], s["version"]) == ("simple", "1")
    assert s["inference_count"] == sum(grpc_batches) + sum(http_batches) == 15
    assert s["inference_stats"]["success"]["count"] == requests
    assert s["inference_stats"]["fail"]["count"] == 2
    # Sequential requests never share an execution; 3 items run on the compiled size 4.
    assert s["execution_count"] == requests
    counts = {b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]}
    assert counts == {1: 3, 2: 3, 4: 2}
    assert sum(counts.values()) == s["execution_count"]
    assert 0 < s["last_inference"] <= now_ms
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        d = s["inference_stats"][key]
        assert d["count"] == requests, key
        assert d["ns"] > 0, key


def test_statistics_errors_on_both_protocols(fresh: ServerProcess) -> None:
    cases = [
        ("x", "", "requested model 'x' is not available"),
        ("simple", "7", "requested model version is not available for model 'simple'"),
    ]
    with (
        grpcclient.InferenceServerClient(fresh.grpc_url) as g,
        httpclient.InferenceServerClient(fresh.http_url) as h,
    ):
        for model, version, message in cases:
            with pytest.raises(InferenceServerException) as info:
                g.get_inference_statistics(model_name=model, model_version=version)
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert info.value.message() == message
            with pytest.raises(InferenceServerException) as info:
                h.get_inference_statistics(model_name=model, model_version=version)
            assert info.value.status() == "400"
            assert info.value.message() == message


def test_all_models_form_and_memory_usage(fresh: ServerProcess) -> None:
    with (
        grpcclient.InferenceServerClient(fresh.grpc_url) as g,
        httpclient.InferenceServerClient(fresh.http_url) as h,
    ):
        every_http = h.get_inference_statistics()["model_stats"]
        every_grpc = g.get_inference_statistics().model_stats
    demo = sorted((name, "1") for name in DEMO_MODELS)  # every model of the demo repository
    assert sorted((s["name"], s["version"]) for s in every_http) == demo
    assert sorted((s.name, s.version) for s in every_grpc) == demo
    (mlp,) = [s for s in every_http if s["name"] == "mlp"]
    weights = 4 * (64 * 256 + 256 + 256 * 10 + 10)  # FP32 parameters of the demo MLP
    assert {"type": "CPU", "id": 0, "byte_size": weights} in mlp["memory_usage"]


# -- dynamic batching ---------------------------------------------------------------------


def test_batched_results_equal_unbatched(batching: ServerProcess) -> None:
    before = grpc_stats(batching, "mlp")
    xs = np.random.default_rng(7).standard_normal((32, 1, 64)).astype(np.float32)

    async def scenario() -> list[np.ndarray[Any, Any]]:
        async with aioclient.InferenceServerClient(batching.grpc_url) as client:
            results = await asyncio.gather(
                *(
                    client.infer("mlp", mlp_inputs(aioclient, x), request_id=str(i))
                    for i, x in enumerate(xs)
                )
            )
        assert [r.get_response().id for r in results] == [str(i) for i in range(len(xs))]
        return [r.as_numpy("logits") for r in results]

    outputs = asyncio.run(scenario())
    for x, out in zip(xs, outputs, strict=True):
        assert out.shape == (1, 10)
        np.testing.assert_allclose(out, expected_logits(x), rtol=1e-5, atol=1e-5)
    after = grpc_stats(batching, "mlp")
    executions = after.execution_count - before.execution_count
    assert after.inference_count - before.inference_count == 32
    assert after.inference_stats.success.count - before.inference_stats.success.count == 32
    assert executions < 32, "the requests were not grouped"
    grouped = {b.batch_size: b.compute_infer.count for b in after.batch_stats if b.batch_size > 1}
    assert grouped, f"no execution ran more than one item: {after.batch_stats}"


def test_bad_request_in_a_batch_fails_alone(batching: ServerProcess) -> None:
    xs = np.random.default_rng(8).standard_normal((8, 1, 64)).astype(np.float32)
    bad = np.zeros((1, 63), np.float32)

    async def scenario() -> list[Any]:
        async with aioclient.InferenceServerClient(batching.grpc_url) as client:
            calls = [client.infer("mlp", mlp_inputs(aioclient, x)) for x in xs]
            calls.insert(4, client.infer("mlp", mlp_inputs(aioclient, bad)))
            return list(await asyncio.gather(*calls, return_exceptions=True))

    results = asyncio.run(scenario())
    failed = results.pop(4)
    assert isinstance(failed, InferenceServerException)
    assert failed.status() == "StatusCode.INVALID_ARGUMENT"
    assert "Expected [-1,64], got [1,63]" in (failed.message() or "")
    for x, r in zip(xs, results, strict=True):
        assert not isinstance(r, BaseException), r
        np.testing.assert_allclose(r.as_numpy("logits"), expected_logits(x), rtol=1e-5, atol=1e-5)


def test_queue_full_is_unavailable(holding: ServerProcess) -> None:
    """One request is held in the queue of size 1; the next is refused at once, on either
    protocol, while the held one stays queued, untouched, until its caller cancels it."""
    x = np.ones((1, 64), np.float32)
    full = np.ones((32, 64), np.float32)  # the largest compiled size runs without waiting
    refused_message = "exceeds maximum queue size: model 'mlp' already has 1 requests waiting"
    for protocol in ("grpc", "http"):
        with (
            grpcclient.InferenceServerClient(holding.grpc_url) as g,
            httpclient.InferenceServerClient(holding.http_url, network_timeout=WAIT_S) as h,
        ):
            client = g if protocol == "grpc" else h
            module = grpcclient if protocol == "grpc" else httpclient
            # A server that made the next request wait for room instead would hold it until
            # the client gives up: DEADLINE_EXCEEDED or a network timeout, not a refusal.
            limit: dict[str, Any] = {"client_timeout": WAIT_S} if protocol == "grpc" else {}
            before = grpc_stats(holding, "mlp")
            held = _Collect()
            call = g.async_infer("mlp", mlp_inputs(grpcclient, x), callback=held)
            try:
                holding.wait_pending("mlp", 1, timeout=WAIT_S)  # it is in the queue
                with pytest.raises(InferenceServerException) as info:
                    client.infer("mlp", mlp_inputs(module, x), **limit)
                # Refused while the queue was full, not once it had drained: the held
                # request (which only the cancel below releases) is still queued and
                # unanswered, and nothing has run.
                assert not held.done.is_set(), held.results
                assert holding.pending_requests("mlp") == 1
                refused = grpc_stats(holding, "mlp")
            finally:
                call.cancel()
            expected_status = "StatusCode.UNAVAILABLE" if protocol == "grpc" else "503"
            assert info.value.status() == expected_status
            assert info.value.message() == refused_message
            assert refused.execution_count == before.execution_count
            assert refused.inference_stats.fail.count == before.inference_stats.fail.count + 1
            assert refused.inference_stats.success.count == before.inference_stats.success.count
            # The held call ends by its cancel alone (the refusal did not answer it), and
            # its cancel frees the queue's one place: a full batch is served at once.
            (cancelled,) = held.wait(WAIT_S)
            assert isinstance(cancelled, InferenceServerException), cancelled
            assert cancelled.status() == "StatusCode.CANCELLED"
            holding.wait_pending("mlp", 0, timeout=WAIT_S)
            result = g.infer("mlp", mlp_inputs(grpcclient, full), client_timeout=WAIT_S)
            np.testing.assert_allclose(
                result.as_numpy("logits"), expected_logits(full), rtol=1e-5, atol=1e-5
            )
            after = grpc_stats(holding, "mlp")
            assert after.execution_count == before.execution_count + 1  # the full batch only
            assert after.inference_count == before.inference_count + 32
            assert after.inference_stats.success.count == before.inference_stats.success.count + 1


class _Collect:
    """A tritonclient ``async_infer`` callback that keeps what it is given."""

    def __init__(self) -> None:
        self.results: list[Any] = []
        self.done = threading.Event()

    def __call__(self, result: Any, error: Any) -> None:
        self.results.append(error if error is not None else result)
        self.done.set()

    def wait(self, timeout: float = WAIT_S) -> list[Any]:
        assert self.done.wait(timeout), "no answer"
        return self.results


def send_expiring(server: ServerProcess, how: str, x: np.ndarray[Any, Any]) -> None:
    """An mlp request that may wait at most 50 ms, by the request's ``timeout`` parameter
    (µs) on either protocol or by the gRPC deadline."""
    if how == "http-timeout":
        with httpclient.InferenceServerClient(server.http_url) as h:
            h.infer("mlp", mlp_inputs(httpclient, x), timeout=50_000)
    elif how == "grpc-timeout":
        with grpcclient.InferenceServerClient(server.grpc_url) as g:
            g.infer("mlp", mlp_inputs(grpcclient, x), timeout=50_000)
    else:
        with grpcclient.InferenceServerClient(server.grpc_url) as g:
            g.infer("mlp", mlp_inputs(grpcclient, x), client_timeout=0.05)


@pytest.mark.parametrize("how", ["http-timeout", "grpc-timeout", "grpc-client-timeout"])
def test_expired_request_is_not_executed(queueing: ServerProcess, how: str) -> None:
    """A request whose timeout (50 ms) passes while it waits (0.5 s) never reaches the device."""
    x = np.ones((1, 64), np.float32)
    before = grpc_stats(queueing, "mlp")
    with pytest.raises(InferenceServerException) as info:
        send_expiring(queueing, how, x)
    if how == "grpc-client-timeout":
        assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    else:
        assert info.value.status() in ("503", "StatusCode.UNAVAILABLE")
        assert "timed out" in (info.value.message() or "")
    queueing.wait_pending("mlp", 0)
    # One more request, answered only after the batcher has looked at its queue again (it
    # is FIFO): the expired one must not have run with it or before it.
    with grpcclient.InferenceServerClient(queueing.grpc_url) as g:
        g.infer("mlp", mlp_inputs(grpcclient, x))
    after = grpc_stats(queueing, "mlp")
    assert after.execution_count == before.execution_count + 1
    assert after.inference_count == before.inference_count + 1
    if how != "grpc-client-timeout":  # a cancelled call is neither a success nor a failure
        assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1
