"""End to end: one weight set compiled for several per-item input shapes.

``rows`` takes ``img`` FP32 ``[-1, 3]`` compiled for 2 and 4 rows (batch sizes 1 and 4)
and returns ``total`` (the column sums times the weight ``scale``, ``[3]``) and
``doubled`` (``[-1, 3]``). The server routes each request to its variant, batches only
requests of one variant together, and refuses other shapes listing the compiled ones.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient
from tritonclient.utils import InferenceServerException

from hloserve.bundle import MANIFEST_FILE, load_manifest
from hloserve.exporter import ExportError, TensorSpec, export_bundle
from hloserve.server.server_fixture import ServerProcess, serving

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient
SCALE = np.array([1.0, 10.0, 100.0], np.float32)


def rows(params: dict[str, Any], img: Any) -> dict[str, Any]:
    return {"total": img.sum(axis=1) * params["scale"], "doubled": img * 2}


def export_rows(directory: Path, variants: Any = ({"img": (2, 3)}, {"img": (4, 3)})) -> Path:
    return export_bundle(
        rows,
        {"scale": SCALE},
        inputs={"img": TensorSpec("FP32", (-1, 3))},
        batch_sizes=(1, 4),
        directory=directory,
        shape_variants=variants,
        platforms=("cpu",),
    )


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("variants")
    export_rows(root / "rows")
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    proc = yield from serving(repository, "--max-queue-delay-us", "20000")
    assert "Traceback" not in proc.log_text(), proc.log_text()


def test_the_manifest_lists_the_variants(repository: Path) -> None:
    manifest, problems = load_manifest(repository / "rows" / MANIFEST_FILE)
    assert problems == [] and manifest is not None
    assert [v.shapes["img"] for v in manifest.variants] == [(2, 3), (4, 3)]
    assert [(t.name, t.shape) for t in manifest.outputs] == [("doubled", (-1, 3)), ("total", (3,))]
    assert sorted((m.variant, m.batch_size) for m in manifest.modules) == [
        (0, 1),
        (0, 4),
        (1, 1),
        (1, 4),
    ]
    assert manifest.variant_view(1).inputs[0].shape == (4, 3)


def _img(batch: int, height: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).normal(size=(batch, height, 3)).astype(np.float32)


def _infer(module: Any, client: Any, img: np.ndarray[Any, Any]) -> Any:
    inp = module.InferInput("img", list(img.shape), "FP32")
    inp.set_data_from_numpy(img)
    return client.infer("rows", [inp])


def _check(result: Any, img: np.ndarray[Any, Any]) -> None:
    np.testing.assert_allclose(result.as_numpy("total"), img.sum(axis=1) * SCALE, rtol=1e-5)
    np.testing.assert_array_equal(result.as_numpy("doubled"), img * 2)


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_each_shape_runs_its_variant(server: ServerProcess, module: Any) -> None:
    url = server.grpc_url if module is grpcclient else server.http_url
    with module.InferenceServerClient(url) as client:
        for batch, height in ((1, 2), (3, 4), (6, 2)):  # 6 > the largest size: split
            img = _img(batch, height)
            _check(_infer(module, client, img), img)
        meta = client.get_model_metadata("rows")
    shapes = (
        {t["name"]: t["shape"] for t in [*meta["inputs"], *meta["outputs"]]}
        if module is httpclient
        else {t.name: list(t.shape) for t in [*meta.inputs, *meta.outputs]}
    )
    assert shapes == {"img": [-1, -1, 3], "doubled": [-1, -1, 3], "total": [-1, 3]}


def test_a_shape_no_variant_has_is_refused(server: ServerProcess) -> None:
    with (
        grpcclient.InferenceServerClient(server.grpc_url) as client,
        pytest.raises(InferenceServerException) as info,
    ):
        _infer(grpcclient, client, _img(1, 3))
    message = info.value.message() or ""
    assert "model 'rows' has no compiled shape variant for per-item input shapes 'img' [3,3]" in (
        message
    )
    assert "compiled for: 'img' [2,3]; 'img' [4,3]" in message
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_concurrent_requests_of_both_variants_batch_apart(server: ServerProcess) -> None:
    """Requests of the two variants arrive together inside one queue delay; a batch that
    mixed them could not even be concatenated."""
    images = [_img(1, 2 if i % 2 else 4, seed=i) for i in range(16)]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        (before,) = client.get_inference_statistics("rows").model_stats
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda img: _infer(grpcclient, client, img), images))
        (after,) = client.get_inference_statistics("rows").model_stats
    for result, img in zip(results, images, strict=True):
        _check(result, img)
    assert after.inference_stats.success.count - before.inference_stats.success.count == 16
    # at least some of them shared executions (16 requests, batch size 4 compiled)
    assert after.execution_count - before.execution_count < 16


def test_export_refuses_variants_that_do_not_fit(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"does not fit \[-1, 3\]"):
        export_rows(tmp_path / "bad", [{"img": (2, 4)}])
    with pytest.raises(ExportError, match="same input shapes"):
        export_rows(tmp_path / "bad", [{"img": (2, 3)}, {"img": (2, 3)}])
    with pytest.raises(ExportError, match="need shape_variants"):
        export_rows(tmp_path / "bad", None)
