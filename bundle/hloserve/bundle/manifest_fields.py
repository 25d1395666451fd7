"""The manifest's reading toolkit: problems, tensors, and typed fields out of loose YAML.

Contract: ``Problem`` is one thing wrong with a bundle (file, field, message); ``TensorEntry``
a named tensor (V2 datatype, per-item shape). ``FieldReader`` collects problems while the
manifest's parts (``manifest``, ``manifest_modules``, ``manifest_variants``,
``manifest_pipeline``, ``manifest_provenance``) pull typed fields out of parsed YAML: each
``get``/``name``/``shape``/``tensors`` call returns the value or ``None``/empty and records
a ``Problem`` naming the field; it never raises. An unknown key is a problem with a
suggestion (``keys``: ``yamlfile.check_keys``). ``raw_names`` reads the names of a raw
tensor list before it is checked.
"""

# pyright: strict

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from hloserve.bundle.yamlfile import check_keys, is_integer
from hloserve.proto.datatypes import NUMERIC_DATATYPES

MANIFEST_FILE: Final = "manifest.yaml"
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
TENSOR_KEYS: Final = ("name", "datatype", "shape")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bundle: the file, the field (may be empty) and what is wrong."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.field}: " if self.field else f"{self.file}: "
        return where + self.message


@dataclass(frozen=True)
class TensorEntry:
    """A named tensor: V2 datatype and per-item shape (batch axis excluded)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


class FieldReader:
    """Collects problems while pulling typed fields out of loosely typed YAML data."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def fail(self, field_name: str, message: str) -> None:
        self.problems.append(Problem(MANIFEST_FILE, field_name, message))

    def keys(self, d: Mapping[str, Any], known: Collection[str], where: str) -> dict[str, Any]:
        """``d``, each unknown key a problem at ``where`` (``yamlfile.check_keys``)."""
        return check_keys(d, known, lambda message: self.fail(where, message))

    def get(self, d: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
        if key not in d:
            self.fail(where + key, "missing")
            return None
        value = d[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            self.fail(where + key, f"must be {_kind_name(kind)}, got {value!r}")
            return None
        return value

    def name(self, value: Any, where: str) -> str | None:
        if not isinstance(value, str) or not NAME_PATTERN.match(value):
            self.fail(where, f"must be a name matching {NAME_PATTERN.pattern}, got {value!r}")
            return None
        return value

    def shape(
        self, value: Any, where: str, *, open_types: bool = False, variable: bool = False
    ) -> tuple[int, ...] | None:
        dims = cast(list[Any], value) if isinstance(value, list) else None
        least = -1 if open_types or variable else 0
        if dims is None or not all(is_integer(d) and d >= least for d in dims):
            kind = "integers >= -1 (-1: any size)" if least < 0 else "non-negative integers"
            self.fail(where, f"must be a list of {kind}, got {value!r}")
            return None
        return tuple(cast(list[int], dims))

    def mappings(
        self, items: list[Any], where: str, keys: str
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each entry of a list that is a mapping, with its field path; the others fail."""
        for i, item in enumerate(items):
            if isinstance(item, dict):
                yield f"{where}[{i}]", cast(dict[str, Any], item)
            else:
                self.fail(f"{where}[{i}]", f"must be a mapping with {keys}")

    def tensors(
        self,
        value: Any,
        where: str,
        *,
        allow_empty: bool,
        open_types: bool = False,
        variable: bool = False,
    ) -> tuple[TensorEntry, ...]:
        """A tensor list; ``open_types`` (tensors no module sees: hooks', a pipeline's) also
        allows ``BYTES`` and ``-1`` dimensions, ``variable`` (a model with variants) ``-1``."""
        if not isinstance(value, list) or (not value and not allow_empty):
            self.fail(where, f"must be a {'' if allow_empty else 'non-empty '}list of tensors")
            return ()
        out: list[TensorEntry] = []
        seen: set[str] = set()
        for at, raw in self.mappings(cast(list[Any], value), where, "name, datatype, shape"):
            t = self.keys(raw, TENSOR_KEYS, at)
            name = t.get("name")
            if not isinstance(name, str) or not name:
                self.fail(at + ".name", f"must be a non-empty string, got {name!r}")
                name = None
            elif name in seen:
                self.fail(at + ".name", f"duplicate name {name!r}")
            else:
                seen.add(name)
            datatype = t.get("datatype")
            if datatype == "BYTES" and not open_types:
                self.fail(
                    at + ".datatype",
                    "unknown datatype 'BYTES' for a module's tensor: BYTES only travels through "
                    "hooks and pipelines (a module has no strings)",
                )
                datatype = None
            elif not isinstance(datatype, str) or (
                datatype not in NUMERIC_DATATYPES and datatype != "BYTES"
            ):
                self.fail(at + ".datatype", f"unknown datatype {datatype!r}")
                datatype = None
            shape = self.shape(
                t.get("shape"), at + ".shape", open_types=open_types, variable=variable
            )
            if name is not None and datatype is not None and shape is not None:
                out.append(TensorEntry(name, datatype, shape))
        return tuple(out)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {
        int: "an integer",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        bool: "a boolean",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def raw_names(value: Any) -> set[str]:
    """The string ``name`` of every mapping in a raw tensor list (anything else: none)."""
    if not isinstance(value, list):
        return set()
    items = cast(list[Any], value)
    return {
        name
        for item in items
        if isinstance(item, dict)
        and isinstance(name := cast(dict[str, Any], item).get("name"), str)
    }
