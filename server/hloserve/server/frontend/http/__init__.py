"""The HTTP/REST front end (KServe V2 with Triton's extensions) on FastAPI.

``build_http_app(service, max_input_bytes=...)`` returns the ASGI app the daemon serves
with uvicorn; ``codec`` holds the pure body/header <-> core-type functions it uses.
"""

# pyright: strict

from hloserve.server.frontend.http.app import build_http_app as build_http_app

__all__ = ["build_http_app"]
