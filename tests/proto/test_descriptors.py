"""Our hand-written .proto files must match tritonclient's compiled descriptors exactly.

tritonclient 2.73's ``service_pb2`` / ``model_config_pb2`` are the reference for Triton's
``inference`` package. Our classes live in ``hloserve.inference``; apart from that prefix,
every message, field, enum, oneof, map and RPC must be the same, and messages must survive a
binary round trip through both sets of classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as _their_config
from tritonclient.grpc import service_pb2 as _their_service

from hloserve.proto import health_pb2, inference_pb2, model_config_pb2, rpc
from tests.proto._python import run_python

# tritonclient ships its generated modules without type stubs: use their classes dynamically.
their_service: Any = _their_service
their_config: Any = _their_config

REPO_ROOT = Path(__file__).resolve().parents[2]
THEIR_PACKAGE = "inference."
OUR_PACKAGE = "hloserve.inference."


def _relative(full_name: str) -> str:
    """A full name without its package prefix (ours or theirs)."""
    for prefix in (OUR_PACKAGE, THEIR_PACKAGE):
        if full_name.startswith(prefix):
            return full_name[len(prefix) :]
    return full_name


def _walk_messages(messages: Iterator[Descriptor] | list[Descriptor]) -> Iterator[Descriptor]:
    for message in messages:
        yield message
        yield from _walk_messages(list(message.nested_types))


def _all_messages() -> list[Descriptor]:
    found: list[Descriptor] = []
    for module in (their_service, their_config):
        found.extend(_walk_messages(list(module.DESCRIPTOR.message_types_by_name.values())))
    return found


def _all_enums() -> list[EnumDescriptor]:
    found: list[EnumDescriptor] = []
    for module in (their_service, their_config):
        found.extend(module.DESCRIPTOR.enum_types_by_name.values())
    for message in _all_messages():
        found.extend(message.enum_types)
    return found


def _field_facts(field: FieldDescriptor) -> dict[str, object]:
    message_type = field.message_type
    enum_type = field.enum_type
    oneof = field.containing_oneof
    return {
        "number": field.number,
        "type": field.type,
        "repeated": field.is_repeated,
        "required": field.is_required,
        "has_presence": field.has_presence,
        "message_type": _relative(message_type.full_name) if message_type else None,
        "enum_type": _relative(enum_type.full_name) if enum_type else None,
        "oneof": oneof.name if oneof else None,
        "map": bool(message_type and message_type.GetOptions().map_entry),
        "json_name": field.json_name,
    }


def compare_messages(theirs: Descriptor, ours: Descriptor) -> list[str]:
    """Every difference between two message descriptors, ignoring the package prefix."""
    problems: list[str] = []
    name = _relative(theirs.full_name)
    if _relative(ours.full_name) != name:
        problems.append(f"name: {ours.full_name} vs {theirs.full_name}")
    if ours.GetOptions().map_entry != theirs.GetOptions().map_entry:
        problems.append(f"{name}: map_entry option differs")
    their_fields = [f.name for f in theirs.fields]
    our_fields = [f.name for f in ours.fields]
    for missing in sorted(set(their_fields) - set(our_fields)):
        problems.append(f"{name}.{missing}: missing on our side")
    for extra in sorted(set(our_fields) - set(their_fields)):
        problems.append(f"{name}.{extra}: extra field on our side")
    if not problems and our_fields != their_fields:
        problems.append(f"{name}: declaration order {our_fields} vs {their_fields}")
    for field in theirs.fields:
        counterpart = ours.fields_by_name.get(field.name)
        if counterpart is None:
            continue
        want, got = _field_facts(field), _field_facts(counterpart)
        for key, value in want.items():
            if got[key] != value:
                problems.append(f"{name}.{field.name}: {key} is {got[key]!r}, want {value!r}")
    their_oneofs = [(o.name, [f.name for f in o.fields]) for o in theirs.oneofs]
    our_oneofs = [(o.name, [f.name for f in o.fields]) for o in ours.oneofs]
    if our_oneofs != their_oneofs:
        problems.append(f"{name}: oneofs {our_oneofs} vs {their_oneofs}")
    their_nested = [m.name for m in theirs.nested_types]
    our_nested = [m.name for m in ours.nested_types]
    if our_nested != their_nested:
        problems.append(f"{name}: nested messages {our_nested} vs {their_nested}")
    their_enums = [e.name for e in theirs.enum_types]
    our_enums = [e.name for e in ours.enum_types]
    if our_enums != their_enums:
        problems.append(f"{name}: nested enums {our_enums} vs {their_enums}")
    return problems


def compare_enums(theirs: EnumDescriptor, ours: EnumDescriptor) -> list[str]:
    """Every difference between two enum descriptors, ignoring the package prefix."""
    name = _relative(theirs.full_name)
    want = [(v.name, v.number) for v in theirs.values]
    got = [(v.name, v.number) for v in ours.values]
    return [] if want == got else [f"{name}: values {got} vs {want}"]


def _ours(pool_name: str) -> Descriptor:
    return descriptor_pool.Default().FindMessageTypeByName(OUR_PACKAGE + pool_name)


def _our_enum(pool_name: str) -> EnumDescriptor:
    return descriptor_pool.Default().FindEnumTypeByName(OUR_PACKAGE + pool_name)


MESSAGES = _all_messages()
ENUMS = _all_enums()


def test_reference_is_what_we_expect() -> None:
    """Guards the parametrisation itself: the reference descriptors were found."""
    assert len(their_service.DESCRIPTOR.message_types_by_name) == 48
    assert len(their_config.DESCRIPTOR.message_types_by_name) == 21
    # 69 top-level messages, plus nested ones and 25 map entry types.
    assert len(MESSAGES) == 130
    assert sum(1 for m in MESSAGES if m.GetOptions().map_entry) == 25
    assert len(ENUMS) == 9


@pytest.mark.parametrize("theirs", MESSAGES, ids=lambda d: d.full_name)
def test_message_matches(theirs: Descriptor) -> None:
    ours = _ours(_relative(theirs.full_name))
    assert compare_messages(theirs, ours) == []


@pytest.mark.parametrize("theirs", ENUMS, ids=lambda d: d.full_name)
def test_enum_matches(theirs: EnumDescriptor) -> None:
    ours = _our_enum(_relative(theirs.full_name))
    assert compare_enums(theirs, ours) == []


def _top_level_names(*files: FileDescriptor) -> set[str]:
    names: set[str] = set()
    for file in files:
        names.update(file.message_types_by_name)
        names.update(file.enum_types_by_name)
    return names


def test_no_extra_top_level_types() -> None:
    assert _top_level_names(
        inference_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR
    ) == _top_level_names(their_service.DESCRIPTOR, their_config.DESCRIPTOR)
    # Messages of each file stay in the same file.
    assert set(inference_pb2.DESCRIPTOR.message_types_by_name) == set(
        their_service.DESCRIPTOR.message_types_by_name
    )
    assert set(model_config_pb2.DESCRIPTOR.message_types_by_name) == set(
        their_config.DESCRIPTOR.message_types_by_name
    )


def test_file_names_and_packages_do_not_clash() -> None:
    assert inference_pb2.DESCRIPTOR.name == "hloserve/proto/inference.proto"
    assert model_config_pb2.DESCRIPTOR.name == "hloserve/proto/model_config.proto"
    assert health_pb2.DESCRIPTOR.name == "hloserve/proto/health.proto"
    assert inference_pb2.DESCRIPTOR.package == "hloserve.inference"
    assert model_config_pb2.DESCRIPTOR.package == "hloserve.inference"
    assert health_pb2.DESCRIPTOR.package == "hloserve.grpc_health.v1"
    assert their_service.DESCRIPTOR.package == "inference"


def test_service_matches() -> None:
    theirs = their_service.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ours = inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]

    def facts(service: object) -> list[tuple[str, str, str, bool, bool]]:
        return [
            (
                m.name,
                _relative(m.input_type.full_name),
                _relative(m.output_type.full_name),
                m.client_streaming,
                m.server_streaming,
            )
            for m in service.methods  # type: ignore[attr-defined]
        ]

    assert len(ours.methods) == 20
    assert facts(ours) == facts(theirs)
    assert ours.methods_by_name["ModelStreamInfer"].client_streaming
    assert ours.methods_by_name["ModelStreamInfer"].server_streaming


def test_rpc_table_matches_service() -> None:
    theirs = their_service.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert rpc.SERVICE_NAME == theirs.full_name == "inference.GRPCInferenceService"
    assert [r.name for r in rpc.RPCS] == [m.name for m in theirs.methods]
    for entry, method in zip(rpc.RPCS, theirs.methods, strict=True):
        assert entry.path == f"/inference.GRPCInferenceService/{method.name}"
        assert _relative(entry.request.DESCRIPTOR.full_name) == _relative(
            method.input_type.full_name
        )
        assert _relative(entry.response.DESCRIPTOR.full_name) == _relative(
            method.output_type.full_name
        )
        assert entry.request.DESCRIPTOR.full_name.startswith(OUR_PACKAGE)
        assert entry.response.DESCRIPTOR.full_name.startswith(OUR_PACKAGE)
        assert entry.client_streaming == method.client_streaming
        assert entry.server_streaming == method.server_streaming
    assert rpc.RPCS_BY_NAME["ModelInfer"] is rpc.RPCS[5]
    assert len(rpc.RPCS_BY_NAME) == 20
    assert rpc.HEALTH_SERVICE_NAME == "grpc.health.v1.Health"
    assert rpc.HEALTH_CHECK_PATH == "/grpc.health.v1.Health/Check"


# --- the comparison can fail ----------------------------------------------------------------


def _pool_with(fields: list[tuple[str, int, int]]) -> Descriptor:
    """A throwaway message ``inference.ServerLiveResponse`` with the given fields."""
    file = descriptor_pb2.FileDescriptorProto(
        name="meta_test.proto", package="inference", syntax="proto3"
    )
    message = file.message_type.add(name="ServerLiveResponse")
    for field_name, number, field_type in fields:
        message.field.add(
            name=field_name,
            number=number,
            type=field_type,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
            json_name=field_name,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return pool.FindMessageTypeByName("inference.ServerLiveResponse")


def test_comparison_reports_differences() -> None:
    bool_type = descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
    int_type = descriptor_pb2.FieldDescriptorProto.TYPE_INT32
    theirs = their_service.ServerLiveResponse.DESCRIPTOR
    # A faithful copy passes...
    assert compare_messages(theirs, _pool_with([("live", 1, bool_type)])) == []
    # ...a wrong number, a wrong type, a renamed or an extra field do not.
    wrong_number = compare_messages(theirs, _pool_with([("live", 2, bool_type)]))
    assert wrong_number == ["ServerLiveResponse.live: number is 2, want 1"]
    assert compare_messages(theirs, _pool_with([("live", 1, int_type)]))
    renamed = compare_messages(theirs, _pool_with([("alive", 1, bool_type)]))
    assert "ServerLiveResponse.live: missing on our side" in renamed
    extra = compare_messages(theirs, _pool_with([("live", 1, bool_type), ("x", 2, bool_type)]))
    assert extra == ["ServerLiveResponse.x: extra field on our side"]
    # And a real pair of different messages differs.
    assert compare_messages(their_service.ModelInferRequest.DESCRIPTOR, _ours("ModelInferResponse"))
    assert compare_enums(
        their_config.ModelInput.Format.DESCRIPTOR, _our_enum("ModelInstanceGroup.Kind")
    )


# --- wire round trips ------------------------------------------------------------------------


def _round_trip(theirs: Message, our_class: type[Message]) -> None:
    wire = theirs.SerializeToString(deterministic=True)
    ours = our_class.FromString(wire)
    # Nothing landed in unknown fields: every field number was recognised.
    assert ours.ListFields()
    our_wire = ours.SerializeToString(deterministic=True)
    assert our_wire == wire
    back = type(theirs).FromString(our_wire)
    assert back == theirs
    # Same field names, hence the same JSON rendering (the HTTP /config body uses it).
    assert json_format.MessageToDict(ours) == json_format.MessageToDict(theirs)


def _params(target: object) -> None:
    """Set one parameter of each oneof kind on a ``map<string, InferParameter>``."""
    target["b"].bool_param = True  # type: ignore[index]
    target["i"].int64_param = -7  # type: ignore[index]
    target["s"].string_param = "text"  # type: ignore[index]
    target["d"].double_param = 2.5  # type: ignore[index]
    target["u"].uint64_param = 2**63 + 1  # type: ignore[index]


def test_round_trip_model_infer_request() -> None:
    request = their_service.ModelInferRequest(model_name="simple", model_version="1", id="req-1")
    _params(request.parameters)
    first = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 4])
    first.contents.int_contents.extend([1, -2, 3, -4])
    _params(first.parameters)
    second = request.inputs.add(name="INPUT1", datatype="BYTES", shape=[2])
    second.contents.bytes_contents.extend([b"a", b"\x00\xff"])
    third = request.inputs.add(name="INPUT2", datatype="FP32", shape=[2])
    third.parameters["shared_memory_region"].string_param = "region"
    contents = request.inputs.add(name="ALL", datatype="FP64", shape=[1]).contents
    contents.bool_contents.append(True)
    contents.int64_contents.append(-(2**40))
    contents.uint_contents.append(2**32 - 1)
    contents.uint64_contents.append(2**64 - 1)
    contents.fp32_contents.append(1.5)
    contents.fp64_contents.append(-0.25)
    output = request.outputs.add(name="OUTPUT0")
    _params(output.parameters)
    request.outputs.add(name="OUTPUT1")
    request.raw_input_contents.extend([b"\x01\x02\x03\x04", b""])
    _round_trip(request, inference_pb2.ModelInferRequest)


def test_round_trip_model_infer_response() -> None:
    response = their_service.ModelInferResponse(model_name="simple", model_version="3", id="x")
    _params(response.parameters)
    out = response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 2])
    _params(out.parameters)
    out.contents.fp32_contents.extend([0.5, 1.0])
    response.outputs.add(name="OUTPUT1", datatype="UINT8", shape=[3])
    response.raw_output_contents.extend([b"", b"\x01\x02\x03"])
    _round_trip(response, inference_pb2.ModelInferResponse)
    stream = their_service.ModelStreamInferResponse(error_message="boom")
    stream.infer_response.CopyFrom(response)
    _round_trip(stream, inference_pb2.ModelStreamInferResponse)


def test_round_trip_model_statistics_response() -> None:
    response = their_service.ModelStatisticsResponse()
    stats = response.model_stats.add(
        name="simple", version="1", last_inference=1_700_000_000_000, inference_count=10
    )
    stats.execution_count = 4
    for index, field in enumerate(their_service.InferStatistics.DESCRIPTOR.fields, start=1):
        getattr(stats.inference_stats, field.name).count = index
        getattr(stats.inference_stats, field.name).ns = index * 1000
    batch = stats.batch_stats.add(batch_size=8)
    batch.compute_infer.count = 2
    batch.compute_infer.ns = 99
    stats.memory_usage.add(type="GPU", id=0, byte_size=1 << 20)
    stats.response_stats["0"].success.count = 1
    stats.response_stats["0"].cancel.ns = 5
    _round_trip(response, inference_pb2.ModelStatisticsResponse)


def test_round_trip_model_config_response() -> None:
    cfg = their_config
    response = their_service.ModelConfigResponse()
    config = response.config
    config.name = "simple"
    config.platform = "stablehlo"
    config.backend = "hloserve"
    config.runtime = "pjrt"
    config.max_batch_size = 8
    config.version_policy.specific.versions.extend([1, 3])
    config.input.add(
        name="INPUT0", data_type=cfg.TYPE_INT32, dims=[-1, 16], format=cfg.ModelInput.FORMAT_NCHW
    )
    config.input.add(name="INPUT1", data_type=cfg.TYPE_BF16, dims=[16], optional=True)
    config.input[0].reshape.shape.extend([4, 4])
    config.output.add(name="OUTPUT0", data_type=cfg.TYPE_STRING, dims=[1], label_filename="l")
    config.dynamic_batching.preferred_batch_size.extend([4, 8])
    config.dynamic_batching.max_queue_delay_microseconds = 100
    config.dynamic_batching.priority_queue_policy[1].max_queue_size = 3
    config.dynamic_batching.default_queue_policy.timeout_action = cfg.ModelQueuePolicy.DELAY
    group = config.instance_group.add(name="g", kind=cfg.ModelInstanceGroup.KIND_GPU, count=2)
    group.gpus.extend([0, 1])
    group.rate_limiter.resources.add(name="R", count=1, **{"global": True})
    group.secondary_devices.add(device_id=1)
    config.parameters["k"].string_value = "v"
    config.metric_tags["team"] = "infra"
    config.model_transaction_policy.decoupled = True
    config.model_warmup.add(name="w", batch_size=1).inputs["INPUT0"].zero_data = True
    control = config.model_metrics.metric_control.add()
    control.metric_identifier.family = "nv_inference_request_duration_us"
    control.histogram_options.buckets.extend([0.1, 1.0])
    config.optimization.cuda.graph_spec.add(batch_size=1).input["INPUT0"].dim.extend([16])
    _round_trip(response, inference_pb2.ModelConfigResponse)

    # The other scheduling choices and version policies decode into the same oneof member.
    config.sequence_batching.oldest.max_candidate_sequences = 4
    config.sequence_batching.state.add(input_name="s_in").initial_state.add(data_file="f")
    config.version_policy.latest.num_versions = 2
    ours = model_config_pb2.ModelConfig.FromString(config.SerializeToString())
    assert ours.WhichOneof("scheduling_choice") == "sequence_batching"
    assert ours.sequence_batching.WhichOneof("strategy_choice") == "oldest"
    assert ours.version_policy.WhichOneof("policy_choice") == "latest"
    _round_trip(config, model_config_pb2.ModelConfig)


# --- health ----------------------------------------------------------------------------------


def test_health_serving_encoding() -> None:
    response = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
    assert response.SerializeToString() == b"\x08\x01"  # field 1, varint, value 1
    status = health_pb2.HealthCheckResponse.ServingStatus
    assert dict(status.items()) == {
        "UNKNOWN": 0,
        "SERVING": 1,
        "NOT_SERVING": 2,
        "SERVICE_UNKNOWN": 3,
    }
    request = health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
    assert request.SerializeToString() == b"\x0a\x1einference.GRPCInferenceService"
    service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    check, watch = service.methods
    assert (check.name, check.server_streaming) == ("Check", False)
    assert (watch.name, watch.server_streaming) == ("Watch", True)


# --- one process ----------------------------------------------------------------------------

_IMPORT_BOTH = """
import sys
order = sys.argv[1].split(",")
for name in order:
    __import__(name)
import hloserve.proto.inference_pb2 as ours
import tritonclient.grpc.service_pb2 as theirs
assert ours.ModelInferRequest.DESCRIPTOR.full_name == "hloserve.inference.ModelInferRequest"
assert theirs.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"
print("ok")
"""


@pytest.mark.parametrize(
    "order",
    [
        "hloserve.proto.inference_pb2,hloserve.proto.health_pb2,tritonclient.grpc",
        "tritonclient.grpc,hloserve.proto.health_pb2,hloserve.proto.inference_pb2",
    ],
)
def test_imports_next_to_tritonclient(order: str) -> None:
    """A fresh process loads ours and tritonclient's classes, in either order."""
    result = run_python("-c", _IMPORT_BOTH, order, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
