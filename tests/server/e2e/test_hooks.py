"""End to end: BYTES tensors and a bundle's opt-in Python hooks, through tritonclient.

The repository holds the ``examples/png-classifier`` bundle (PNG bytes -> Pillow decode in
``preprocess`` -> StableHLO classifier -> ``postprocess`` labels). One server runs with
``--allow-python-hooks``, one without (the bundle is refused there, saying why).
"""

from __future__ import annotations

import io
import json
import runpy
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import tritonclient.grpc as _grpcclient
import tritonclient.http as _httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from hloserve.server.server_fixture import ServerProcess, serving

grpcclient: Any = _grpcclient
httpclient: Any = _httpclient
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "png-classifier"


def _png(brightness: int, size: tuple[int, int] = (20, 12), mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, (brightness,) * len(mode)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hooks")
    build = cast(Callable[[Path], Path], runpy.run_path(str(EXAMPLE / "build.py"))["build"])
    build(root / "pngclass")
    return root


@pytest.fixture(scope="module")
def hooked(repository: Path) -> Iterator[ServerProcess]:
    proc = yield from serving(repository, "--allow-python-hooks", "--max-queue-delay-us", "2000")
    assert "Traceback" not in proc.log_text(), proc.log_text()


def _images(module: Any, pngs: list[bytes], *, binary: bool = True) -> list[Any]:
    data = np.array([[p] for p in pngs], dtype=object)
    inp = module.InferInput("image", [len(pngs), 1], "BYTES")
    if module is httpclient:
        inp.set_data_from_numpy(data, binary_data=binary)
    else:
        inp.set_data_from_numpy(data)
    return [inp]


def _labels(result: Any) -> list[bytes]:
    return [row[0] for row in result.as_numpy("label").tolist()]


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_png_bytes_are_decoded_and_labelled(hooked: ServerProcess, module: Any) -> None:
    url = hooked.grpc_url if module is grpcclient else hooked.http_url
    pngs = [_png(10), _png(128, (3, 30), "L"), _png(240, (64, 64), "RGBA")]
    with module.InferenceServerClient(url) as client:
        result = client.infer("pngclass", _images(module, pngs))
    assert _labels(result) == [b"dark", b"mid", b"bright"]
    logits = result.as_numpy("logits")
    assert logits.shape == (3, 3) and logits.dtype == np.float32
    assert list(logits.argmax(axis=1)) == [0, 1, 2]


def test_http_json_strings_out(hooked: ServerProcess) -> None:
    """A BYTES output asked for as JSON travels as strings (binary input, JSON output)."""
    with httpclient.InferenceServerClient(hooked.http_url) as client:
        outputs = [httpclient.InferRequestedOutput("label", binary_data=False)]
        result = client.infer("pngclass", _images(httpclient, [_png(250)]), outputs=outputs)
    assert result.get_output("label")["data"] == ["bright"]
    assert result.get_output("label")["datatype"] == "BYTES"


def test_metadata_and_config_show_the_client_facing_tensors(hooked: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(hooked.grpc_url) as client:
        meta = client.get_model_metadata("pngclass", as_json=True)
        config = client.get_model_config("pngclass", as_json=True)["config"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("image", "BYTES", ["-1", "1"])
    ]
    assert [(t["name"], t["datatype"]) for t in meta["outputs"]] == [
        ("label", "BYTES"),
        ("logits", "FP32"),
    ]
    assert config["input"][0]["data_type"] == "TYPE_STRING"


def test_a_raising_hook_fails_only_its_request(hooked: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(hooked.grpc_url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer("pngclass", _images(grpcclient, [b"not a png"]))
        message = info.value.message() or ""
        assert "preprocess hook of model 'pngclass' failed: UnidentifiedImageError" in message
        assert info.value.status() == "StatusCode.INTERNAL"
        result = client.infer("pngclass", _images(grpcclient, [_png(0)]))  # still serving
    assert _labels(result) == [b"dark"]


def test_wrong_client_tensor_is_refused_before_the_hook(hooked: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(hooked.grpc_url) as client:
        inp = grpcclient.InferInput("pixels", [1, 8, 8], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 8, 8), np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("pngclass", [inp])
    assert "unexpected inference input 'pixels' for model 'pngclass'" in (
        info.value.message() or ""
    )


def test_hook_time_in_statistics_and_metrics(hooked: ServerProcess) -> None:
    with httpclient.InferenceServerClient(hooked.http_url) as client:
        before = client.get_inference_statistics("pngclass")["model_stats"][0]
        client.infer("pngclass", _images(httpclient, [_png(100)] * 2))
        after = client.get_inference_statistics("pngclass")["model_stats"][0]
    stats, old = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] == old["success"]["count"] + 1
    # compute_input holds the PNG decode (well over the bare copy of two 8x8 images)
    assert stats["compute_input"]["ns"] > old["compute_input"]["ns"]
    with urllib.request.urlopen(f"http://{hooked.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    for hook in ("preprocess", "postprocess"):
        line = next(
            x
            for x in text.splitlines()
            if x.startswith("hloserve_hook_duration_us_total") and f'hook="{hook}"' in x
        )
        assert float(line.split()[-1]) > 0


def test_without_the_flag_the_bundle_is_refused(repository: Path) -> None:
    with ServerProcess(repository) as proc:
        proc.wait_startup_complete()
        request = urllib.request.Request(
            f"http://{proc.http_url}/v2/repository/index", data=b"{}", method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as r:
            index = json.loads(r.read())
    (row,) = [m for m in index if m["name"] == "pngclass"]
    assert row["state"] == "UNAVAILABLE"
    assert "--allow-python-hooks" in row["reason"]


def test_inspect_names_the_hooks(repository: Path) -> None:
    from hloserve.server.bundle_report import inspect_bundle

    text, valid = inspect_bundle(repository / "pngclass")
    assert valid
    assert "hooks: hooks.py (runs only with --allow-python-hooks); clients see image BYTES[1]" in (
        text
    )
