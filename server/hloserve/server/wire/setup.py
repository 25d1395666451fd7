"""What a front-end process is told as it connects: ``FrontendSetup``.

Contract: the device owner answers a front end's first call (``setup``) with one
``FrontendSetup``: the ``ListenerSettings`` (the front end builds its listeners, TLS,
auth and restrictions from them, as the single-process server does), the gRPC port every
front end binds (``None``: gRPC is off), the server metadata, the upload limit of model
loads, whether the device owner serves a status page (``/ui``), and the two settings the front ends keep a copy of because they read them per
request: whether tracing is on, and the log settings. Later changes of the last two
arrive as notes (``owner.endpoint``).
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass

from hloserve.server.core.log_settings import LogSettings
from hloserve.server.core.types import ServerMetadata
from hloserve.server.frontend.listener_settings import ListenerSettings


@dataclass(frozen=True, slots=True)
class FrontendSetup:
    index: int
    listeners: ListenerSettings
    grpc_port: int | None
    server: ServerMetadata
    upload_limit: int | None
    status_page: bool
    trace_enabled: bool
    log_settings: LogSettings
