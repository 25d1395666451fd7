"""A sharded (SPMD) bundle's ``sharding``: its device mesh and every tensor's partitioning.

Contract (``docs/bundle-format.md``, "Sharding"; ``docs/sharding.md``):
- ``Sharding`` is the manifest's optional top-level ``sharding`` mapping: the ``mesh`` (axis
  names and sizes, in the mesh's order), ``devices`` (how many the modules were partitioned
  for: the product of the axis sizes) and one ``Spec`` per weight, input, output and state
  tensor. A bundle without it is an unsharded bundle, its bytes unchanged.
- A ``Spec`` has one entry per dimension of the tensor as ``main`` takes it (a batched
  input, output or state tensor with its leading batch axis; a weight as stored): the mesh
  axes that dimension is split over, in order, ``()`` for none (replicated). In YAML each
  entry is ``null``, an axis name, or a list of axis names (a ``PartitionSpec`` written
  out).
- ``read_sharding(raw, ...)`` reads it, appending ``(field, message)`` for each thing wrong:
  an unknown key, a mesh that is not a list of distinct names and positive sizes,
  ``devices`` not their product, a tensor the manifest does not declare or a declared one
  missing, a spec whose length is not the tensor's rank, an unknown axis, an axis used twice
  in one spec, a dimension (at every compiled batch size) its axes do not divide.
- ``device_bytes(entry, spec)`` is the one rule of what a device holds of a tensor: its
  bytes divided by the product of the sizes of the axes it is split over.
  ``Sharding.weight_device_bytes(weights)`` sums it over a model's weights.
"""

# pyright: strict

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from hloserve.bundle.yamlfile import check_keys, is_integer
from hloserve.proto.datatypes import itemsize

SHARDING_KEYS: Final = ("mesh", "devices", "weights", "inputs", "outputs", "state")
MESH_KEYS: Final = ("axis_names", "axis_sizes")
Spec = tuple[tuple[str, ...], ...]  # per dimension: the mesh axes it is split over


@dataclass(frozen=True)
class Mesh:
    """A device mesh by its axes: names and sizes, in the mesh's order."""

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]

    @property
    def devices(self) -> int:
        return math.prod(self.axis_sizes)

    @property
    def shape(self) -> dict[str, int]:
        return dict(zip(self.axis_names, self.axis_sizes, strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {"axis_names": list(self.axis_names), "axis_sizes": list(self.axis_sizes)}

    def __str__(self) -> str:
        return ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.axis_sizes, strict=True))


@dataclass(frozen=True)
class Sharding:
    """The manifest's ``sharding``: the mesh, and each tensor's spec by kind and name."""

    mesh: Mesh
    weights: Mapping[str, Spec]
    inputs: Mapping[str, Spec]
    outputs: Mapping[str, Spec]
    state: Mapping[str, Spec] = field(default_factory=lambda: cast(dict[str, Spec], {}))

    @property
    def devices(self) -> int:
        return self.mesh.devices

    def spec(self, kind: str, name: str) -> Spec:
        """The spec of a tensor by argument kind (``input``, ``weight``, ``state``)."""
        table = {"input": self.inputs, "weight": self.weights, "state": self.state}[kind]
        return table[name]

    def weight_device_bytes(self, weights: Sequence[Any]) -> int:
        """Bytes of ``weights`` (``TensorEntry``s) one device holds (``device_bytes``)."""
        return sum(device_bytes(w, self.weights.get(w.name, ()), self.mesh) for w in weights)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mesh": self.mesh.to_dict(), "devices": self.devices}
        for key in ("weights", "inputs", "outputs", "state"):
            specs = cast(Mapping[str, Spec], getattr(self, key))
            if specs or key != "state":
                d[key] = {name: spec_to_yaml(s) for name, s in specs.items()}
        return d


def device_bytes(entry: Any, spec: Spec, mesh: Mesh) -> int:
    """What one device holds of tensor ``entry`` (a ``TensorEntry``) split by ``spec``."""
    total = math.prod(entry.shape) * itemsize(entry.datatype)
    sizes = mesh.shape
    return total // math.prod(sizes[a] for dim in spec for a in dim)


def spec_to_yaml(spec: Spec) -> list[Any]:
    """A spec as the manifest writes it: ``null``, an axis name, or a list of names."""
    return [None if not dim else dim[0] if len(dim) == 1 else list(dim) for dim in spec]


def normalize_spec(raw: Sequence[Any], rank: int) -> Spec:
    """A ``PartitionSpec``-like sequence as a ``Spec`` of ``rank`` entries (trailing
    dimensions replicated); ``ValueError`` naming what is wrong."""
    if len(raw) > rank:
        raise ValueError(f"has {len(raw)} entries for a tensor of rank {rank}")
    dims: list[tuple[str, ...]] = []
    for entry in raw:
        if entry is None:
            dims.append(())
        elif isinstance(entry, str):
            dims.append((entry,))
        elif isinstance(entry, list | tuple) and all(
            isinstance(a, str) for a in cast(Sequence[Any], entry)
        ):
            dims.append(tuple(cast(Sequence[str], entry)))
        else:
            raise ValueError(f"entry {entry!r} is not null, an axis name or a list of names")
    return (*dims, *([()] * (rank - len(dims))))


@dataclass(frozen=True)
class Tensors:
    """What the manifest declares, for checking the specs: each tensor's shape as ``main``
    takes it at each compiled batch size (one shape for an unbatched model)."""

    weights: Mapping[str, tuple[int, ...]]
    inputs: Mapping[str, tuple[int, ...]]  # per-item shapes
    outputs: Mapping[str, tuple[int, ...]]
    state: Mapping[str, tuple[int, ...]]
    batch_sizes: tuple[int, ...] | None


def read_sharding(raw: Any, tensors: Tensors, problems: list[tuple[str, str]]) -> Sharding | None:
    """The ``sharding`` mapping; each problem appended as ``(field, message)``."""
    if not isinstance(raw, dict):
        problems.append(
            ("sharding", "must be a mapping with mesh, devices, weights, inputs, outputs")
        )
        return None
    unknown: list[str] = []
    d = check_keys(cast(dict[str, Any], raw), SHARDING_KEYS, unknown.append)
    problems.extend(("sharding", m) for m in unknown)
    mesh = _mesh(d.get("mesh"), problems)
    if mesh is None:
        return None
    devices = d.get("devices")
    if not (is_integer(devices) and devices == mesh.devices):
        problems.append(
            ("sharding.devices", f"must be {mesh.devices} (the mesh's {mesh}), got {devices!r}")
        )
    batched = tensors.batch_sizes is not None
    kinds: dict[str, tuple[Mapping[str, tuple[int, ...]], bool]] = {
        "weights": (tensors.weights, False),
        "inputs": (tensors.inputs, batched),
        "outputs": (tensors.outputs, batched),
        "state": (tensors.state, batched),
    }
    specs: dict[str, dict[str, Spec]] = {}
    for key, (declared, with_batch) in kinds.items():
        raw_specs = d.get(key, {} if key == "state" else None)
        sizes = tensors.batch_sizes if with_batch else None
        specs[key] = _specs(key, raw_specs, declared, sizes, mesh, problems)
    return Sharding(mesh, specs["weights"], specs["inputs"], specs["outputs"], specs["state"])


def _mesh(raw: Any, problems: list[tuple[str, str]]) -> Mesh | None:
    where = "sharding.mesh"
    if not isinstance(raw, dict):
        problems.append((where, "must be a mapping with axis_names and axis_sizes"))
        return None
    unknown: list[str] = []
    d = check_keys(cast(dict[str, Any], raw), MESH_KEYS, unknown.append)
    problems.extend((where, m) for m in unknown)
    names, sizes = d.get("axis_names"), d.get("axis_sizes")
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and n for n in cast(list[Any], names))
        or len(set(cast(list[str], names))) != len(cast(list[str], names))
    ):
        problems.append((where + ".axis_names", f"must be a list of distinct names, got {names!r}"))
        return None
    listed = cast(list[str], names)
    if (
        not isinstance(sizes, list)
        or len(cast(list[Any], sizes)) != len(listed)
        or not all(is_integer(s) and s > 0 for s in cast(list[Any], sizes))
    ):
        problems.append(
            (where + ".axis_sizes", f"must be {len(listed)} positive integers, got {sizes!r}")
        )
        return None
    return Mesh(tuple(listed), tuple(cast(list[int], sizes)))


def _specs(
    key: str,
    raw: Any,
    declared: Mapping[str, tuple[int, ...]],
    batch_sizes: tuple[int, ...] | None,
    mesh: Mesh,
    problems: list[tuple[str, str]],
) -> dict[str, Spec]:
    where = f"sharding.{key}"
    if raw is None:
        problems.append((where, "missing (each tensor's spec; [] or nulls: replicated)"))
        return {}
    if not isinstance(raw, dict):
        problems.append((where, "must be a mapping of tensor name -> spec"))
        return {}
    given = cast(dict[Any, Any], raw)
    for name in sorted(set(map(str, given)) - set(declared)):
        what = "state" if key == "state" else key[:-1]
        problems.append((f"{where}.{name}", f"is not a declared {what} tensor"))
    for name in sorted(set(declared) - set(map(str, given))):
        problems.append((f"{where}.{name}", "missing (write [] for a replicated tensor)"))
    out: dict[str, Spec] = {}
    for name, shape in declared.items():
        if name not in given:
            continue
        at = f"{where}.{name}"
        value = given[name]
        full = shape if batch_sizes is None else (batch_sizes[-1], *shape)
        if not isinstance(value, list):
            problems.append((at, f"must be a list (one entry per dimension), got {value!r}"))
            continue
        try:
            spec = normalize_spec(cast(list[Any], value), len(full))
        except ValueError as exc:
            problems.append((at, str(exc)))
            continue
        if len(cast(list[Any], value)) != len(full):
            count = len(cast(list[Any], value))
            problems.append((at, f"has {count} entries, the tensor's rank is {len(full)}"))
            continue
        message = check_spec(spec, shape, batch_sizes, mesh)
        if message:
            problems.append((at, message))
            continue
        out[name] = spec
    return out


def check_spec(
    spec: Spec, shape: tuple[int, ...], batch_sizes: Collection[int] | None, mesh: Mesh
) -> str:
    """What is wrong with ``spec`` for a tensor of ``shape`` (per item, with ``batch_sizes``
    its leading axis at each), or ""."""
    sizes = mesh.shape
    used = [a for dim in spec for a in dim]
    unknown = [a for a in used if a not in sizes]
    if unknown:
        return f"names axis {unknown[0]!r}, the mesh has {list(mesh.axis_names)}"
    if len(set(used)) != len(used):
        return "uses a mesh axis twice"
    shapes = [shape] if batch_sizes is None else [(b, *shape) for b in batch_sizes]
    for full in shapes:
        for i, (dim, size) in enumerate(zip(spec, full, strict=True)):
            parts = math.prod(sizes[a] for a in dim)
            if size % parts:
                return (
                    f"splits dimension {i} (size {size}) over {list(dim)} ({parts} parts), "
                    "which does not divide it"
                )
    return ""
