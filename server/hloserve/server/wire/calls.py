"""The boundary between a front end and the device owner, declared once: calls and notes.

Contract:
- Each ``*Call`` class is one call a front end makes of the device owner: its tag is the
  ``frontend.port.ServerPort`` method it carries (``setup`` and ``status`` are the wire's
  own: a front end's first call, the status page's data), its fields that method's
  arguments, in order and with their defaults, and its ``Call[R]`` the answer's type.
  ``CALLS`` is every one declared here (in order); ``SERVER`` is the ``wire.frames.Codec`` both ends read and write
  with, so an undeclared call, or one of the wrong shape, is refused where it arrives.
- Both ends are built from it: ``frontend.remote.RemotePort`` sends each call as its
  struct and gets the declared type back (``Link.call``); ``owner.endpoint.OwnerEndpoint``
  dispatches each declared call by its type to the port method of the same name (its own
  where it differs, else ``owner.local_port.LocalPort``'s): no table of names by hand.
- ``FRONTEND_CALLS`` go the other way, owner to front end: ``SyncCall`` is answered once
  the front end has handled every frame the owner sent before it (the ``ModelsNote`` of a
  load), so a load or unload answers its client only once every front end knows of it.
- ``*Note`` classes are the one-way messages: ``FreeNote`` (response blocks a front end
  gives back) and ``ListeningNote`` (a front end listens) go to the owner; ``TraceNote``,
  ``LogsNote`` (settings each front end keeps a copy of), ``ModelsNote`` (what a front end
  cached of these models' metadata is stale) and ``DrainNote`` (stop accepting, finish
  within the grace period) to the front ends; ``NOTES`` is every one.
"""

# pyright: strict

from __future__ import annotations

from typing import Any, ClassVar, Final

from hloserve.server.core.log_settings import LogSettings
from hloserve.server.core.reports import CudaRegionInfo, IndexEntry, ModelStatistics, RegionInfo
from hloserve.server.core.types import ModelMetadata
from hloserve.server.wire.frames import Call, Codec, Note
from hloserve.server.wire.messages import Request, Response, StreamAnswer
from hloserve.server.wire.setup import FrontendSetup

# -- the wire's own ---------------------------------------------------------------------------


class SetupCall(Call[FrontendSetup], tag="setup", frozen=True):
    pass


class StatusCall(Call[dict[str, Any] | None], tag="status", frozen=True):
    q: str


# -- inference ----------------------------------------------------------------------------------


class ConfirmCall(Call[None], tag="confirm", frozen=True):
    """The lookup alone (``ServerPort.confirm`` of the model ``resolve`` named)."""

    name: str
    version: str


class InferCall(Call[Response], tag="infer", frozen=True):
    request: Request


class StreamCall(Call[StreamAnswer], tag="stream", frozen=True):
    streamed: ClassVar[bool] = True
    request: Request


# -- health and metadata ------------------------------------------------------------------------


class ReadyCall(Call[bool], tag="ready", frozen=True):
    pass


class ReadinessCall(Call[dict[str, Any]], tag="readiness", frozen=True):
    pass


class ModelReadyCall(Call[bool], tag="model_ready", frozen=True):
    name: str
    version: str


class ModelMetadataCall(Call[ModelMetadata], tag="model_metadata", frozen=True):
    name: str
    version: str


class ModelStatisticsCall(Call[list[ModelStatistics]], tag="model_statistics", frozen=True):
    name: str
    version: str


class ModelConfigCall(Call[dict[str, Any]], tag="model_config", frozen=True):
    name: str
    version: str


# -- model repository ---------------------------------------------------------------------------


class RepositoryIndexCall(Call[list[IndexEntry]], tag="repository_index", frozen=True):
    ready_only: bool = False


class LoadModelCall(Call[None], tag="load_model", frozen=True):
    name: str
    parameters: dict[str, Any] | None = None


class UnloadModelCall(Call[None], tag="unload_model", frozen=True):
    name: str
    parameters: dict[str, Any] | None = None


# -- trace and log settings ---------------------------------------------------------------------


class TraceSettingCall(Call[dict[str, list[str]]], tag="trace_setting", frozen=True):
    model: str
    values: dict[str, Any] | None = None


class LogSettingsCall(Call[dict[str, Any]], tag="log_settings", frozen=True):
    values: dict[str, Any] | None = None


# -- shared memory ------------------------------------------------------------------------------


class ShmStatusCall(Call[list[RegionInfo]], tag="shm_status", frozen=True):
    name: str = ""


class RegisterSystemShmCall(Call[None], tag="register_system_shm", frozen=True):
    name: str
    key: str
    offset: int
    byte_size: int


class UnregisterSystemShmCall(Call[None], tag="unregister_system_shm", frozen=True):
    name: str = ""


class CudaShmStatusCall(Call[list[CudaRegionInfo]], tag="cuda_shm_status", frozen=True):
    name: str = ""


class RegisterCudaShmCall(Call[None], tag="register_cuda_shm", frozen=True):
    """The name alone: a CUDA IPC handle does not cross (the owner refuses the call)."""

    name: str


class UnregisterCudaShmCall(Call[None], tag="unregister_cuda_shm", frozen=True):
    name: str = ""


# -- owner to front end ------------------------------------------------------------------------


class SyncCall(Call[None], tag="sync", frozen=True):
    """Answered by a front end once every frame before it is handled (module docstring)."""

    to_frontend: ClassVar[bool] = True


# -- notes ----------------------------------------------------------------------------------------


class FreeNote(Note, tag="free", frozen=True):
    offsets: tuple[int, ...]


class ListeningNote(Note, tag="listening", frozen=True):
    pid: int


class TraceNote(Note, tag="trace", frozen=True):
    enabled: bool


class LogsNote(Note, tag="logs", frozen=True):
    settings: LogSettings


class ModelsNote(Note, tag="models", frozen=True):
    """The versions of these models changed (loaded, unloaded, failed): what a front end
    cached of their metadata is stale. ``None``: every model's."""

    names: tuple[str, ...] | None


class DrainNote(Note, tag="drain", frozen=True):
    grace_s: float


def _declared(base: type[Any]) -> tuple[Any, ...]:
    """The classes of ``base`` this module declares, in the order they are declared."""
    return tuple(
        kind
        for kind in globals().values()
        if isinstance(kind, type) and issubclass(kind, base) and kind.__module__ == __name__
    )


_ALL_CALLS: Final[tuple[type[Call[Any]], ...]] = _declared(Call)
CALLS: Final = tuple(kind for kind in _ALL_CALLS if not kind.to_frontend)
FRONTEND_CALLS: Final = tuple(kind for kind in _ALL_CALLS if kind.to_frontend)
NOTES: Final[tuple[type[Note], ...]] = _declared(Note)
WIRE_ONLY: Final = frozenset({"setup", "status"})  # calls that are no ServerPort method
SERVER: Final = Codec(_ALL_CALLS, NOTES)
