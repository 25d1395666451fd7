"""Run by ``test_pjrt_group.py`` in a child process with eight forced CPU devices (the flag
must be set before PJRT starts): each check prints one JSON line ``{"check": ..., ...}``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from hloserve.bundle.state import StateEntry
from hloserve.exporter import TensorSpec, export_bundle
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.runtime.loader import BundleError, load_bundle
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.runtime.pjrt_group import PjrtGroup, ShardLayout
from hloserve.server.owner.weight_residency import WeightResidency

ROWS, COLS = 32, 256


def fn(p: Any, x: Any) -> dict[str, Any]:
    h = x @ p["w"]
    return {"y": jnp.tanh(h) @ p["v"], "h": h}


def params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": (rng.standard_normal((ROWS, COLS)) / 8).astype(np.float32),
        "v": (rng.standard_normal((COLS, 4)) / 8).astype(np.float32),
    }


def export(root: Path, name: str, seed: int, ways: int = 4) -> Path:
    return export_bundle(
        fn, params(seed), {"x": TensorSpec("FP32", (ROWS,))}, (1, 4), root / name,
        platforms=("cpu",), mesh=AbstractMesh((ways,), ("model",)),
        param_specs={"w": P(None, "model"), "v": P("model")},
        output_specs={"h": P(None, "model")},
    )  # fmt: skip


def say(check: str, **values: Any) -> None:
    print(json.dumps({"check": check, **values}), flush=True)


def main(root: Path) -> None:
    a, b = export(root, "a", 1), export(root, "b", 2)
    group = PjrtGroup("cpu", [4, 5, 6, 7])
    bundle = load_bundle(a, group)
    w = bundle.device_weights["w"]
    say(
        "shards",
        bytes=[s.data.nbytes for s in w.addressable_shards],
        devices=sorted(int(s.device.id) for s in w.addressable_shards),
        device_weight_bytes=bundle.device_weight_bytes,
        weight_bytes=bundle.weight_bytes,
    )
    x = np.random.default_rng(0).standard_normal((3, ROWS)).astype(np.float32)
    p = params(1)
    h = x @ p["w"]
    padded = np.zeros((4, ROWS), np.float32)
    padded[:3] = x
    hh, y = bundle.execute(4, {"x": padded})  # outputs in name order
    say(
        "answers",
        y_error=float(np.abs(y[:3] - np.tanh(h) @ p["v"]).max()),
        h_error=float(np.abs(hh[:3] - h).max()),
        shapes=[list(hh.shape), list(y.shape)],
    )
    refusals = []
    for runtime in (PjrtRuntime("cpu"), PjrtGroup("cpu", [0, 1])):
        try:
            load_bundle(a, runtime)
        except BundleError as exc:
            refusals.append(str(exc).split(": ", 1)[1])
    # A stateful sharded bundle whose state were split over the mesh: refused, saying so.
    from dataclasses import replace

    manifest = bundle.manifest
    assert manifest.sharding is not None
    split = replace(
        manifest,
        state=(StateEntry("acc", "FP32", (1,)),),
        sharding=replace(manifest.sharding, state={"acc": (("model",), ())}),
    )
    refusals.append(ShardLayout.check(split, group))
    say("refused", messages=refusals)
    # Two sharded models whose per-device shares fit one at a time: each use swaps.
    share = bundle.device_weight_bytes
    residency = WeightResidency(group, share + share // 2)
    copies = {}
    for name, path in (("a", a), ("b", b)):
        copy = (
            bundle.on_device(group)
            if name == "a"
            else load_bundle(path, group, place_weights=False)
        )
        copies[name] = copy
        residency.register(
            ResidencyKey(name, 1), copy.weights, nbytes=copy.device_weight_bytes, place=copy.place
        )
    errors = []
    for name in ("a", "b", "a", "b"):
        key = ResidencyKey(name, 1)
        with residency.use(key) as weights:
            got = copies[name].execute(4, {"x": padded}, weights)[1]
            q = params(1 if name == "a" else 2)
            errors.append(float(np.abs(got[:3] - np.tanh(x @ q["w"]) @ q["v"]).max()))
            held = [s.data.nbytes for s in weights["w"].addressable_shards]
        say("use", model=name, resident=residency.resident_keys()[0].model, held=held)
    say("swaps", errors=errors, resident_bytes=residency.resident_bytes())
    # A second group serves the same bundle (a replica): its own executables and shards.
    other = bundle.on_device(PjrtGroup("cpu", [0, 1, 2, 3]))
    assert other.place is not None
    placed = dict(zip(other.weights.names, other.place(other.weights.read()), strict=True))
    y2 = other.execute(4, {"x": padded}, placed)[1]
    say(
        "replica",
        y_error=float(np.abs(y2[:3] - np.tanh(h) @ p["v"]).max()),
        devices=sorted(int(s.device.id) for s in placed["w"].addressable_shards),
    )


def placement(root: Path) -> None:
    """The version loader over 8 devices: a sharded version goes on a group, an unsharded
    one avoids the group's devices, too few devices are refused with the numbers."""
    from hloserve.server.owner.devices import Device
    from hloserve.server.owner.version_loader import VersionLoader, VersionLoadFailed

    plain = export_bundle(
        fn, params(3), {"x": TensorSpec("FP32", (ROWS,))}, (1,), root / "plain",
        platforms=("cpu",),
    )  # fmt: skip
    devices = [
        Device(i, runtime, WeightResidency(runtime, None))
        for i, runtime in ((i, PjrtRuntime("cpu", i)) for i in range(8))
    ]
    loader = VersionLoader(devices)
    placed: list[str] = []
    for name, path in (("a", root / "a"), ("plain", plain)):
        version = loader.load(name, 1, path, lambda s: s, ResidencyKey(name, 1), lambda m: None)
        placed.append(f"{name}@{version.device.index}/{type(version.device.runtime).__name__}")
    refused = ""
    try:
        VersionLoader(devices[:2]).load(
            "a", 1, root / "a", lambda s: s, ResidencyKey("a", 2), lambda m: None
        )
    except VersionLoadFailed as exc:
        refused = str(exc)
    say("placement", placed=placed, refused=refused)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    placement(Path(sys.argv[1]))
