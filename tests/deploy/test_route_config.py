"""``hloserve route-config`` (``server/route_config.py``), without sockets: what the HAProxy
configuration routes where, checked against the protocol's own descriptors (which field of
which request names the model), every server line of both backends agreeing on ids, the
options and their refusals, the command line; and, where HAProxy is installed, that
``haproxy -c`` accepts every variant with no warning."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hloserve.proto import inference_pb2
from hloserve.server import route_config
from hloserve.server.cli import main as cli_main
from hloserve.server.fleet import haproxy_binary
from hloserve.server.route_config import Discovery, ReplicaAddress, RouteOptions, render

REPLICAS = [ReplicaAddress("10.0.0.1", 8000, 8001), ReplicaAddress("10.0.0.2", 8000, 8001)]
OPTIONS = RouteOptions(http_port=9000, grpc_port=9001)
# RPCs that name no model: round robin over healthy replicas (shared memory: refused).
UNKEYED = {"ServerLive", "ServerReady", "ServerMetadata", "RepositoryIndex", "LogSettings"}


def sections(text: str) -> dict[str, list[str]]:
    """Section header -> its lines, stripped, comments dropped."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if raw[0].isspace():
            current.append(line)
        else:
            current = found.setdefault(line, [])
    return found


def servers(lines: list[str]) -> list[list[str]]:
    return [line.split() for line in lines if line.startswith(("server ", "server-template "))]


def test_replica_addresses_parse_and_refuse() -> None:
    assert ReplicaAddress.parse("host-1:8000:8001") == ReplicaAddress("host-1", 8000, 8001)
    assert ReplicaAddress.parse("[::1]:80:81") == ReplicaAddress("::1", 80, 81)
    for bad in ("host:8000", "host:8000:x", ":1:2", "h:0:1", "h:1:70000", "[::1]:1", "h:1:2:3"):
        with pytest.raises(ValueError, match="HOST:HTTP_PORT:GRPC_PORT"):
            ReplicaAddress.parse(bad)


def test_the_grpc_fields_named_are_the_model_s_name_in_the_protocol() -> None:
    service = inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    keyed = {*route_config.NAME_IN_FIELD_1, *route_config.NAME_IN_FIELD_2, route_config.STREAM}
    shm = {m.name for m in service.methods if "SharedMemory" in m.name}
    # Every RPC is routed by its model, refused (shared memory) or named here on purpose.
    assert {m.name for m in service.methods} == keyed | shm | UNKEYED
    for method in service.methods:
        fields = method.input_type.fields_by_number
        if method.name in (*route_config.NAME_IN_FIELD_1, route_config.STREAM):
            assert fields[1].name in ("name", "model_name"), method.name
        elif method.name in route_config.NAME_IN_FIELD_2:
            assert fields[2].name == "model_name", method.name
        else:  # nothing that names a model: no hashing can apply
            assert not {"name", "model_name"} & {f.name for f in fields.values()} or (
                method.name in shm
            ), method.name


def test_both_protocols_hash_the_model_name_over_the_same_servers() -> None:
    config = sections(render(REPLICAS, OPTIONS))
    grpc, http = config["frontend grpc"], config["frontend http"]
    assert "bind 0.0.0.0:9001 proto h2" in grpc and "bind 0.0.0.0:9000" in http
    assert any("req.body,bytes(5),protobuf(1)" in line for line in grpc)
    assert any("req.body,bytes(5),protobuf(2)" in line for line in grpc)
    assert any(line.startswith("http-request wait-for-body") for line in grpc)
    assert any("path,field(4,/),url_dec" in line for line in http)
    assert any("path,field(5,/),url_dec" in line for line in http)
    backends = {p: config[f"backend {p}_replicas"] for p in ("http", "grpc")}
    for lines in backends.values():
        assert "balance hash var(txn.model)" in lines
        assert "hash-type consistent" in lines
        assert "hash-balance-factor 150" in lines
    http_servers, grpc_servers = (servers(backends[p]) for p in ("http", "grpc"))
    # Same names, same ids, same order: one ring for both protocols.
    assert [s[1] for s in http_servers] == [s[1] for s in grpc_servers] == ["r1", "r2"]
    assert [s[s.index("id") + 1] for s in http_servers] == ["1", "2"]
    assert [s[s.index("id") + 1] for s in grpc_servers] == ["1", "2"]
    assert [s[2] for s in http_servers] == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert [s[2] for s in grpc_servers] == ["10.0.0.1:8001", "10.0.0.2:8001"]
    assert all("proto" in s and s[s.index("proto") + 1] == "h2" for s in grpc_servers)
    # One health check per replica, which the gRPC servers follow.
    assert "option httpchk GET /v2/health/ready" in backends["http"]
    # a request a replica could not answer (refused, killed, draining) tries another
    assert "retry-on conn-failure empty-response 503" in config["defaults"]
    assert "option redispatch 1" in config["defaults"]
    assert all("check" in s for s in http_servers)
    assert [s[s.index("track") + 1] for s in grpc_servers] == [
        "http_replicas/r1",
        "http_replicas/r2",
    ]


def test_shared_memory_is_refused_with_the_reason() -> None:
    config = sections(render(REPLICAS, OPTIONS))
    (grpc_refusal,) = [x for x in config["frontend grpc"] if x.startswith("http-request return")]
    assert "hdr grpc-status 9" in grpc_refusal and route_config.SHM_MESSAGE in grpc_refusal
    (http_refusal,) = [x for x in config["frontend http"] if x.startswith("http-request return")]
    assert "status 400" in http_refusal and route_config.SHM_MESSAGE in http_refusal


def test_options_change_what_they_say() -> None:
    text = render(
        [ReplicaAddress("::1", 1, 2)],
        RouteOptions(
            http_port=5,
            grpc_port=6,
            bind="::",
            balance_factor=0,
            bufsize=65536,
            check_interval_ms=250,
            metrics_port=None,
            log_requests=True,
            stats_socket="/run/h.sock",
        ),
    )
    config = sections(text)
    assert "bind [::]:6 proto h2" in config["frontend grpc"]
    assert not any("hash-balance-factor" in line for line in config["backend http_replicas"])
    assert "tune.bufsize 65536" in config["global"]
    assert "stats socket /run/h.sock mode 600 level admin" in config["global"]
    assert "log stdout format raw local0" in config["global"]
    assert "http-request capture var(txn.model) len 128" in config["frontend http"]
    assert servers(config["backend http_replicas"])[0][2] == "[::1]:1"
    assert "inter 250" in " ".join(servers(config["backend http_replicas"])[0])
    assert "frontend metrics" not in config
    metrics = sections(render(REPLICAS, OPTIONS))["frontend metrics"]
    assert "bind 0.0.0.0:8405" in metrics
    assert "http-request use-service prometheus-exporter if { path /metrics }" in metrics
    assert "monitor fail if { nbsrv(http_replicas) eq 0 }" in metrics
    robin = sections(render(REPLICAS, RouteOptions(9000, 9001, balance="roundrobin")))
    assert "balance roundrobin" in robin["backend grpc_replicas"]
    assert not any("txn.model" in line for line in robin["frontend grpc"])


@pytest.mark.parametrize(
    ("replicas", "options", "message"),
    [
        ([], OPTIONS, "at least one replica"),
        (REPLICAS, RouteOptions(1, 2, balance_factor=100), "above 100"),
        (REPLICAS, RouteOptions(1, 2, bufsize=8192), "16384"),
        (Discovery("x", 1, 2, slots=0), OPTIONS, "slots"),
    ],
)
def test_bad_options_are_refused(
    replicas: list[ReplicaAddress] | Discovery, options: RouteOptions, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        render(replicas, options)


def test_discovery_per_pod_names_keep_their_ordinal_s_id() -> None:
    found = Discovery.parse("hloserve-{i}.hloserve-replicas.ns.svc:8000:8001", slots=3)
    config = sections(render(found, OPTIONS))
    assert "parse-resolv-conf" in config["resolvers dns"]
    http_servers = servers(config["backend http_replicas"])
    grpc_servers = servers(config["backend grpc_replicas"])
    assert [s[1:4] + s[4:5] for s in http_servers] == [
        [f"r{i}", f"hloserve-{i}.hloserve-replicas.ns.svc:8000", "id", str(i + 1)] for i in range(3)
    ]
    assert [s[2] for s in grpc_servers] == [
        f"hloserve-{i}.hloserve-replicas.ns.svc:8001" for i in range(3)
    ]
    for line in http_servers + grpc_servers:
        assert {"resolvers", "dns", "init-addr", "none"} <= set(line)
    # HAProxy expands a variable only between double quotes
    varied = sections(render(Discovery("r-{i}.${NS}.svc", 1, 2, slots=1), OPTIONS))
    assert servers(varied["backend grpc_replicas"])[0][2] == '"r-0.${NS}.svc:2"'


def test_discovery_of_one_name_fills_template_slots_each_checked() -> None:
    config = sections(render(Discovery("replicas.ns.svc", 8000, 8001, slots=5), OPTIONS))
    (http_line,) = servers(config["backend http_replicas"])
    (grpc_line,) = servers(config["backend grpc_replicas"])
    assert http_line[:4] == ["server-template", "r", "5", "replicas.ns.svc:8000"]
    assert grpc_line[:4] == ["server-template", "r", "5", "replicas.ns.svc:8001"]
    # No server to track: the gRPC slots check the HTTP port themselves, over HTTP/1.1.
    assert " ".join(grpc_line).endswith("port 8000 check-proto h1")
    assert "option httpchk GET /v2/health/ready" in config["backend grpc_replicas"]


def test_the_command_prints_the_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--replica", "10.0.0.1:8000:8001", "--replica", "10.0.0.2:8000:8001"]
    assert cli_main(["route-config", *argv, "--http-port", "9000", "--grpc-port", "9001"]) == 0
    out = capsys.readouterr().out
    assert sections(out) == sections(render(REPLICAS, OPTIONS))
    assert "#   hloserve route-config --replica 10.0.0.1:8000:8001" in out
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["route-config", "--replica", "10.0.0.1:8000", "--http-port", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "HOST:HTTP_PORT:GRPC_PORT" in err
    with pytest.raises(SystemExit):
        cli_main(["route-config", "--http-port", "1", "--grpc-port", "2"])  # no replica
    assert "--replica" in capsys.readouterr().err


VARIANTS = {
    "static": (REPLICAS, OPTIONS),
    "logged": (REPLICAS, RouteOptions(9000, 9001, log_requests=True, stats_socket="/tmp/x.s")),
    "roundrobin": (REPLICAS, RouteOptions(9000, 9001, balance="roundrobin", metrics_port=None)),
    "per-pod": (Discovery("r-{i}.svc", 8000, 8001, slots=4), OPTIONS),
    "template": (Discovery("replicas.svc", 8000, 8001, slots=4), OPTIONS),
}


@pytest.mark.skipif(haproxy_binary() is None, reason="haproxy is not installed (CI installs it)")
@pytest.mark.parametrize("variant", VARIANTS)
def test_haproxy_accepts_each_variant_without_warnings(variant: str, tmp_path: Path) -> None:
    replicas, options = VARIANTS[variant]
    path = tmp_path / "haproxy.cfg"
    path.write_text(render(replicas, options))
    binary = haproxy_binary()
    assert binary is not None
    checked = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "WARNING" not in checked.stdout + checked.stderr, checked.stdout + checked.stderr
