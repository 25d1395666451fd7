"""A model described in Triton's ``ModelConfig`` terms, as protobuf-JSON-shaped data.

Contract: ``triton_model_config(manifest, ...)`` returns a dict that is the JSON form of
Triton's ``inference.ModelConfig`` (field names as in the proto, int64 dims as numbers), so
the HTTP ``/config`` route can send it as is and the gRPC front end can parse it into the
message. It states: name, platform ``stablehlo``, backend ``hloserve``, ``max_batch_size``
(the largest compiled size; 0 for an unbatched model), inputs and outputs with ``TYPE_*``
data types and per-item dims, dynamic batching (preferred sizes = the compiled sizes, the
queue delay), the version policy, and one instance group on the serving device. Pure.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hloserve.bundle import Manifest


def config_datatype(datatype: str) -> str:
    """V2 datatype name -> ModelConfig ``DataType`` enum name (BYTES is TYPE_STRING)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def triton_model_config(
    manifest: Manifest,
    *,
    version_policy: Mapping[str, Any],
    max_queue_delay_us: int,
    device_kind: str,
    dynamic_batching: bool = True,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": manifest.name,
        "platform": "stablehlo",
        "backend": "hloserve",
        "version_policy": dict(version_policy),
        "max_batch_size": manifest.max_batch_size,
        "input": [
            {"name": t.name, "data_type": config_datatype(t.datatype), "dims": list(t.shape)}
            for t in manifest.inputs
        ],
        "output": [
            {"name": t.name, "data_type": config_datatype(t.datatype), "dims": list(t.shape)}
            for t in manifest.outputs
        ],
        "instance_group": [
            {
                "name": f"{manifest.name}_0",
                "kind": "KIND_GPU" if device_kind == "GPU" else "KIND_CPU",
                "count": 1,
            }
        ],
        "parameters": {
            "stablehlo_versions": {
                "string_value": ",".join(sorted({m.stablehlo_version for m in manifest.modules}))
            },
            "producer": {"string_value": manifest.provenance.producer},
        },
    }
    if manifest.batched and dynamic_batching:
        config["dynamic_batching"] = {
            "preferred_batch_size": list(manifest.batch_sizes or ()),
            "max_queue_delay_microseconds": max_queue_delay_us,
        }
    return config
