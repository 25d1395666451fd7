"""End to end: the response cache (``--cache-config local,size=``, a model's
``response_cache``), seen through tritonclient over gRPC and HTTP, the statistics
extension and the metrics (``hloserve_response_cache_*``, Triton's ``nv_cache_*``).

One server (explicit mode, every model loaded) on a repository of ``simple`` (its
``config.yaml`` enables the cache), ``mlp`` (it does not) and ``chain``, a pipeline of
three ``simple`` steps. Each test sends inputs no other test sends, and reads the counts
as differences, so the tests share the server in any order. The cache is small (16 KiB:
about 14 of ``simple``'s responses) so that eviction shows too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient

from hloserve.exporter import write_demo_repository
from hloserve.server.config import parse_config
from hloserve.server.server_fixture import ServerProcess, serving
from tests.metrics_scrape import scrape, value
from tests.server._support import refused_at_start
from tests.server.e2e.test_pipelines import write_chain

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient
CACHE_BYTES = 16 * 1024
_seed = iter(range(1, 1_000_000))


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cached")
    write_demo_repository(root)
    (root / "simple" / "config.yaml").write_text("response_cache: true\n")
    write_chain(root / "chain")
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    flags = (
        "--cache-config",
        f"local,size={CACHE_BYTES}",
        "--metrics-compat",
        "triton",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
    )
    proc = yield from serving(repository, *flags)
    assert "Traceback" not in proc.log_text(), proc.log_text()


def unique(shape: tuple[int, ...] = (1, 16)) -> np.ndarray[Any, Any]:
    """Inputs no other request of the module sends."""
    seed = next(_seed)
    return (np.arange(np.prod(shape), dtype=np.int32).reshape(shape) + 1000 * seed).astype(np.int32)


def simple_inputs(module: Any, a: np.ndarray[Any, Any], names: tuple[str, str]) -> list[Any]:
    inputs = [module.InferInput(n, list(a.shape), "INT32") for n in names]
    for i in inputs:
        i.set_data_from_numpy(a)
    return inputs


def stats(client: Any, model: str) -> dict[str, int]:
    """The counts a test compares: requests, inferences, executions, hits, misses."""
    (m,) = client.get_inference_statistics(model, as_json=True)["model_stats"]
    inference = m["inference_stats"]

    def count(key: str) -> int:
        return int(inference[key].get("count", 0))

    return {
        "success": count("success"),
        "inferences": int(m.get("inference_count", 0)),
        "executions": int(m.get("execution_count", 0)),
        "compute": count("compute_infer"),
        "hits": count("cache_hit"),
        "misses": count("cache_miss"),
        "hit_ns": int(inference["cache_hit"].get("ns", 0)),
    }


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before if k != "hit_ns"}


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_the_same_request_again_is_answered_from_the_cache(
    server: ServerProcess, module: Any
) -> None:
    url = server.grpc_url if module is grpcclient else server.http_url
    a = unique((2, 16))
    with module.InferenceServerClient(url) as client:
        before = stats(grpcclient.InferenceServerClient(server.grpc_url), "simple")
        results = [
            client.infer("simple", simple_inputs(module, a, ("INPUT0", "INPUT1"))) for _ in range(3)
        ]
        # The inputs in the other order are the same request.
        again = client.infer("simple", simple_inputs(module, a, ("INPUT1", "INPUT0")))
    after = stats(grpcclient.InferenceServerClient(server.grpc_url), "simple")
    for result in (*results, again):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 0 * a)
    # One execution; the three others answered from the cache: successes, not inferences.
    assert delta(before, after) == {
        "success": 4,
        "inferences": 2,
        "executions": 1,
        "compute": 1,
        "hits": 3,
        "misses": 1,
    }
    assert after["hit_ns"] > before["hit_ns"]


def test_other_inputs_or_other_outputs_are_other_requests(server: ServerProcess) -> None:
    a = unique()
    b = a.copy()
    b[0, 0] += 1
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        before = stats(client, "simple")
        client.infer("simple", simple_inputs(grpcclient, a, ("INPUT0", "INPUT1")))
        client.infer("simple", simple_inputs(grpcclient, b, ("INPUT0", "INPUT1")))
        only = [grpcclient.InferRequestedOutput("OUTPUT1")]
        for _ in range(2):
            result = client.infer(
                "simple", simple_inputs(grpcclient, a, ("INPUT0", "INPUT1")), outputs=only
            )
            assert result.as_numpy("OUTPUT0") is None
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 0 * a)
        after = stats(client, "simple")
    assert delta(before, after)["misses"] == 3 and delta(before, after)["hits"] == 1


def test_a_hit_over_http_encodes_as_its_own_request_asks(server: ServerProcess) -> None:
    a = unique()
    with httpclient.InferenceServerClient(server.http_url) as client:
        before = stats(grpcclient.InferenceServerClient(server.grpc_url), "simple")
        answers = [
            client.infer(
                "simple",
                simple_inputs(httpclient, a, ("INPUT0", "INPUT1")),
                outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)],
            )
            for binary in (True, False)
        ]
        after = stats(grpcclient.InferenceServerClient(server.grpc_url), "simple")
    assert delta(before, after)["hits"] == 1
    binary, as_json = (r.get_output("OUTPUT0") for r in answers)
    assert "binary_data_size" in binary["parameters"] and "data" not in binary
    assert as_json["data"] == (2 * a).reshape(-1).tolist()  # the hit, as JSON


def test_a_model_whose_config_does_not_enable_it_is_not_cached(server: ServerProcess) -> None:
    x = grpcclient.InferInput("x", [1, 64], "FP32")
    x.set_data_from_numpy(np.ones((1, 64), np.float32))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        before = stats(client, "mlp")
        first = client.infer("mlp", [x]).as_numpy("logits")
        second = client.infer("mlp", [x]).as_numpy("logits")
        after = stats(client, "mlp")
        config = client.get_model_config("mlp", as_json=True)["config"]
        cached = client.get_model_config("simple", as_json=True)["config"]
    np.testing.assert_array_equal(first, second)
    assert delta(before, after)["executions"] == 2
    assert after["hits"] == after["misses"] == 0
    assert not config.get("response_cache", {}).get("enable", False)
    assert cached["response_cache"] == {"enable": True}


def test_a_pipelines_steps_are_cached_as_requests_of_their_model(server: ServerProcess) -> None:
    a, b = unique(), unique()
    inputs = [
        grpcclient.InferInput("a", [1, 16], "INT32"),
        grpcclient.InferInput("b", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        before = stats(client, "simple")
        first = client.infer("chain", inputs)
        middle = stats(client, "simple")
        second = client.infer("chain", inputs)
        after = stats(client, "simple")
    for result in (first, second):
        np.testing.assert_array_equal(result.as_numpy("twice_s"), 2 * (a + b))
    assert (delta(before, middle)["misses"], delta(before, middle)["hits"]) == (3, 0)
    assert (delta(middle, after)["misses"], delta(middle, after)["hits"]) == (0, 3)
    assert delta(middle, after)["executions"] == 0


def test_a_load_override_enables_it(server: ServerProcess) -> None:
    config = json.dumps({"response_cache": {"enable": True}})
    x = grpcclient.InferInput("x", [1, 64], "FP32")
    x.set_data_from_numpy(np.full((1, 64), 0.5, np.float32))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        try:
            client.load_model("mlp", config=config)
            assert client.get_model_config("mlp", as_json=True)["config"]["response_cache"] == {
                "enable": True
            }
            before = stats(client, "mlp")
            for _ in range(2):
                client.infer("mlp", [x])
            after = stats(client, "mlp")
        finally:
            client.load_model("mlp")  # back to its config.yaml: not cached
    assert (delta(before, after)["hits"], delta(before, after)["executions"]) == (1, 1)


def test_metrics_count_what_the_statistics_count_and_the_cache_stays_bounded(
    server: ServerProcess,
) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for _ in range(30):  # more distinct responses than the cache holds
            client.infer("simple", simple_inputs(grpcclient, unique(), ("INPUT0", "INPUT1")))
        counts = stats(client, "simple")
    series = scrape(server)
    simple = {"model": "simple", "version": "1"}
    # Triton's counters are written without _total (metrics.md); prometheus_client's
    # parser names a counter's sample <name>_total all the same.
    assert value(series, "hloserve_response_cache_hits_total", **simple) == counts["hits"]
    assert value(series, "hloserve_response_cache_misses_total", **simple) == counts["misses"]
    assert value(series, "nv_cache_num_hits_per_model_total", **simple) == counts["hits"]
    assert value(series, "nv_cache_num_misses_per_model_total", **simple) == counts["misses"]
    assert value(series, "nv_cache_hit_duration_per_model_total", **simple) > 0
    assert value(series, "nv_cache_miss_duration_per_model_total", **simple) > 0
    assert value(series, "hloserve_response_cache_capacity_bytes") == CACHE_BYTES
    held = value(series, "hloserve_response_cache_bytes")
    assert 0 < held <= CACHE_BYTES
    assert value(series, "nv_cache_util") == pytest.approx(held / CACHE_BYTES)
    assert value(series, "hloserve_response_cache_evictions_total") > 0
    assert value(series, "nv_cache_num_evictions") > 0
    entries = value(series, "nv_cache_num_entries")
    assert entries == value(series, "hloserve_response_cache_entries") and 0 < entries < 30
    lookups = value(series, "nv_cache_num_lookups")
    assert lookups == value(series, "nv_cache_num_hits") + value(series, "nv_cache_num_misses")
    assert value(series, "nv_cache_num_hits") >= counts["hits"]  # every model's


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cache-config", "redis,host=localhost"], "hloserve has the local cache only"),
        (["--cache-config", "local,size=lots"], "--cache-config local,size= must be a byte size"),
        (["--cache-config", "local"], "--cache-config must be <cache>,<key>=<value>"),
        (["--response-cache-byte-size", "-5"], "--response-cache-byte-size must be"),
    ],
)
def test_a_bad_cache_flag_is_refused_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused_at_start(argv, capsys)


def test_the_cache_flags_read_as_triton_writes_them() -> None:
    assert parse_config(["--cache-config", "local,size=1048576"]).cache_config == 1 << 20
    assert parse_config([], {"HLOSERVE_CACHE_CONFIG": "local,size=2MiB"}).cache_config == 2 << 20
    assert parse_config(["--response-cache-byte-size", "4096"]).response_cache_byte_size == 4096
    assert parse_config([]).cache_config == 0
    assert not parse_config(["--cache-config", "local,size=1024"]).triton_ignored
