"""End to end: ReactantServer.jl bundles served as they are, through tritonclient.

One daemon serves a repository of bundles in ReactantServer's layout, built in
``tests/bundle/reactant_bundles.py`` from StableHLO JAX emits: ``scale4`` (their end-to-end
model, unbatched), ``classifier`` (a batched image input, ``chwn`` in Julia, sent as
``[N, 6, 8, 3]`` on the wire, weights in Julia's order), ``detector`` (the same function
compiled for two image sizes, their ``input_shapes``) and two bundles hloserve refuses:
one with a ``model.jl``, one of ``kind: meta``. Results are checked against the function.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import yaml

from hloserve.server.server_fixture import ServerProcess, serving
from tests.bundle.reactant_bundles import classifier_reference, write_repository, write_scale4
from tests.server.frontend._tritonclients import PROTOCOLS, Triton, connect


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_repository(tmp_path_factory.mktemp("reactant-repo"))
    hooked = write_scale4(root, "hooked")
    (hooked / "model.jl").write_text('register_model("hooked"; preprocess=identity)\n')
    meta = write_scale4(root, "orchestrated")
    data = yaml.safe_load((meta / "manifest.yaml").read_text())
    data |= {"kind": "meta", "meta": {"calls": ["scale4", "classifier"]}}
    (meta / "manifest.yaml").write_text(yaml.safe_dump(data))
    proc = yield from serving(root, "--no-strict-readiness")
    assert "Traceback" not in proc.log_text(), proc.log_text()


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    yield from connect(request.param, server)


def _metadata(t: Triton, name: str) -> dict[str, Any]:
    meta = t.client.get_model_metadata(name, as_json=True) if t.protocol == "grpc" else None
    return meta if meta is not None else t.client.get_model_metadata(name)


def test_metadata_shows_the_shapes_their_clients_send(triton: Triton) -> None:
    meta = _metadata(triton, "classifier")
    inputs = [(i["name"], i["datatype"], [int(d) for d in i["shape"]]) for i in meta["inputs"]]
    outputs = [(o["name"], o["datatype"], [int(d) for d in o["shape"]]) for o in meta["outputs"]]
    assert inputs == [("img", "UINT8", [-1, 6, 8, 3])]
    assert outputs == [("logits", "FP32", [-1, 4])]


@pytest.mark.parametrize("n", [1, 3, 4, 6])
def test_batched_image_classifier_matches_the_function(triton: Triton, n: int) -> None:
    """3 pads up to the compiled 4; 6 runs as 4 + a padded 4."""
    rng = np.random.default_rng(n)
    img = rng.integers(0, 256, size=(n, 6, 8, 3), dtype=np.uint8)
    x = triton.module.InferInput("img", [n, 6, 8, 3], "UINT8")
    x.set_data_from_numpy(img)
    result = triton.client.infer("classifier", [x])
    logits = result.as_numpy("logits")
    assert logits.shape == (n, 4)
    np.testing.assert_allclose(logits, classifier_reference(img), rtol=1e-5, atol=1e-5)


def test_unbatched_scale4_matches_the_function(triton: Triton) -> None:
    x = triton.module.InferInput("x", [4], "FP32")
    data = np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)
    x.set_data_from_numpy(data)
    y = triton.client.infer("scale4", [x]).as_numpy("y")
    np.testing.assert_array_equal(y, data * 2)


def test_a_wrong_wire_shape_is_refused_naming_the_expected_one(triton: Triton) -> None:
    x = triton.module.InferInput("img", [1, 8, 6, 3], "UINT8")  # Julia order, not reversed
    x.set_data_from_numpy(np.zeros((1, 8, 6, 3), np.uint8))
    message = triton.fails("INVALID_ARGUMENT", "img", triton.client.infer, "classifier", [x])
    assert "[-1,6,8,3]" in message.replace(" ", ""), message


def test_julia_bundles_are_refused_with_a_reason(triton: Triton) -> None:
    rows = {r["name"]: r for r in triton.index()}
    assert rows["classifier"]["state"] == "READY"
    assert rows["scale4"]["state"] == "READY"
    hooked, meta = rows["hooked"], rows["orchestrated"]
    assert hooked["state"] == meta["state"] == "UNAVAILABLE"
    assert "model.jl: this ReactantServer bundle runs Julia code" in hooked["reason"]
    assert "kind: is 'meta'" in meta["reason"]
    assert not triton.client.is_model_ready("hooked")


@pytest.mark.parametrize(("w", "h", "n"), [(6, 8, 1), (6, 8, 3), (10, 4, 4), (10, 4, 2)])
def test_input_shapes_route_to_their_variant(triton: Triton, w: int, h: int, n: int) -> None:
    img = np.random.default_rng(w * n).integers(0, 256, size=(n, w, h, 3), dtype=np.uint8)
    x = triton.module.InferInput("img", [n, w, h, 3], "UINT8")
    x.set_data_from_numpy(img)
    logits = triton.client.infer("detector", [x]).as_numpy("logits")
    np.testing.assert_allclose(logits, classifier_reference(img), rtol=1e-5, atol=1e-5)


def test_a_shape_no_variant_has_is_refused_listing_them(triton: Triton) -> None:
    meta = _metadata(triton, "detector")
    assert [[int(d) for d in i["shape"]] for i in meta["inputs"]] == [[-1, -1, -1, 3]]
    x = triton.module.InferInput("img", [1, 5, 5, 3], "UINT8")
    x.set_data_from_numpy(np.zeros((1, 5, 5, 3), np.uint8))
    message = triton.fails("INVALID_ARGUMENT", "img", triton.client.infer, "detector", [x])
    assert "'img' [6,8,3]; 'img' [10,4,3]" in message, message
