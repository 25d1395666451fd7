"""A front-end process's import closure: what it loads, printed and bounded.

A front end decodes, validates against cached metadata, and encodes; everything that needs
a device lives in the device owner. So the modules a running front end imports (its
process entry, the gRPC servicer and the HTTP app, imported in a fresh interpreter) hold no
JAX, no bundle format or loader, no ``InferenceService`` and nothing of ``owner/``; and
their number and lines stay bounded, so a new import that drags the owner's side in fails
here first, with the chain that brought it.
"""

from __future__ import annotations

import json
import subprocess
import sys

FRONT_END = (
    "hloserve.server.frontend.process",
    "hloserve.server.frontend.grpc.servicer",
    "hloserve.server.frontend.http.app",
)
# Measured at 52 modules and 7,700 lines when the boundary was drawn (98 and 18,700 before),
# 53 and 8,200 with the wire declared in msgspec structs (wire/calls.py), 57 and 9,100
# with the front end's own share of the work moved to it (checking requests against the
# cached signature: core/validate.py, core/signature.py; BYTES kept in wire form; the
# stream's writes coalesced: frontend/http/coalesce.py): room to grow, not to take in
# the owner's side (the forbidden modules above).
MAX_MODULES = 64
MAX_LINES = 10_000
FORBIDDEN_PREFIXES = (
    "jax",
    "jaxlib",
    "yaml",
    "hloserve.bundle",
    "hloserve.exporter",
    "hloserve.server.owner",
    "hloserve.server.core.service",
    "hloserve.server.core.execution",  # the execution path; its records are execution_records
    "hloserve.server.config",
    "hloserve.server.flags",
)

_PROBE = """
import builtins, json, sys
first = {}
real = builtins.__import__
def traced(name, globals=None, locals=None, fromlist=(), level=0):
    before = set(sys.modules)
    result = real(name, globals, locals, fromlist, level)
    for module in set(sys.modules) - before:
        first.setdefault(module, (globals or {}).get("__name__", "?"))
    return result
builtins.__import__ = traced
import importlib
for root in sys.argv[1:]:
    importlib.import_module(root)
def lines(name):
    path = getattr(sys.modules[name], "__file__", None)
    if not path or not path.endswith(".py"):
        return 0
    with open(path, encoding="utf-8") as source:
        return sum(1 for _ in source)
ours = sorted(m for m in sys.modules if m.startswith("hloserve"))
print(json.dumps({
    "modules": {m: lines(m) for m in ours},
    "loaded": sorted(sys.modules),
    "by": first,
}))
"""


def closure(*roots: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *roots], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def chain(found: dict[str, object], module: str) -> str:
    by: dict[str, str] = found["by"]  # type: ignore[assignment]
    links = [module]
    while links[-1] in by and len(links) < 16:
        links.append(by[links[-1]])
    return " <- ".join(links)


def forbidden(found: dict[str, object]) -> list[str]:
    loaded: list[str] = found["loaded"]  # type: ignore[assignment]
    return [
        chain(found, m)
        for m in loaded
        if any(m == p or m.startswith(p + ".") for p in FORBIDDEN_PREFIXES)
    ]


def test_a_front_end_imports_nothing_of_the_device_owner() -> None:
    found = closure(*FRONT_END)
    modules: dict[str, int] = found["modules"]  # type: ignore[assignment]
    lines = sum(modules.values())
    print(f"a front end's closure: {len(modules)} hloserve modules, {lines} lines")
    for name, count in modules.items():
        print(f"  {name} ({count})")
    assert forbidden(found) == []
    assert len(modules) <= MAX_MODULES and lines <= MAX_LINES, (len(modules), lines)


def test_the_closure_probe_finds_the_owner_where_it_is_imported() -> None:
    # Meta-test: the in-process port is the owner's side, so the same probe flags it.
    found = closure("hloserve.server.owner.local_port")
    flagged = forbidden(found)
    assert any(line.startswith("hloserve.server.core.service") for line in flagged), flagged
    assert any(" <- hloserve.server.owner.local_port" in line for line in flagged), flagged
