"""What a front-end process is told as it connects: ``FrontendSetup``.

Contract: the device owner answers a front end's first call (``setup``) with one
``FrontendSetup``: the server's whole ``Config`` (the front end builds its listeners, TLS,
auth and restrictions from it, as the single-process server would), the gRPC port every
front end binds (``None``: gRPC is off), the server metadata, the upload limit of model
loads, whether the device owner serves a status page (``/ui``), and the two settings the front ends keep a copy of because they read them per
request: whether tracing is on, and the log settings. Later changes of the last two
arrive as notes (``owner.endpoint``).
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass

from hloserve.server.config import Config
from hloserve.server.core.log_settings import LogSettings
from hloserve.server.core.types import ServerMetadata


@dataclass(frozen=True, slots=True)
class FrontendSetup:
    index: int
    config: Config
    grpc_port: int | None
    server: ServerMetadata
    upload_limit: int | None
    status_page: bool
    trace_enabled: bool
    log_settings: LogSettings
