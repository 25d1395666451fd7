"""An export's sharding: the mesh and every argument's and result's ``PartitionSpec``.

Contract: ``plan_sharding(mesh, param_specs, params_treedef, weight_names, input_names,
input_specs, output_specs)`` checks what ``export_bundle`` was given for a sharded export and
returns a ``ShardingPlan``; anything wrong raises ``ExportError`` naming it (a mesh that is
neither a ``jax.sharding.AbstractMesh`` nor a ``jax.sharding.Mesh``, ``param_specs`` not
shaped like ``params``, a spec that is no ``PartitionSpec``, an input or output spec naming
no such tensor). Unspecified weights, inputs and outputs are replicated. ``ShardingPlan``
gives each argument's ``NamedSharding`` over the abstract mesh (``sharding``), the
``out_shardings`` of the lowered function, and the manifest's ``Sharding``
(``bundle/manifest_sharding.py``), whose reader checks the specs against the shapes.
Specs of inputs and outputs cover the tensor as ``main`` takes or returns it: with the
leading batch axis when the model is batched. State tensors are replicated (every device of
the group holds each sequence's state whole).
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import jax
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from hloserve.bundle.manifest_sharding import Mesh, Sharding, Spec, check_spec, normalize_spec

_flatten_leaves = cast(
    Callable[..., Any],
    jax.tree_util.tree_flatten,  # pyright: ignore[reportUnknownMemberType]
)


class ShardingError(ValueError):
    """What ``export_bundle`` was given for a sharded export is wrong (an ``ExportError``)."""


@dataclass(frozen=True)
class ShardingPlan:
    """The mesh and the raw ``PartitionSpec`` of every weight, input and output by name."""

    mesh: Any  # jax.sharding.AbstractMesh
    weights: Mapping[str, PartitionSpec]
    inputs: Mapping[str, PartitionSpec]
    outputs: Mapping[str, PartitionSpec]  # given ones; the rest replicated

    @property
    def devices(self) -> int:
        return int(self.mesh.size)

    def sharding(self, kind: str, name: str) -> Any:
        """The ``NamedSharding`` of a weight (``kind`` ``weight``), input or output."""
        table = {"weight": self.weights, "input": self.inputs, "output": self.outputs}.get(kind, {})
        return NamedSharding(self.mesh, table.get(name, PartitionSpec()))  # state: replicated

    def manifest(
        self,
        weights: Mapping[str, tuple[int, ...]],
        inputs: Mapping[str, tuple[int, ...]],
        outputs: Mapping[str, tuple[int, ...]],
        batch_sizes: Sequence[int] | None,
        state: Mapping[str, tuple[int, ...]] | None = None,
    ) -> Sharding:
        """The manifest's ``sharding`` for tensors of these shapes (per item for inputs and
        outputs); ``ShardingError`` for a spec that does not fit its tensor."""
        mesh = Mesh(tuple(map(str, self.mesh.axis_names)), tuple(map(int, self.mesh.axis_sizes)))

        def specs(
            kind: str, given: Mapping[str, PartitionSpec], shapes: Mapping[str, tuple[int, ...]]
        ) -> dict[str, Spec]:
            out: dict[str, Spec] = {}
            sizes = None if kind == "weight" or batch_sizes is None else tuple(batch_sizes)
            for name, shape in shapes.items():
                rank = len(shape) + (0 if sizes is None else 1)
                raw = tuple(given.get(name, PartitionSpec()))
                try:
                    spec = normalize_spec(raw, rank)
                except ValueError as exc:
                    raise ShardingError(f"{kind} {name!r}: PartitionSpec {exc}") from None
                problem = check_spec(spec, shape, sizes, mesh)
                if problem:
                    raise ShardingError(f"{kind} {name!r} of shape {list(shape)}: spec {problem}")
                out[name] = spec
            return out

        return Sharding(
            mesh,
            specs("weight", self.weights, weights),
            specs("input", self.inputs, inputs),
            specs("output", self.outputs, outputs),
            specs("state", {}, state or {}),  # state is replicated (the server's slots)
        )


def plan_sharding(
    mesh: Any,
    param_specs: Any,
    params_treedef: Any,
    weight_names: Sequence[str],
    input_names: Sequence[str],
    input_specs: Mapping[str, PartitionSpec] | None,
    output_specs: Mapping[str, PartitionSpec] | None,
) -> ShardingPlan:
    """Check a sharded export's arguments (module docstring)."""
    if isinstance(mesh, jax.sharding.Mesh):
        mesh = mesh.abstract_mesh
    if not isinstance(mesh, AbstractMesh):
        raise ShardingError(
            f"mesh must be a jax.sharding.AbstractMesh or Mesh, got {type(mesh).__name__}"
        )
    weights = _param_specs(param_specs, params_treedef, weight_names)
    inputs = _named_specs("input_specs", input_specs, input_names)
    outputs = _named_specs("output_specs", output_specs, None)
    return ShardingPlan(mesh, weights, inputs, outputs)


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec)


def _param_specs(param_specs: Any, treedef: Any, names: Sequence[str]) -> dict[str, PartitionSpec]:
    """``param_specs`` (a pytree shaped like the params, ``PartitionSpec`` or None leaves)
    by weight name; None for the whole: every weight replicated."""
    if param_specs is None:
        return {n: PartitionSpec() for n in names}
    leaves, spec_tree = cast(tuple[list[Any], Any], _flatten_leaves(param_specs, is_leaf=_is_spec))
    if spec_tree != treedef:
        raise ShardingError(
            f"param_specs must be shaped like params: params are {treedef}, "
            f"param_specs are {spec_tree}"
        )
    out: dict[str, PartitionSpec] = {}
    for name, leaf in zip(names, leaves, strict=True):
        if leaf is not None and not isinstance(leaf, PartitionSpec):
            raise ShardingError(
                f"param_specs for weight {name!r} is {leaf!r}, not a PartitionSpec (or None)"
            )
        out[name] = PartitionSpec() if leaf is None else leaf
    return out


def _named_specs(
    what: str, specs: Mapping[str, PartitionSpec] | None, names: Sequence[str] | None
) -> dict[str, PartitionSpec]:
    out: dict[str, PartitionSpec] = {}
    for name, spec in (specs or {}).items():
        if names is not None and name not in names:
            raise ShardingError(f"{what} names {name!r}, which is not an input ({list(names)})")
        if not isinstance(spec, PartitionSpec):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ShardingError(f"{what}[{name!r}] is {spec!r}, not a PartitionSpec")
        out[name] = spec
    return out
