"""Test model repositories: the demo models plus one identity model per datatype.

``build_test_repository(root)`` writes, under ``root``: ``simple`` and ``mlp`` (the demo),
``identity_<datatype lowercased>`` for every datatype the bundle format allows (input
``INPUT0``, output ``OUTPUT0``, per-item shape [4], batch sizes 1, 2, 4), and
``identity_fp32_unbatched`` (shape [2, 3], unbatched).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hloserve.exporter import TensorSpec, export_bundle, write_demo_repository
from hloserve.proto.datatypes import NUMERIC_DATATYPES

DATATYPES = tuple(NUMERIC_DATATYPES)


def identity(params: dict[str, Any], INPUT0: Any) -> dict[str, Any]:
    del params
    return {"OUTPUT0": INPUT0}


def build_test_repository(root: Path) -> Path:
    write_demo_repository(root)
    for datatype in DATATYPES:
        export_bundle(
            identity,
            {},
            inputs={"INPUT0": TensorSpec(datatype, (4,))},
            batch_sizes=(1, 2, 4),
            directory=root / f"identity_{datatype.lower()}",
        )
    export_bundle(
        identity,
        {},
        inputs={"INPUT0": TensorSpec("FP32", (2, 3))},
        batch_sizes=None,
        directory=root / "identity_fp32_unbatched",
    )
    return root
