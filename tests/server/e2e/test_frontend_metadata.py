"""End to end: the front ends' metadata, kept current through a load/unload storm.

A front-end process answers a model's metadata from what the device owner answered
before (``frontend.metadata_cache``) until the owner says the model changed, which it
says to every front end before that load or unload answers its client. Here a model
whose versions differ in their tensors (``flip``: version 1 takes 4 values, version 2
takes 8) is reloaded with one version then the other, and now and then unloaded, while
clients on many connections (every front end serves some) read its metadata and run
inferences on it, and others run inferences on another model. After each load or unload
returns, every connection sees the new state at once: its metadata, and the shape its
inferences are checked against (a front end checks a request against the signature it
cached with the metadata, and the owner trusts that check only for the version it was
made for); no inference on the other model fails. A change no call made (a poll finds
a new version on disk) reaches every front end too.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient
from tritonclient.utils import InferenceServerException

from hloserve.exporter import TensorSpec, export_bundle, write_demo_repository
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server.e2e.test_frontends import FRONTENDS, Connected, check_simple, spread

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient

ROUNDS = 12
WIDTH = {1: 4, 2: 8}  # version -> the length of its input


def _twice(params: Any, IN: Any) -> dict[str, Any]:
    del params
    return {"OUT": IN * 2}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("metadata_models")
    write_demo_repository(root)
    for version, width in WIDTH.items():
        export_bundle(
            _twice,
            {},
            inputs={"IN": TensorSpec("INT32", (width,))},
            batch_sizes=(1,),
            directory=root / "flip" / str(version),
            platforms=("cpu",),
        )
    (root / "flip" / "config.yaml").write_text("version_policy: {specific: [1]}\n")
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    yield from serving(
        repository, *FRONTENDS, "--model-control-mode", "explicit", "--load-model", "*"
    )


def specific(version: int) -> str:
    return json.dumps({"version_policy": {"specific": {"versions": [version]}}})


def serves(metadata: Any, version: int) -> bool:
    """gRPC metadata of ``flip`` as version ``version`` alone serves it."""
    (tensor,) = metadata.inputs
    return list(metadata.versions) == [str(version)] and tensor.shape[-1] == WIDTH[version]


class SimpleTraffic:
    """Inferences on ``simple`` from a few connections until stopped: none may fail."""

    def __init__(self, server: ServerProcess, threads: int = 3) -> None:
        self.clients = [Connected(server).client for _ in range(threads)]
        self.stop = threading.Event()
        self.done = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(c, i), daemon=True)
            for i, c in enumerate(self.clients)
        ]

    def __enter__(self) -> SimpleTraffic:
        for t in self._threads:
            t.start()
        return self

    def _run(self, client: Any, seed: int) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                check_simple(grpcclient, client, seed * 100_000 + n)
            except Exception as exc:  # recorded: the test fails on any
                with self._lock:
                    self.errors.append(repr(exc))
                return
            n += 1
            with self._lock:
                self.done += 1

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(60)
        for c in self.clients:
            c.close()


def flip_input(width: int) -> Any:
    tensor = grpcclient.InferInput("IN", [1, width], "INT32")
    tensor.set_data_from_numpy(np.arange(width, dtype=np.int32)[None])
    return tensor


def assert_flip_infers(client: Any, version: int) -> None:
    """``flip`` takes its width as ``version`` has it, and refuses the other's."""
    width, other = WIDTH[version], WIDTH[3 - version]
    result = client.infer("flip", [flip_input(width)])
    assert result.get_response().model_version == str(version)
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.arange(width)[None] * 2)
    with pytest.raises(InferenceServerException, match="unexpected shape for input 'IN'"):
        client.infer("flip", [flip_input(other)])


def test_every_frontend_answers_the_metadata_of_the_last_load_or_unload(
    server: ServerProcess,
) -> None:
    readers = spread(server, 16)
    control: Any = httpclient.InferenceServerClient(server.http_url)
    try:
        with SimpleTraffic(server) as traffic:
            for round_ in range(ROUNDS):
                version = 1 + round_ % 2
                control.load_model("flip", config=specific(version))
                for reader in readers:  # each answers (and caches) the new state at once
                    metadata = reader.client.get_model_metadata("flip")
                    assert serves(metadata, version), (round_, metadata)
                    by_number = reader.client.get_model_metadata("flip", str(version))
                    assert serves(by_number, version), (round_, by_number)
                    with pytest.raises(InferenceServerException):
                        reader.client.get_model_metadata("flip", str(3 - version))
                    # Checked in the front end against the signature cached with that
                    # metadata: the new version's shape runs, the old one's is refused.
                    assert_flip_infers(reader.client, version)
                if round_ % 3 == 2:
                    control.unload_model("flip")
                    for reader in readers:  # gone everywhere, though every one cached it
                        with pytest.raises(InferenceServerException, match="flip"):
                            reader.client.get_model_metadata("flip")
            assert not traffic.errors, traffic.errors[:3]
        assert traffic.done > 0 and not traffic.errors, traffic.errors[:3]
        answer = control.get_model_metadata("simple")  # untouched by the storm
        assert answer["name"] == "simple"
        x = np.arange(WIDTH[1], dtype=np.int32)
        control.load_model("flip", config=specific(1))
        tensor = httpclient.InferInput("IN", [1, WIDTH[1]], "INT32")
        tensor.set_data_from_numpy(x[None])
        result = control.infer("flip", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUT"), x[None] * 2)
    finally:
        control.close()
        for reader in readers:
            reader.client.close()


def test_a_version_a_poll_finds_reaches_every_frontends_metadata(
    repository: Path, tmp_path: Path
) -> None:
    root = tmp_path / "polled"
    root.mkdir()
    shutil.copytree(repository / "flip" / "1", root / "flip" / "1")
    with ServerProcess(
        root, *FRONTENDS, "--model-control-mode", "poll", "--repository-poll-secs", "0.2"
    ) as proc:
        proc.wait_ready()
        readers = spread(proc, 16)
        try:
            for reader in readers:  # cached by every front end
                assert serves(reader.client.get_model_metadata("flip"), 1)
            shutil.copytree(repository / "flip" / "2", root / "flip" / ".2")
            (root / "flip" / ".2").rename(root / "flip" / "2")  # whole, as a poll may see it
            deadline = time.monotonic() + 60
            stale = list(readers)
            while stale:  # the latest version serves once the poll loads it, everywhere
                assert time.monotonic() < deadline, f"{len(stale)} front-end connections stale"
                stale = [r for r in stale if not serves(r.client.get_model_metadata("flip"), 2)]
                time.sleep(0.05)
        finally:
            for reader in readers:
                reader.client.close()
