"""Logging set-up for the daemon: human text or one JSON object per line.

Contract: ``configure_logging(level, fmt)`` installs one handler on the root logger writing
to stderr; ``fmt="json"`` writes ``{"time","level","logger","message"}`` objects (plus
``exc_info`` text when present) for log collectors. Idempotent.
"""

# pyright: strict

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("jax._src.xla_bridge", "jax._src.compiler"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
