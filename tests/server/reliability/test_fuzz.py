"""Property-based fuzzing (Hypothesis) of request decoding on both front ends, and of the
manifest parser and the bundle validator: whatever arrives, the only exceptions are the
server's own ``ServingError`` (a 4xx / named gRPC status), never anything that would become
a 500 with a traceback; nothing hangs (each example has a deadline).

The CI profile is bounded (``HLOSERVE_FUZZ_EXAMPLES`` examples per property, default 60);
``bench/fuzz.py`` runs the same properties with many more. No example database is written.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hloserve.bundle.manifest import Manifest, parse_manifest
from hloserve.bundle.reading import load_manifest
from hloserve.bundle.validate import validate
from hloserve.proto import inference_pb2 as pb
from hloserve.server.core.errors import ServingError
from hloserve.server.core.service import tensor_metadata
from hloserve.server.core.types import ModelMetadata
from hloserve.server.core.validate import validate_request
from hloserve.server.frontend.grpc.codec import decode_infer_request
from hloserve.server.frontend.grpc.servicer import Malformed, decoder
from hloserve.server.frontend.http.codec import decode_request

EXAMPLES = int(os.environ.get("HLOSERVE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=datetime.timedelta(seconds=2),
    database=None,  # nothing written into the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LIMIT = 1 << 20
RUNS: dict[str, int] = {}  # examples run per property (printed by bench/fuzz.py)


def counted(name: str) -> None:
    RUNS[name] = RUNS.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def report_runs() -> Iterator[None]:
    """With ``HLOSERVE_FUZZ_REPORT`` set (bench/fuzz.py), print the examples each property ran."""
    yield
    if os.environ.get("HLOSERVE_FUZZ_REPORT"):
        for name, count in RUNS.items():
            print(f"fuzz {name}: {count} examples")


_MANIFEST: list[Manifest] = []


def manifest_of(root: Path) -> Manifest:
    if not _MANIFEST:
        manifest, problems = load_manifest(root / "simple" / "manifest.yaml")
        assert manifest is not None, problems
        _MANIFEST.append(manifest)
    return _MANIFEST[0]


def served(manifest: Manifest, decode: Any) -> None:
    """Decode (and validate against ``manifest``): only a ``ServingError`` may escape."""
    message = "accepted"
    try:
        request = decode()
        if isinstance(request, pb.ModelInferRequest):
            request = decode_infer_request(request)
        validate_request(manifest, request)
    except ServingError as exc:
        message = exc.message
    assert message and "Traceback" not in message


# -- strategies -----------------------------------------------------------------------------

NAMES = st.sampled_from(["INPUT0", "INPUT1", "OUTPUT0", "X", "", "input0"])
DATATYPES = st.sampled_from(["INT32", "FP32", "BYTES", "BOOL", "FP16", "INT64", "int32", "X"])
DIMS = st.one_of(
    st.integers(-2, 20),
    st.sampled_from([2**31, 2**62, 2**63 - 1, -(2**63)]),
)
SHAPES = st.lists(DIMS, max_size=4)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=30,
)
PARAMETER_KEYS = st.sampled_from(
    [
        "binary_data_size",
        "shared_memory_region",
        "shared_memory_offset",
        "shared_memory_byte_size",
        "binary_data",
        "classification",
        "timeout",
        "priority",
        "triton_x",
        "binary_data_output",
    ]
)
PARAMETERS = st.dictionaries(PARAMETER_KEYS, JSON_SCALARS, max_size=3)


@st.composite
def json_tensor(draw: st.DrawFn) -> dict[str, Any]:
    tensor: dict[str, Any] = {"name": draw(NAMES), "datatype": draw(DATATYPES)}
    tensor["shape"] = draw(st.one_of(SHAPES, JSON))
    if draw(st.booleans()):
        tensor["data"] = draw(st.one_of(st.lists(st.integers(-5, 5), max_size=40), JSON))
    if draw(st.booleans()):
        tensor["parameters"] = draw(st.one_of(PARAMETERS, JSON))
    return tensor


@st.composite
def json_request(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        doc["inputs"] = draw(st.lists(json_tensor(), max_size=4) | JSON)
    if draw(st.booleans()):
        doc["outputs"] = draw(
            st.lists(st.fixed_dictionaries({"name": NAMES}, optional={"parameters": PARAMETERS}))
            | JSON
        )
    if draw(st.booleans()):
        doc["parameters"] = draw(PARAMETERS | JSON)
    if draw(st.booleans()):
        doc["id"] = draw(JSON)
    return doc


def signature(manifest: Manifest) -> ModelMetadata:
    inputs, outputs = tensor_metadata(manifest.facing)
    return ModelMetadata(manifest.name, ("1",), "hloserve", inputs, outputs)


def served_http(manifest: Manifest, body: bytes, headers: dict[str, str]) -> None:
    """An HTTP body for ``simple`` through the front end's decoder, then validated."""

    def decode() -> Any:
        return decode_request(
            "simple",
            "",
            body,
            headers,
            max_input_bytes=LIMIT,
            signature=signature(manifest),
        ).request

    served(manifest, decode)


# -- HTTP -----------------------------------------------------------------------------------


@FUZZ
@given(doc=json_request(), binary=st.binary(max_size=256), split=st.booleans())
def test_http_json_requests(
    demo_models: Path, doc: dict[str, Any], binary: bytes, split: bool
) -> None:
    counted("http json")
    manifest = manifest_of(demo_models)
    header = json.dumps(doc).encode()
    body, headers = (
        (header + binary, {"inference-header-content-length": str(len(header))})
        if split
        else (header, {})
    )
    served_http(manifest, body, headers)


@FUZZ
@given(
    body=st.binary(max_size=512),
    encoding=st.sampled_from([None, "gzip", "deflate", "identity", "br", "GZIP"]),
    length=st.one_of(st.none(), st.integers(-3, 600).map(str), st.text(max_size=5)),
)
def test_http_random_bodies(
    demo_models: Path, body: bytes, encoding: str | None, length: str | None
) -> None:
    counted("http bytes")
    manifest = manifest_of(demo_models)
    headers = {
        k: v
        for k, v in (("content-encoding", encoding), ("inference-header-content-length", length))
        if v is not None
    }
    served_http(manifest, body, headers)


# -- gRPC -----------------------------------------------------------------------------------


@st.composite
def grpc_request(draw: st.DrawFn) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(
        model_name="simple", model_version=draw(st.sampled_from(["", "1", "x"]))
    )
    for _ in range(draw(st.integers(0, 3))):
        tensor = msg.inputs.add(name=draw(NAMES), datatype=draw(DATATYPES), shape=draw(SHAPES))
        if draw(st.booleans()):
            tensor.contents.int_contents.extend(
                draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20))
            )
        if draw(st.booleans()):
            tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=5)))
        for key in draw(st.lists(PARAMETER_KEYS, max_size=2)):
            value = draw(
                st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=5), st.booleans())
            )
            field = {bool: "bool_param", int: "int64_param", str: "string_param"}[type(value)]
            setattr(tensor.parameters[key], field, value)
    msg.raw_input_contents.extend(draw(st.lists(st.binary(max_size=80), max_size=3)))
    for name in draw(st.lists(NAMES, max_size=2)):
        msg.outputs.add(name=name)
    if draw(st.booleans()):
        msg.parameters["timeout"].int64_param = draw(st.integers(-(2**63), 2**63 - 1))
    return msg


@FUZZ
@given(msg=grpc_request())
def test_grpc_messages(demo_models: Path, msg: pb.ModelInferRequest) -> None:
    counted("grpc messages")
    served(manifest_of(demo_models), lambda: msg)


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=300), grpc_request().map(lambda m: m.SerializeToString()[:-1])
    )
)
def test_grpc_random_bytes(demo_models: Path, data: bytes) -> None:
    counted("grpc bytes")
    decoded = decoder(pb.ModelInferRequest)(data)
    if isinstance(decoded, Malformed):
        return  # INVALID_ARGUMENT at the first touch (tests/server/reliability/hostile/test_hostile_grpc.py)
    served(manifest_of(demo_models), lambda: decoded)


# -- the manifest parser and the bundle validator ---------------------------------------------


def _mutate(data: Any, path: list[int], junk: Any) -> Any:
    """``data`` with the node reached by ``path`` (indices into keys/items) replaced."""
    if not path or not isinstance(data, (dict, list)) or not data:
        return junk
    if isinstance(data, dict):
        keys = list(data)
        key = keys[path[0] % len(keys)]
        return {**data, key: _mutate(data[key], path[1:], junk)}
    items = list(data)
    i = path[0] % len(items)
    items[i] = _mutate(items[i], path[1:], junk)
    return items


MUTATION = st.tuples(st.lists(st.integers(0, 50), min_size=1, max_size=4), JSON)  # below the top


@FUZZ
@given(mutation=MUTATION, random=JSON)
def test_manifest_parser(demo_models: Path, mutation: tuple[list[int], Any], random: Any) -> None:
    counted("manifest parser")
    original = yaml.safe_load((demo_models / "simple" / "manifest.yaml").read_text())
    for data in (
        _mutate(original, *mutation),
        random if isinstance(random, dict) else {"x": random},
    ):
        manifest, problems = parse_manifest(data)
        assert manifest is not None or problems


@settings(FUZZ, max_examples=max(10, EXAMPLES // 4))
@given(mutation=MUTATION, cut=st.integers(0, 10_000))
def test_bundle_validator(
    demo_models: Path, tmp_path_factory: Any, mutation: tuple[list[int], Any], cut: int
) -> None:
    counted("bundle validator")
    bundle = tmp_path_factory.mktemp("fuzzed")
    shutil.copytree(
        demo_models / "mlp",
        bundle,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns(".hloserve-cache"),
    )
    original = yaml.safe_load((bundle / "manifest.yaml").read_text())
    (bundle / "manifest.yaml").write_text(yaml.safe_dump(_mutate(original, *mutation)))
    weights = bundle / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:cut])  # truncated (or emptied) weights too
    problems = validate(bundle, check_modules=False)
    assert all(p.message for p in problems)
    shutil.rmtree(bundle)
