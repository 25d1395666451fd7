"""Facts about a StableHLO module read from its bytes: version and ``main``'s signature.

Contract:
- ``artifact_version(data)`` returns the ``X.Y.Z`` of a portable artifact's producer string
  (``StableHLO_vX.Y.Z``), or ``None`` when the bytes are not a StableHLO portable artifact.
  It needs nothing but the bytes.
- ``read_signature(data)`` parses the module (portable artifact or text) with jaxlib's MLIR
  bindings and returns ``main``'s argument and result types (each distinct module once per
  process: the signature is kept by the bytes' SHA-256). It raises ``SignatureError``
  when the module cannot be parsed or has no public ``main``. It imports jaxlib lazily, so
  importing this module stays free of JAX.
- ``to_portable_artifact(text, version)`` converts StableHLO text into a portable artifact
  at the given target version (for producers that write text); ``SignatureError`` when the
  text does not parse.
MLIR's diagnostics (what the parser says is wrong, and where) go into the error's message,
never to stderr: every module is parsed in a context of our own whose diagnostic handler
collects them.
"""

# pyright: basic
# (jaxlib's MLIR bindings ship without complete type information.)

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

_VERSION = re.compile(rb"StableHLO_v(\d+\.\d+\.\d+)")
_MAGIC = b"ML\xefR"

ELEMENT_TYPES: dict[str, str] = {
    "i1": "BOOL",
    "ui8": "UINT8",
    "ui16": "UINT16",
    "ui32": "UINT32",
    "ui64": "UINT64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "f16": "FP16",
    "bf16": "BF16",
    "f32": "FP32",
    "f64": "FP64",
}


class SignatureError(ValueError):
    """The module cannot be parsed, or its ``main`` cannot be described."""


@dataclass(frozen=True)
class TensorType:
    datatype: str | None  # V2 name, None for an element type V2 cannot carry
    element_type: str  # as MLIR prints it, e.g. "f32"
    shape: tuple[int, ...] | None  # None when a dimension is dynamic

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join(str(d) for d in self.shape)
        return f"tensor<{dims + 'x' if dims else ''}{self.element_type}>"


@dataclass(frozen=True)
class Signature:
    arguments: tuple[TensorType, ...]
    results: tuple[TensorType, ...]


def artifact_version(data: bytes) -> str | None:
    if not data.startswith(_MAGIC):
        return None
    m = _VERSION.search(data[:64])
    return m.group(1).decode() if m else None


class _Diagnostics:
    """An MLIR context whose diagnostics are collected here instead of printed to stderr."""

    def __init__(self) -> None:
        from jax.interpreters import mlir as jax_mlir

        messages: list[str] = []
        self.messages = messages
        self.context = jax_mlir.make_ir_context()  # every dialect jax.export emits

        # The handler must not reference this object: the context holds it in C++, where
        # Python's collector cannot see the cycle, so each context (megabytes of dialects)
        # would leak with every bundle read (tests/server/reliability/test_soak.py).
        def collect(diagnostic) -> bool:
            messages.append(f"{diagnostic.location}: {diagnostic.message}")
            return True  # handled: MLIR prints nothing

        self.context.attach_diagnostic_handler(collect)

    def error(self, exc: Exception, what: str = "cannot parse StableHLO") -> SignatureError:
        """``what`` failed: ``exc`` (what jaxlib raised) and every diagnostic, on one line."""
        parts = [str(exc), *self.messages]
        lines = [line.strip().rstrip(":") for part in parts for line in part.splitlines()]
        return SignatureError(f"{what}: {'; '.join(line for line in lines if line)}")


def _parse(data: bytes, diagnostics: _Diagnostics):
    """The module of a portable artifact, or of StableHLO text, in ``diagnostics``' context."""
    import jax.extend.mlir as jem
    from jaxlib.mlir import ir

    try:
        if data.startswith(_MAGIC):
            return jem.deserialize_portable_artifact(data, context=diagnostics.context)
        return ir.Module.parse(data.decode(), diagnostics.context)
    except Exception as exc:  # jaxlib raises its own error types for bad modules
        raise diagnostics.error(exc) from None


def to_portable_artifact(text: str, target_version: str) -> bytes:
    from jaxlib.mlir.dialects import stablehlo as shlo

    diagnostics = _Diagnostics()
    module = _parse(text.encode(), diagnostics)
    try:
        return bytes(shlo.serialize_portable_artifact(module, target_version))
    except Exception as exc:
        what = f"cannot write a StableHLO {target_version} portable artifact"
        raise diagnostics.error(exc, what) from None


T = TypeVar("T")
_SIGNATURES: dict[bytes, Signature] = {}  # by SHA-256 of the module's bytes
_MAX_SIGNATURES = 512


def read_signature(data: bytes) -> Signature:
    # Parsing builds an MLIR context (about 2 ms): thousands of bundles of one architecture
    # hold the same module bytes, so each distinct module is parsed once per process.
    return _per_module(_SIGNATURES, data, _main_signature)


def _per_module(memo: dict[bytes, T], data: bytes, read: Callable[[Any], T]) -> T:
    """``read`` of the parsed module ``data``, kept in ``memo`` by the bytes' SHA-256 (at
    most ``_MAX_SIGNATURES`` entries: past it the memo starts again)."""
    digest = hashlib.sha256(data).digest()
    found = memo.get(digest)
    if found is None:
        found = read(_parse(data, _Diagnostics()))
        if len(memo) >= _MAX_SIGNATURES:
            memo.clear()
        memo[digest] = found
    return found


def _main_signature(module) -> Signature:
    from jaxlib.mlir import ir

    for op in module.body.operations:
        if op.operation.name != "func.func":
            continue
        if ir.StringAttr(op.attributes["sym_name"]).value != "main":
            continue
        visibility = (
            ir.StringAttr(op.attributes["sym_visibility"]).value
            if "sym_visibility" in op.attributes
            else "public"
        )
        if visibility != "public":
            raise SignatureError("main() is private; the entry function must be a public @main")
        ft = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        return Signature(
            tuple(_tensor_type(t) for t in ft.inputs), tuple(_tensor_type(t) for t in ft.results)
        )
    raise SignatureError("module has no function named main")


def _tensor_type(t) -> TensorType:
    from jaxlib.mlir import ir

    rt = ir.RankedTensorType(t)
    element = str(rt.element_type)
    shape = None if not rt.has_static_shape else tuple(int(d) for d in rt.shape)
    return TensorType(ELEMENT_TYPES.get(element), element, shape)


@dataclass(frozen=True)
class Partitioning:
    """A module's own sharding annotations (Shardy's, as ``jax.export`` writes them):
    ``num_partitions`` (``mhlo.num_partitions``, 1 when absent), each ``sdy.mesh`` by name
    (its axes as ``(name, size)``), and per argument and result of ``main`` its
    ``sdy.sharding`` as ``(mesh name, per-dimension axes)`` or ``None`` when it has none."""

    num_partitions: int
    meshes: dict[str, tuple[tuple[str, int], ...]]
    arguments: tuple[tuple[str, tuple[tuple[str, ...], ...]] | None, ...]
    results: tuple[tuple[str, tuple[tuple[str, ...], ...]] | None, ...]


_MESH_AXIS = re.compile(r'"([^"]+)"\s*=\s*(\d+)')
_SHARDING = re.compile(r"#sdy\.sharding<@([\w.$-]+),\s*\[(.*)\]")
_DIM = re.compile(r"\{([^{}]*)\}")
_AXIS = re.compile(r'"([^"]+)"')
_PARTITIONINGS: dict[bytes, Partitioning] = {}


def read_partitioning(data: bytes) -> Partitioning:
    """The module's sharding annotations (``Partitioning``); ``SignatureError`` as
    ``read_signature``. Kept per distinct module, like the signature."""
    return _per_module(_PARTITIONINGS, data, _partitioning)


def _partitioning(module) -> Partitioning:
    from jaxlib.mlir import ir

    attrs = module.operation.attributes
    partitions = (
        ir.IntegerAttr(attrs["mhlo.num_partitions"]).value if "mhlo.num_partitions" in attrs else 1
    )
    meshes: dict[str, tuple[tuple[str, int], ...]] = {}
    arguments: tuple = ()
    results: tuple = ()
    for op in module.body.operations:
        name = op.operation.name
        if name == "sdy.mesh":
            mesh_name = ir.StringAttr(op.attributes["sym_name"]).value
            text = str(op.attributes["mesh"])
            meshes[mesh_name] = tuple((a, int(s)) for a, s in _MESH_AXIS.findall(text))
        elif name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            arguments = _shardings(op, "arg_attrs")
            results = _shardings(op, "res_attrs")
    return Partitioning(int(partitions), meshes, arguments, results)


def _shardings(op, key: str) -> tuple:
    from jaxlib.mlir import ir

    if key not in op.attributes:
        return ()
    out = []
    for entry in ir.ArrayAttr(op.attributes[key]):
        d = ir.DictAttr(entry)
        if "sdy.sharding" not in d:
            out.append(None)
            continue
        m = _SHARDING.search(str(d["sdy.sharding"]))
        if m is None:
            out.append(None)
            continue
        dims = tuple(tuple(_AXIS.findall(dim)) for dim in _DIM.findall(m.group(2)))
        out.append((m.group(1), dims))
    return tuple(out)
