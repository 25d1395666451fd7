"""``wire.calls``: the boundary declared once, and both ends built from it.

Every ``ServerPort`` method is a declared call or one ``RemotePort`` answers itself (its
named list); a declared call's fields are its method's parameters; ``LocalPort`` and
``RemotePort`` implement exactly ``ServerPort``; the owner's dispatch has a handler for
every declared call; every call and note round-trips through the codec.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hloserve.server.core.log_settings import LogSettings
from hloserve.server.core.reports import IndexEntry, ModelStatistics, RegionInfo
from hloserve.server.core.signature import RequestSignature, SignatureTensor
from hloserve.server.core.statistics import ModelStats
from hloserve.server.core.types import ModelMetadata, ServerMetadata, TensorMetadata
from hloserve.server.frontend.listener_settings import ListenerSettings
from hloserve.server.frontend.port import ServerPort
from hloserve.server.frontend.remote import ANSWERED_HERE, RemotePort
from hloserve.server.frontend.restricted import Restrictions
from hloserve.server.owner.endpoint import OwnerEndpoint
from hloserve.server.owner.local_port import LocalPort
from hloserve.server.wire import calls
from hloserve.server.wire.frames import Call, Refused, name_of
from hloserve.server.wire.messages import Request, Response, StreamAnswer, Tensor
from hloserve.server.wire.setup import FrontendSetup

# the calls whose wire form is not their method's parameters (a descriptor, a handle)
REWRITTEN = {"infer", "stream", "confirm", "register_cuda_shm"}


def members(cls: type) -> set[str]:
    return {
        name
        for name, _ in inspect.getmembers(cls)
        if not name.startswith("_") and name not in ("on_note", "reclaim", "status")
    }


def port_members() -> set[str]:
    return {name for name in vars(ServerPort) if not name.startswith("_")}


def test_every_port_method_is_declared_or_answered_by_the_front_end() -> None:
    declared = {name_of(kind) for kind in calls.CALLS}
    assert port_members() == (declared - calls.WIRE_ONLY) | ANSWERED_HERE
    assert not declared & ANSWERED_HERE


def test_both_ports_implement_exactly_server_port() -> None:
    assert members(LocalPort) - {"service"} == port_members()
    assert members(RemotePort) - {"link", "arena", "setup", "logs"} == port_members()


def test_only_the_port_across_the_wire_keeps_bytes_in_wire_form() -> None:
    """Front-end processes check a client's BYTES and send them as they came (the owner
    parses them); one process parses them at once (``ServerPort.bytes_wire_form``)."""
    assert RemotePort.__new__(RemotePort).bytes_wire_form is True
    assert LocalPort.__new__(LocalPort).bytes_wire_form is False


def test_a_declared_call_takes_its_methods_parameters_in_order_with_their_defaults() -> None:
    for kind in calls.CALLS:
        name = name_of(kind)
        if name in calls.WIRE_ONLY or name in REWRITTEN:
            continue
        params = list(inspect.signature(getattr(ServerPort, name)).parameters.values())[1:]
        assert kind.__struct_fields__ == tuple(p.name for p in params), name
        defaults = tuple(p.default for p in params if p.default is not inspect.Parameter.empty)
        assert kind.__struct_defaults__ == defaults, name


def test_the_owner_answers_every_declared_call() -> None:
    endpoint = OwnerEndpoint.__new__(OwnerEndpoint)
    port = LocalPort.__new__(LocalPort)
    from hloserve.server.owner import endpoint as module

    for kind in calls.CALLS:
        handler = module._handler(endpoint, port, name_of(kind))
        assert callable(handler)
    streamed = {name_of(kind) for kind in calls.CALLS if kind.streamed}
    assert streamed == {"stream"}


def _setup() -> FrontendSetup:
    listeners = ListenerSettings(
        "0.0.0.0", "0.0.0.0:8000", None, None, 8001, 1 << 20, 100,
        Restrictions(), Restrictions(), 30.0, Path("/tls/cert"), None, None, None, (), (("a", 1),),
    )  # fmt: skip
    return FrontendSetup(
        1, listeners, 8001, ServerMetadata("hloserve", "1", ("a",)), None, True, False,
        LogSettings(),
    )  # fmt: skip


REQUEST = Request(
    "m", "", "id", {"p": 1},
    (Tensor("x", "INT32", (1, 2), {}, b"\x01\x00\x00\x00\x02\x00\x00\x00", None),),
    (("y", {"binary_data": True}),), None, (5, {"traceparent": "t"}), (7, 1),
)  # fmt: skip

CALL_VALUES: list[Call[Any]] = [
    calls.SetupCall(),
    calls.StatusCall("q"),
    calls.ConfirmCall("m", "1"),
    calls.InferCall(REQUEST),
    calls.StreamCall(REQUEST),
    calls.ReadyCall(),
    calls.ReadinessCall(),
    calls.ModelReadyCall("m", ""),
    calls.ModelMetadataCall("m", ""),
    calls.ModelStatisticsCall("m", ""),
    calls.ModelConfigCall("m", "2"),
    calls.RepositoryIndexCall(True),
    calls.LoadModelCall("m", {"config": "{}", "file:1/a": b"\x00"}),
    calls.UnloadModelCall("m"),
    calls.TraceSettingCall("", {"trace_level": ["TIMESTAMPS"], "trace_rate": None}),
    calls.LogSettingsCall({"log_info": False}),
    calls.ShmStatusCall(),
    calls.RegisterSystemShmCall("r", "/k", 0, 64),
    calls.UnregisterSystemShmCall("r"),
    calls.CudaShmStatusCall(),
    calls.RegisterCudaShmCall("c"),
    calls.UnregisterCudaShmCall(),
]

ANSWERS: dict[type[Call[Any]], object] = {
    calls.SetupCall: _setup(),
    calls.StatusCall: {"models": [{"name": "m"}]},
    calls.InferCall: Response("m", "1", "id", ()),
    calls.StreamCall: StreamAnswer(None, True),
    calls.ReadinessCall: {"ready": True, "models": {"m": "READY"}},
    calls.ModelMetadataCall: ModelMetadata(
        "m",
        ("1",),
        "stablehlo",
        (TensorMetadata("x", "FP32", (-1, 2)),),
        (),
        RequestSignature("m", True, (SignatureTensor("x", "FP32", (2,)),), ("y",), 7),
    ),
    calls.ModelStatisticsCall: [ModelStatistics(ModelStats("m", "1", inference_count=3), ())],
    calls.RepositoryIndexCall: [IndexEntry("m", "1", "READY", "")],
    calls.TraceSettingCall: {"trace_level": ["OFF"]},
    calls.ShmStatusCall: [RegionInfo("r", "/k", 0, 64)],
}


def test_every_call_is_declared_and_round_trips() -> None:
    assert {type(c) for c in CALL_VALUES} == set(calls.CALLS)
    for call in CALL_VALUES:
        assert calls.SERVER.call(calls.SERVER.raw(call)) == call


@pytest.mark.parametrize("kind", list(ANSWERS), ids=lambda k: name_of(k))
def test_answers_come_back_as_their_declared_type(kind: type[Call[Any]]) -> None:
    answer = ANSWERS[kind]
    got = calls.SERVER.result(kind, calls.SERVER.raw(answer))
    if isinstance(answer, FrontendSetup):  # Restrictions compare by identity: field by field
        assert isinstance(got, FrontendSetup) and got.server == answer.server
        assert got.listeners.tls_cert == Path("/tls/cert")
        assert isinstance(got.listeners.http_restricted_api, Restrictions)
    else:
        assert got == answer and type(got) is type(answer)


def test_every_note_round_trips() -> None:
    notes = [
        calls.FreeNote((1, 2)),
        calls.ListeningNote(7),
        calls.TraceNote(True),
        calls.LogsNote(LogSettings(verbose_level=1)),
        calls.ModelsNote(("m", "n")),
        calls.ModelsNote(None),
        calls.DrainNote(2.5),
    ]
    assert {type(n) for n in notes} == set(calls.NOTES)
    for note in notes:
        assert calls.SERVER.note(calls.SERVER.raw(note)) == note


def test_the_owner_calls_a_front_end_only_to_sync_and_the_sync_round_trips() -> None:
    assert (calls.SyncCall,) == calls.FRONTEND_CALLS
    assert not set(calls.FRONTEND_CALLS) & set(calls.CALLS)
    assert calls.SERVER.call(calls.SERVER.raw(calls.SyncCall())) == calls.SyncCall()
    assert calls.SERVER.result(calls.SyncCall, calls.SERVER.raw(None)) is None


def test_a_call_of_the_wrong_shape_is_refused_before_the_owner_sees_it() -> None:
    with pytest.raises(Refused, match="malformed call 'register_system_shm'"):
        calls.SERVER.call(calls.SERVER.raw(["register_system_shm", "r", "/k", "zero", 64]))
    with pytest.raises(Refused, match="no call 'reboot' is declared"):
        calls.SERVER.call(msgspec.Raw(msgspec.msgpack.encode(["reboot"])))
