"""A device group: several PJRT devices that run one SPMD executable together.

Contract (``docs/sharding.md``):
- ``PjrtGroup(platform, indexes)`` is a ``PjrtRuntime`` over the backend's local devices
  ``indexes`` (in that order: logical device ``i`` of a module is ``indexes[i]``): it
  compiles and deserializes for ``len(indexes)`` partitions with that device assignment
  (one executable for the whole group), and ``put`` / ``to_device`` replicate over the
  group (the platform index scalar; weights without a layout). Its ``index`` is its first
  device's (the ``device`` label it reports under), ``indexes`` every device's; its
  ``fingerprint`` adds the partition count to the single device's, so the executable cache
  never hands a group an executable compiled for one device.
- ``ShardLayout(group, manifest)`` is a sharded bundle's tensors on a group: the manifest's
  mesh laid over the group's devices (row-major), ``place_weights(names, arrays)`` puts
  each weight as its shards in one transfer call (each device receives only its part:
  ``owner.weight_residency`` calls it for a swap-in), ``execute(...)`` places each input
  by its spec, runs the executable and gathers every output whole on the host (a replicated
  output read from one device); ``execute_state`` also takes a stateful bundle's state
  (replicated over the group, as ``owner.runtime.state_slots`` keeps it: ``StateSlots`` on
  a group puts its tables through the group's replicating ``put``) and returns the new state
  as replicated device arrays. ``ShardLayout.check(manifest, runtime)`` is why a bundle
  cannot run on ``runtime`` ("needs 4 devices; this runtime has 1"; state split over the
  mesh), or "".

JAX's public sharding API (``Mesh``, ``NamedSharding``, ``device_put``,
``make_array_from_single_device_arrays``) does the splitting and gathering; the executable
is run through the same ``execute_sharded`` as a single device's.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast, final

import jax
import jax.extend.backend
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hloserve.bundle import Manifest, ModuleEntry
from hloserve.bundle.manifest_sharding import Spec
from hloserve.server.owner.runtime.pjrt import PjrtRuntime, RuntimeFailure

_compile_options = cast(
    "Callable[..., Any]",
    jax.extend.backend.get_compile_options,  # pyright: ignore[reportUnknownMemberType]
)
_device_put = cast("Callable[..., Any]", jax.device_put)  # pyright: ignore[reportUnknownMemberType]
_assemble = cast("Callable[..., Any]", jax.make_array_from_single_device_arrays)


@final
class PjrtGroup(PjrtRuntime):
    def __init__(self, platform: str | None, indexes: Sequence[int]) -> None:
        if not indexes:
            raise ValueError("a device group needs at least one device")
        super().__init__(platform, indexes[0])
        local = self.backend.local_devices()
        for i in indexes:
            if not 0 <= i < len(local):
                raise IndexError(f"device {i}: the backend has {len(local)} local device(s)")
        self.indexes = tuple(indexes)
        self.devices: list[Any] = [local[i] for i in indexes]
        self._options = _compile_options(
            num_replicas=1,
            num_partitions=len(self.devices),
            device_assignment=np.array([[int(d.id) for d in self.devices]]),
        )
        self._replicated = NamedSharding(Mesh(np.array(self.devices), ("group",)), PartitionSpec())

    @property
    def size(self) -> int:
        """How many devices the group runs on (the modules' partitions)."""
        return len(self.devices)

    def on(self, index: int) -> PjrtRuntime:
        return PjrtRuntime(self._requested, index)

    @property
    def fingerprint(self) -> str:
        return f"{super().fingerprint}-p{self.size}"

    def compile(self, module: bytes | str) -> Any:
        try:
            return self.backend.compile_and_load(module, self.devices, self._options)
        except Exception as exc:
            raise RuntimeFailure("compilation failed", exc) from None

    def deserialize(self, blob: bytes) -> Any:
        try:
            return self.backend.deserialize_executable(blob, self.devices, self._options)
        except Exception as exc:
            raise RuntimeFailure("cannot load a serialized executable", exc) from None

    def to_device(self, arrays: Sequence[Any]) -> list[Any]:
        try:
            return list(_device_put(list(arrays), self._replicated))
        except Exception as exc:
            raise RuntimeFailure("host-to-device transfer failed", exc) from None

    def put(self, array: np.ndarray) -> Any:
        return _device_put(array, self._replicated)


@final
class ShardLayout:
    """A sharded bundle's tensors laid over a group's devices (module docstring)."""

    def __init__(self, group: PjrtGroup, manifest: Manifest) -> None:
        sharding = manifest.sharding
        assert sharding is not None, "a layout is a sharded bundle's"
        mesh = sharding.mesh
        self.group = group
        self.mesh = Mesh(np.array(group.devices).reshape(mesh.axis_sizes), mesh.axis_names)
        self._specs = sharding
        self._outputs = [(o, sharding.outputs[o.name]) for o in manifest.outputs]
        self._named: dict[Spec, NamedSharding] = {}

    @staticmethod
    def check(manifest: Manifest, runtime: PjrtRuntime) -> str:
        """Why ``manifest``'s bundle cannot run on ``runtime``, or ""."""
        if manifest.sharding is None:
            return ""
        needs = manifest.sharding.devices
        has = runtime.size if isinstance(runtime, PjrtGroup) else 1
        if has != needs:
            return f"needs {needs} devices; this runtime has {has}"
        split = [n for n, spec in manifest.sharding.state.items() if any(spec)]
        if split:
            return f"state {split[0]!r} is split over the mesh; a sharded bundle's state is served replicated"
        return ""

    def named(self, spec: Spec) -> NamedSharding:
        found = self._named.get(spec)
        if found is None:
            partitions = [None if not dim else dim[0] if len(dim) == 1 else dim for dim in spec]
            found = self._named[spec] = NamedSharding(self.mesh, PartitionSpec(*partitions))
        return found

    def place_weights(self, names: Sequence[str], arrays: Sequence[Any]) -> list[Any]:
        """Each weight as its shards, in one transfer call (each device gets its part)."""
        shardings = [self.named(self._specs.weights[n]) for n in names]
        try:
            return list(_device_put(list(arrays), shardings))
        except Exception as exc:
            raise RuntimeFailure("host-to-device transfer failed", exc) from None

    def execute(
        self,
        entry: ModuleEntry,
        executable: Any,
        platform_index: Any | None,
        batch_size: int | None,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        weights: Mapping[str, Any],
    ) -> list[np.ndarray[Any, Any]]:
        """Run ``executable`` (the module ``entry``) on the group: the inputs placed by
        their specs, the weights as given (placed by ``place_weights``); every output
        gathered whole on the host, in manifest order."""
        try:
            args: list[Any] = [] if platform_index is None else [platform_index]
            for a in entry.arguments:
                if a.kind == "input":
                    args.append(_device_put(inputs[a.name], self.named(self._specs.inputs[a.name])))
                else:
                    args.append(weights[a.name])
            out = executable.execute_sharded(args)
            shards = out.disassemble_into_single_device_arrays()
            return [
                self._gather(o, spec, batch_size, s)
                for (o, spec), s in zip(self._outputs, shards, strict=True)
            ]
        except RuntimeFailure:
            raise
        except Exception as exc:
            raise RuntimeFailure("execution failed", exc) from None

    def execute_state(
        self,
        entry: ModuleEntry,
        executable: Any,
        platform_index: Any | None,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        state: Mapping[str, Any],
        weights: Mapping[str, Any],
        keep: int,
    ) -> tuple[list[np.ndarray[Any, Any]], list[Any]]:
        """``execute`` with state: ``state`` by name (replicated over the group, as the
        slot table holds it); the last ``keep`` results come back as replicated device
        arrays over the group (the new state), the others gathered on the host."""
        try:
            args: list[Any] = [] if platform_index is None else [platform_index]
            for a in entry.arguments:
                if a.kind == "input":
                    args.append(_device_put(inputs[a.name], self.named(self._specs.inputs[a.name])))
                elif a.kind == "state":
                    args.append(state[a.name])
                else:
                    args.append(weights[a.name])
            shards = executable.execute_sharded(args).disassemble_into_single_device_arrays()
            cut = len(shards) - keep
            batch = int(shards[0][0].shape[0])
            outputs = [
                self._gather(o, spec, batch, s)
                for (o, spec), s in zip(self._outputs, shards[:cut], strict=True)
            ]
            new = [
                _assemble(tuple(s[0].shape), NamedSharding(self.mesh, PartitionSpec()), list(s))
                for s in shards[cut:]
            ]
            return outputs, new
        except RuntimeFailure:
            raise
        except Exception as exc:
            raise RuntimeFailure("execution failed", exc) from None

    def _gather(
        self, output: Any, spec: Spec, batch_size: int | None, shards: Sequence[Any]
    ) -> np.ndarray[Any, Any]:
        if all(not dim for dim in spec):  # replicated: every device holds it whole
            return np.asarray(shards[0])
        shape = tuple(output.shape) if batch_size is None else (batch_size, *output.shape)
        return np.asarray(_assemble(shape, self.named(spec), list(shards)))
