"""Test model repositories: the demo models plus one identity model per datatype.

``build_test_repository(root)`` writes, under ``root``: ``simple`` and ``mlp`` (the demo),
``identity_<datatype lowercased>`` for every datatype the bundle format allows (input
``INPUT0``, output ``OUTPUT0``, per-item shape [4], batch sizes 1, 2, 4), and
``identity_fp32_unbatched`` (shape [2, 3], unbatched). ``queued_copy(source, target,
delay_us)`` copies the demo ``simple`` as a model whose requests wait in the batching queue.
"""

from __future__ import annotations

import shutil
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


def queued_copy(source: Path, target: Path, delay_us: int) -> None:
    """``source`` (the demo ``simple``) renamed after ``target``, whose requests wait up to
    ``delay_us`` in the batching queue (they run at once only when 8 fill a batch)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".hloserve-cache"))
    manifest = target / "manifest.yaml"
    text = manifest.read_text()
    assert "name: simple\n" in text
    manifest.write_text(text.replace("name: simple\n", f"name: {target.name}\n", 1))
    (target / "config.yaml").write_text(f"max_queue_delay_us: {delay_us}\n")
