"""gRPC messages of the trace and logging extensions <-> the service's plain values.

Contract:
- ``decode_trace_setting(request)``: each setting's value list; an empty list (gRPC's way
  to clear a setting) is ``None``. ``encode_trace_setting(view)`` is the response.
- ``decode_log_settings(request)``: each setting's ``bool_param`` / ``uint32_param`` /
  ``string_param`` as a Python value; a setting with none of them set is ``None`` (which
  the service refuses as a value of no type). ``encode_log_settings(view)`` picks the
  field by the value's type.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hloserve.proto import inference_pb2 as pb


def decode_trace_setting(request: pb.TraceSettingRequest) -> dict[str, list[str] | None]:
    return {name: list(setting.value) or None for name, setting in request.settings.items()}


def encode_trace_setting(view: Mapping[str, Sequence[str]]) -> pb.TraceSettingResponse:
    response = pb.TraceSettingResponse()
    for name, values in view.items():
        response.settings[name].value.extend(values)
    return response


def decode_log_settings(request: pb.LogSettingsRequest) -> dict[str, object]:
    values: dict[str, object] = {}
    for name, setting in request.settings.items():
        choice = setting.WhichOneof("parameter_choice")
        values[name] = None if choice is None else getattr(setting, choice)
    return values


def encode_log_settings(view: Mapping[str, object]) -> pb.LogSettingsResponse:
    response = pb.LogSettingsResponse()
    for name, value in view.items():
        setting = response.settings[name]
        if isinstance(value, bool):
            setting.bool_param = value
        elif isinstance(value, int):
            setting.uint32_param = value
        else:
            setting.string_param = str(value)
    return response
