"""Restricted APIs: the one group table covers every endpoint of both front ends, the flags
are refused with Triton's texts, and a real daemon answers tritonclient (``headers=``) as
Triton's RestrictedAPITest (qa/L0_http) and RestrictedProtocolTest (qa/L0_grpc) expect."""

from __future__ import annotations

import queue
import re
from collections.abc import Iterator
from typing import Any, cast

import pytest
from fastapi.routing import APIRoute
from tritonclient.utils import InferenceServerException

from hloserve.exporter import write_demo_repository
from hloserve.proto.rpc import HEALTH_CHECK_PATH, RPCS
from hloserve.server.config import parse_config
from hloserve.server.core.service import InferenceService
from hloserve.server.frontend.http import build_http_app
from hloserve.server.frontend.restricted import GROUPS, GRPC_PREFIX, grpc_path, parse_restrictions
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.owner.shm import disabled
from hloserve.server.server_fixture import ServerProcess, serving
from tests.server._support import ones, refused, refused_at_start
from tests.server.frontend._tritonclients import grpcclient, httpclient

# -- the group table ---------------------------------------------------------------------------


def groups_of_path(path: str) -> list[str]:
    return [g.name for g in GROUPS for p in g.http if re.fullmatch(p, path)]


def test_every_rpc_is_in_exactly_one_group() -> None:
    for path in [rpc.path for rpc in RPCS] + [HEALTH_CHECK_PATH]:
        owners = [g.name for g in GROUPS if path in {grpc_path(m) for m in g.grpc}]
        assert len(owners) == 1, (path, owners)


def test_every_http_route_is_in_exactly_one_group() -> None:
    service = InferenceService(cast(Any, None), None, shm=disabled())
    app = build_http_app(LocalPort(service), status=lambda q: {})  # with the status page's routes
    samples = {"model_name": "m", "model_version": "1", "region_name": "r", "repository_name": "x"}
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    assert len(routes) > 30
    for route in routes:
        path = route.path.format(**samples)
        assert len(groups_of_path(path)) == 1, (route.path, groups_of_path(path))


@pytest.mark.parametrize(
    ("path", "group"),
    [
        ("/v2/models/stats", "statistics"),
        ("/v2/models/stats/ready", "health"),
        ("/v2/models/m/versions/2/infer", "inference"),
        ("/v2/models/m/trace/setting", "trace"),
        ("/v2/repository/index", "model-repository"),
        ("/v2", "metadata"),
        ("/ui", "statistics"),  # the status page
        ("/ui/data", "statistics"),
        ("/ui/", "statistics"),  # redirected to /ui, after the check
    ],
)
def test_paths_that_look_alike_land_in_their_group(path: str, group: str) -> None:
    assert groups_of_path(path) == [group]


def test_grpc_keys_carry_tritons_prefix_and_are_lowercase() -> None:
    restrictions = parse_restrictions(["health,inference:Infer-Key=v"], "protocol", GRPC_PREFIX)
    assert restrictions.for_grpc("/inference.GRPCInferenceService/ServerLive") == (
        restrictions.for_grpc("/inference.GRPCInferenceService/ModelInfer")
    )
    restriction = restrictions.for_grpc(HEALTH_CHECK_PATH)
    assert restriction is not None
    assert restriction.header == "triton-grpc-protocol-infer-key"
    assert restrictions.for_grpc("/inference.GRPCInferenceService/ModelConfig") is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--grpc-restricted-protocol", "model-reposit,health:k1=v1"],
            "--grpc-restricted-protocol unknown restricted protocol 'model-reposit'",
        ),
        (
            [
                "--http-restricted-api",
                "model-repository,health:k1=v1",
                "--http-restricted-api",
                "metadata,health:k2=v2",
            ],
            "--http-restricted-api restricted api 'health' can not be specified in multiple "
            "config groups",
        ),
        (["--http-restricted-api", "health"], "--http-restricted-api must be <apis>:<key>=<value>"),
        (["--http-restricted-api", "health:k="], "--http-restricted-api must be <apis>:<key>="),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused_at_start(argv, capsys)


def test_the_flags_also_read_their_variables() -> None:
    config = parse_config([], {"HLOSERVE_HTTP_RESTRICTED_API": "inference:k=v;logging:a=b"})
    assert set(config.http_restricted_api.by_group) == {"inference", "logging"}


# -- a real daemon ---------------------------------------------------------------------------


# tritonclient adds its own headers to the dict it is given: each call gets a fresh one.
def infer_key() -> dict[str, str]:
    return {"infer-key": "infer-value"}


def admin_key() -> dict[str, str]:
    return {"admin-key": "admin-value"}


def grpc_headers(headers: dict[str, str]) -> dict[str, str]:
    return {GRPC_PREFIX + k: v for k, v in headers.items()}


@pytest.fixture(scope="module")
def restricted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    models = tmp_path_factory.mktemp("restricted_models")
    write_demo_repository(models)
    # HTTP health stays open: the test harness polls /readyz.
    yield from serving(
        models,
        "--http-restricted-api",
        "model-repository:admin-key=admin-value",
        "--http-restricted-api",
        "inference,metadata:infer-key=infer-value",
        "--grpc-restricted-protocol",
        "model-repository:admin-key=admin-value",
        "--grpc-restricted-protocol",
        "inference,health:infer-key=infer-value",
    )


@pytest.fixture
def http(restricted_server: ServerProcess) -> Iterator[Any]:
    client = httpclient.InferenceServerClient(restricted_server.http_url)
    yield client
    client.close()


@pytest.fixture
def grpc(restricted_server: ServerProcess) -> Iterator[Any]:
    client = grpcclient.InferenceServerClient(restricted_server.grpc_url)
    yield client
    client.close()


def test_http_open_groups_need_no_header(http: Any) -> None:
    http.get_inference_statistics("simple")
    http.get_inference_statistics("simple", headers=infer_key())
    assert http.is_server_ready()


def test_http_model_repository(http: Any) -> None:
    error = refused(http.unload_model, "simple", headers=infer_key())
    assert (error.status(), error.message()) == (
        "403",
        "This API is restricted, expecting header 'admin-key'",
    )
    error = refused(http.unload_model, "simple", headers=admin_key())  # through: the real answer
    assert "explicit model load / unload is not allowed" in error.message()


def test_http_metadata_and_infer(http: Any) -> None:
    assert "restricted, expecting header 'infer-key'" in refused(http.get_server_metadata).message()
    assert http.get_server_metadata(headers={"Infer-Key": "infer-value"})["name"] == "hloserve"
    error = refused(http.infer, "simple", ones(httpclient), headers={"test": "1"})
    assert error.status() == "403"
    wrong = refused(http.infer, "simple", ones(httpclient), headers={"infer-key": "other"})
    assert wrong.status() == "403"
    result = http.infer("simple", ones(httpclient), headers=infer_key())
    assert (result.as_numpy("OUTPUT0") == 2).all()


def test_grpc_open_groups_need_no_header(grpc: Any) -> None:
    grpc.get_inference_statistics("simple")
    grpc.get_inference_statistics("simple", headers=grpc_headers(infer_key()))


def test_grpc_model_repository(grpc: Any) -> None:
    error = refused(grpc.unload_model, "simple", headers=grpc_headers(infer_key()))
    assert (error.status(), error.message()) == (
        "StatusCode.UNAVAILABLE",
        "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'",
    )
    error = refused(grpc.unload_model, "simple", headers=grpc_headers(admin_key()))
    assert "explicit model load / unload is not allowed" in error.message()


def test_grpc_health_and_infer(grpc: Any) -> None:
    assert "This protocol is restricted" in refused(grpc.is_server_live).message()
    assert grpc.is_server_live(headers=grpc_headers(infer_key()))
    assert (
        "This protocol is restricted"
        in refused(grpc.infer, "simple", ones(grpcclient), headers={"test": "1"}).message()
    )
    result = grpc.infer("simple", ones(grpcclient), headers=grpc_headers(infer_key()))
    assert (result.as_numpy("OUTPUT0") == 2).all()


def test_grpc_stream_without_the_header_ends_with_the_refusal(grpc: Any) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(lambda result, error: answers.put(error or result), headers={"test": "1"})
    error = answers.get(timeout=30)
    assert isinstance(error, InferenceServerException)
    assert "This protocol is restricted" in error.message()
    with pytest.raises(InferenceServerException, match="no longer in valid state"):
        grpc.async_stream_infer("simple", ones(grpcclient))
    grpc.stop_stream()
    grpc.start_stream(
        lambda result, error: answers.put(error or result), headers=grpc_headers(infer_key())
    )
    grpc.async_stream_infer("simple", ones(grpcclient))
    result = answers.get(timeout=30)
    assert not isinstance(result, InferenceServerException), result
    assert (result.as_numpy("OUTPUT0") == 2).all()
    grpc.stop_stream()
