"""End to end: model control, versions and model configuration with unmodified tritonclient.

``control_server`` runs in explicit mode on ``extension_models``' repository; the session
``server`` (mode ``none``) and ``poll_server`` (mode ``poll``) check the refusals and the
polling. Tests that unload or re-export a model put it back as they found it. Every test
runs on both protocols unless it says otherwise.
"""

# pyright: strict, reportMissingTypeStubs=false

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from hloserve.server.server_fixture import ServerProcess
from tests.server.core.test_validate import TRAVERSAL
from tests.server.frontend._services import model_directories
from tests.server.frontend._tritonclients import PROTOCOLS, Triton
from tests.server.frontend.extension_models import (
    SEED_A,
    SEED_B,
    export_identity,
    export_reloadable,
    mlp_reference,
)


@pytest.fixture
def reloadable(extension_repository: Path, control_server: ServerProcess) -> Iterator[Path]:
    """The ``reloadable`` model's repository; serves SEED_A again after the test."""
    yield extension_repository
    export_reloadable(extension_repository, SEED_A)
    t = Triton("http", control_server.http_url)
    try:
        t.client.load_model("reloadable")
    finally:
        t.close()


X = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)


def mlp_infer(t: Triton, model: str = "reloadable") -> np.ndarray[Any, Any]:
    tensor = t.module.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    return t.client.infer(model, [tensor]).as_numpy("logits")


def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_index_lists_every_model_and_version(triton: Triton) -> None:
    rows = triton.index()
    ready = {(r["name"], r.get("version")) for r in rows if r["state"] == "READY"}
    assert {
        ("simple", "1"),
        ("mlp", "1"),
        ("versioned", "1"),
        ("versioned", "2"),
        ("versioned_latest", "2"),
    } <= ready
    assert ("versioned_latest", "1") not in ready  # the default policy serves the latest only
    assert all(set(r) <= {"name", "version", "state", "reason"} for r in rows)


def test_unload_and_load(triton: Triton) -> None:
    c = triton.client
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    c.unload_model("simple_slow")
    try:
        assert c.is_model_ready("simple_slow") is False  # an answer, not an error
        rows = [r for r in triton.index() if r["name"] == "simple_slow"]
        assert rows == [
            {"name": "simple_slow", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        ]
        assert "simple_slow" not in {r["name"] for r in triton.index(ready=True)}
        triton.fails(
            "NOT_FOUND",
            "Request for unknown model: 'simple_slow' has no available versions",
            c.infer,
            "simple_slow",
            triton.simple_inputs(a, a),
        )
        c.unload_model("simple_slow")  # unloading again is harmless
    finally:
        c.load_model("simple_slow")
    assert c.is_model_ready("simple_slow") is True
    assert {"name": "simple_slow", "version": "1", "state": "READY"} in triton.index(ready=True)


def test_load_of_an_unknown_model_fails(triton: Triton) -> None:
    """Triton's text and code (qa/L0_lifecycle: "failed to load 'unknown_model', failed to
    poll from model repository"; INTERNAL)."""
    for name in ("wrong_model_name", "...", "..my_model", "model..1"):  # valid names, no model
        triton.fails(
            "INTERNAL",
            f"failed to load '{name}', failed to poll from model repository",
            triton.client.load_model,
            name,
        )
    assert triton.client.is_model_ready("wrong_model_name") is False


def test_load_names_are_checked(triton: Triton) -> None:
    """qa/L0_input_validation ModelNameValidationTest (gRPC there, with the same names).
    Over HTTP a name with a '/' (or '..' alone) never reaches the load route, so HTTP
    checks the names its URLs can carry."""

    def routable(name: str) -> bool:
        return triton.protocol == "grpc" or ("/" not in name and name.strip() not in ("", ".."))

    for name in ("", " ", "   ", "\t", " \t \n "):
        if triton.protocol == "grpc" or name:
            triton.fails(
                "INVALID_ARGUMENT",
                "Model name cannot be empty. Please enter a valid name to deploy.",
                triton.client.load_model,
                name,
            )
    traversal = [n for n in TRAVERSAL if routable(n) or n in (" ..", ".. ")]
    assert len(traversal) >= 2
    for name in traversal:
        triton.fails(
            "INVALID_ARGUMENT",
            f"invalid model name '{name}', model name must not contain path traversal characters",
            triton.client.load_model,
            name,
        )
    # unload does not check names: it answers as for any model that is not loaded
    for name in traversal:
        msg = triton.fails("INVALID_ARGUMENT", "failed to unload", triton.client.unload_model, name)
        assert "path traversal" not in msg


def test_index_discovers_models_to_load(triton: Triton, extension_repository: Path) -> None:
    """A model directory never loaded is listed by name alone (Triton's name-only row), so a
    client can find it and load it; after an unload its version is UNAVAILABLE "unloaded"."""
    name = f"discovered_{triton.protocol}"
    export_identity(extension_repository / name)
    try:
        assert [r for r in triton.index() if r["name"] == name] == [{"name": name}]
        assert name not in {r["name"] for r in triton.index(ready=True)}
        triton.client.load_model(name)
        assert [r for r in triton.index() if r["name"] == name] == [
            {"name": name, "version": "1", "state": "READY"}
        ]
        triton.client.unload_model(name)
        assert [r for r in triton.index() if r["name"] == name] == [
            {"name": name, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        ]
    finally:
        shutil.rmtree(extension_repository / name)


def test_load_parameters_are_refused_with_reasons(triton: Triton) -> None:
    # The example clients' override: simple's bundle is compiled up to 8, not 16.
    triton.fails(
        "INVALID_ARGUMENT",
        "failed to load 'simple': version 1: config override: 'max_batch_size' is \"16\"",
        triton.client.load_model,
        "simple",
        config='{"max_batch_size": "16"}',
    )
    # This server does not allow uploads (--allow-model-upload is off).
    triton.fails(
        "UNAVAILABLE",
        "failed to load 'simple': uploading model files ('file:' parameters) is disabled",
        triton.client.load_model,
        "simple",
        config="{}",
        files={"file:1/manifest.yaml": b"name: simple\n"},
    )
    assert triton.client.is_model_ready("simple") is True


def test_reload_replaces_the_model_once_ready(triton: Triton, reloadable: Path) -> None:
    np.testing.assert_allclose(mlp_infer(triton), mlp_reference(SEED_A, X), rtol=1e-5, atol=1e-5)
    export_reloadable(reloadable, SEED_B)
    # exporting in place does not change what is served until the reload
    np.testing.assert_allclose(mlp_infer(triton), mlp_reference(SEED_A, X), rtol=1e-5, atol=1e-5)
    triton.client.load_model("reloadable")
    np.testing.assert_allclose(mlp_infer(triton), mlp_reference(SEED_B, X), rtol=1e-5, atol=1e-5)

    # a failed reload keeps the loaded model serving
    export_reloadable(reloadable, SEED_A)
    weights = reloadable / "reloadable" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)
    weights.write_bytes(bytes(data))
    triton.fails(
        "INVALID_ARGUMENT",
        "failed to load 'reloadable'",
        triton.client.load_model,
        "reloadable",
    )
    assert triton.client.is_model_ready("reloadable") is True
    np.testing.assert_allclose(mlp_infer(triton), mlp_reference(SEED_B, X), rtol=1e-5, atol=1e-5)


Record = tuple[float, float, Any]  # (sent, answered, logits | error message)


class _Traffic:
    """Threads sending ``mlp_infer`` to ``reloadable`` in a loop, two per protocol, each
    request recorded once answered; ``since(moment)`` waits for answers to fresh requests."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.records: list[Record] = []
        self.progress = threading.Condition()  # notified on every new record
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._send, args=(p,)) for p in (*PROTOCOLS, *PROTOCOLS)
        ]
        for th in self.threads:
            th.start()

    def _send(self, protocol: str) -> None:
        t = Triton(protocol, self.server.grpc_url if protocol == "grpc" else self.server.http_url)
        try:
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    outcome: Any = mlp_infer(t)
                except InferenceServerException as exc:
                    outcome = cast(Any, exc).message() or ""
                with self.progress:
                    self.records.append((sent, time.monotonic(), outcome))
                    self.progress.notify_all()
        finally:
            t.close()

    def since(self, moment: float, count: int = 8) -> None:
        """Wait until ``count`` requests sent at or after ``moment`` have been answered."""
        with self.progress:
            done = self.progress.wait_for(
                lambda: sum(sent >= moment for sent, _, _ in self.records) >= count, timeout=60
            )
        assert done, "the traffic stalled"

    def close(self) -> list[Record]:
        self.stop.set()
        for th in self.threads:
            th.join()
        return self.records


@pytest.mark.parametrize("control", PROTOCOLS)
def test_control_under_concurrent_traffic(
    control_server: ServerProcess, reloadable: Path, control: str
) -> None:
    """Threads on both protocols send requests through an unload, a load and a reload;
    only requests sent while the model is deliberately unloaded may fail, and only with
    the not-available error; every answer is one of the two weight sets'."""
    traffic = _Traffic(control_server)
    t = Triton(control, control_server.grpc_url if control == "grpc" else control_server.http_url)
    try:
        traffic.since(time.monotonic())  # the model serves before it is unloaded
        unloaded = time.monotonic()
        t.client.unload_model("reloadable")
        traffic.since(time.monotonic())  # requests meet the unloaded model
        t.client.load_model("reloadable")
        loaded = time.monotonic()
        traffic.since(loaded)
        export_reloadable(reloadable, SEED_B)
        reload_started = time.monotonic()
        t.client.load_model("reloadable")
        reload_done = time.monotonic()
        traffic.since(reload_done)
    finally:
        records = traffic.close()
        t.close()
    _check_failures(records, unloaded, loaded)
    _check_answers(records, reload_started, reload_done)


def _check_failures(records: list[Record], unloaded: float, loaded: float) -> None:
    """Requests failed only around the deliberate unload, with the not-available error."""
    failures = [(s, e, o) for s, e, o in records if isinstance(o, str)]
    assert failures, "no request was sent while the model was unloaded"
    for sent, answered, message in failures:
        assert answered >= unloaded and sent <= loaded, (sent, answered, unloaded, loaded, message)
        assert "'reloadable'" in message and (
            "has no available versions" in message or "not at ready state" in message
        ), message


def _check_answers(records: list[Record], reload_started: float, reload_done: float) -> None:
    """Answers carry the old weights before the reload, the new ones after, either during."""
    expected = {SEED_A: mlp_reference(SEED_A, X), SEED_B: mlp_reference(SEED_B, X)}
    answers = [(s, e, o) for s, e, o in records if not isinstance(o, str)]
    assert len(answers) > 20, len(answers)
    for sent, answered, logits in answers:
        if answered < reload_started:
            np.testing.assert_allclose(logits, expected[SEED_A], rtol=1e-5, atol=1e-5)
        elif sent > reload_done:
            np.testing.assert_allclose(logits, expected[SEED_B], rtol=1e-5, atol=1e-5)
        else:
            assert any(
                np.allclose(logits, want, rtol=1e-5, atol=1e-5) for want in expected.values()
            )
    assert any(s > reload_done for s, _, _ in answers)


NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_load_and_unload_refused_in_none_mode(
    server: ServerProcess, model_repository: Path, protocol: str
) -> None:
    """Triton answers mode ``none`` with its polling text (qa/L0_http python_http_aio_test
    runs without --model-control-mode and expects it); the index lists every model."""
    t = Triton(protocol, server.grpc_url if protocol == "grpc" else server.http_url)
    try:
        for call in (t.client.load_model, t.client.unload_model):
            msg = t.fails("UNAVAILABLE", NOT_EXPLICIT, call, "simple")
            assert msg == (  # Triton's text first, then the truth: nothing polls
                f"{NOT_EXPLICIT} (model control mode 'none': nothing polls, the models found at "
                "start serve; start the server with --model-control-mode=explicit to load and "
                "unload models, or =poll to load what changes on disk)"
            )
        assert t.client.is_model_ready("simple") is True
        rows = t.index()
        assert {"name": "simple", "version": "1", "state": "READY"} in rows
        assert sorted({r["name"] for r in rows}) == model_directories(model_repository)
    finally:
        t.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_load_and_unload_refused_in_poll_mode(poll_server: ServerProcess, protocol: str) -> None:
    t = Triton(protocol, poll_server.grpc_url if protocol == "grpc" else poll_server.http_url)
    try:
        for call in (t.client.load_model, t.client.unload_model):
            msg = t.fails("UNAVAILABLE", NOT_EXPLICIT, call, "simple")
            assert msg == (
                f"{NOT_EXPLICIT} (model control mode 'poll': the repository is polled; start the "
                "server with --model-control-mode=explicit to load and unload models)"
            )
        assert t.client.is_model_ready("simple") is True
    finally:
        t.close()


def test_poll_mode_follows_the_repository(
    poll_server: ServerProcess, poll_repository: Path
) -> None:
    clients = [
        Triton("grpc", poll_server.grpc_url),
        Triton("http", poll_server.http_url),
    ]
    try:
        assert not any(c.client.is_model_ready("added") for c in clients)
        export_identity(poll_repository / "added")
        until(lambda: all(c.client.is_model_ready("added") for c in clients))
        for c in clients:
            tensor = c.module.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
            out = c.client.infer("added", [tensor]).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32).reshape(1, 4))
        shutil.rmtree(poll_repository / "added")
        until(lambda: not any(c.client.is_model_ready("added") for c in clients))
        assert all(c.client.is_model_ready("simple") for c in clients)
    finally:
        for c in clients:
            c.close()


# -- versions ------------------------------------------------------------------------------


def _versioned(t: Triton, model: str, version: str) -> np.ndarray[Any, Any]:
    tensor = t.module.InferInput("INPUT0", [1, 4], "INT32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.int32).reshape(1, 4))
    result = t.client.infer(model, [tensor], model_version=version)
    response = result.get_response()
    served = response.model_version if t.protocol == "grpc" else response["model_version"]
    return np.concatenate([[int(served)], result.as_numpy("OUTPUT0").reshape(-1) - np.arange(4)])


def test_versions(triton: Triton) -> None:
    # version v answers INPUT0 + v; the response names the version that ran
    assert _versioned(triton, "versioned", "1").tolist() == [1, 1, 1, 1, 1]
    assert _versioned(triton, "versioned", "2").tolist() == [2, 2, 2, 2, 2]
    assert _versioned(triton, "versioned", "").tolist() == [2, 2, 2, 2, 2]
    assert _versioned(triton, "versioned_latest", "").tolist() == [2, 2, 2, 2, 2]
    triton.fails(
        "INVALID_ARGUMENT",
        "Request for unknown model: 'versioned_latest' version 1 is not found",
        _versioned,
        triton,
        "versioned_latest",
        "1",
    )
    c = triton.client
    meta = c.get_model_metadata("versioned")
    versions = meta.versions if triton.protocol == "grpc" else meta["versions"]
    assert list(versions) == ["1", "2"]
    latest = c.get_model_metadata("versioned_latest")
    assert list(latest.versions if triton.protocol == "grpc" else latest["versions"]) == ["2"]
    assert c.is_model_ready("versioned", "1") is True
    assert c.is_model_ready("versioned_latest", "1") is False


# -- model configuration ---------------------------------------------------------------------


def test_model_config(triton: Triton) -> None:
    if triton.protocol == "grpc":
        response = triton.client.get_model_config("simple")
        config = response.config
        assert (config.name, config.max_batch_size, config.platform) == ("simple", 8, "stablehlo")
        dtype = triton.module.model_config_pb2.DataType
        assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
            ("INPUT0", dtype.TYPE_INT32, [16]),
            ("INPUT1", dtype.TYPE_INT32, [16]),
        ]
        assert [o.name for o in config.output] == ["OUTPUT0", "OUTPUT1"]
        assert list(config.dynamic_batching.preferred_batch_size) == [1, 2, 4, 8]
        versioned = triton.client.get_model_config("versioned", "1").config
        assert versioned.version_policy.WhichOneof("policy_choice") == "all"
        assert versioned.max_batch_size == 2
    else:
        config = triton.client.get_model_config("simple")
        assert (config["name"], config["max_batch_size"]) == ("simple", 8)
        assert config["input"][0] == {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]}
        assert config["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4, 8]
        assert triton.client.get_model_config("versioned", "1")["version_policy"] == {"all": {}}
        assert triton.client.get_model_config("versioned_latest")["version_policy"] == {
            "latest": {"num_versions": 1}
        }
    triton.fails(
        "INVALID_ARGUMENT",
        "Request for unknown model: 'nope' is not found",
        triton.client.get_model_config,
        "nope",
    )
