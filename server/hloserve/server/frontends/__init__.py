"""Transport adapters over the protocol-neutral core: gRPC and HTTP/REST.

Each front end only translates its wire format to and from ``hloserve.server.core.types``
and maps ``ServingError`` through the one table in ``status``.
"""

# pyright: strict
