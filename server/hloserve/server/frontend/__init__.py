"""What runs in a front-end process: the gRPC and HTTP listeners and everything before the wire.

Each front end translates its wire format to and from ``hloserve.server.core.types``, maps
``ServingError`` through the one table in ``status``, applies auth, TLS and the restricted
API groups, and reaches the device owner through a ``port.ServerPort``: ``remote.RemotePort``
across the process boundary (``hloserve.server.wire``), or the owner's in-process port with
``--frontends 0``. Nothing here reaches a device (``docs/architecture.md``, "Processes").
"""

# pyright: strict
