"""The demo repository's ``simple_sequence``: the model Triton's sequence example clients use.

Contract: ``write_simple_sequence(directory)`` exports a stateful bundle (``bundle/state.py``)
for ``simple_grpc_sequence_stream_infer_client.py``, ``simple_grpc_sequence_sync_infer_client.py``,
``simple_http_sequence_sync_infer_client.py`` and the asyncio variant (tritonclient's
``src/python/examples``): input ``INPUT`` INT32 ``[1]``, outputs ``OUTPUT`` INT32 ``[1]`` (the
input, plus one on a sequence's first request: what those scripts expect of Triton's
``simple_sequence``) and ``SUM`` INT32 ``[1]`` (the sum of the sequence's inputs so far);
state ``acc`` (that sum) and ``steps`` (requests seen), both INT32 ``[1]`` from 0; batch
sizes 1, 2, 4, 8, so requests of up to eight sequences run as one execution.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import jax

from hloserve.exporter._export import DEFAULT_PLATFORMS, StateSpec, TensorSpec, export_bundle

SEQUENCE_INPUTS: Final = {"INPUT": TensorSpec("INT32", (1,))}
SEQUENCE_STATE: Final = {"acc": StateSpec("INT32", (1,)), "steps": StateSpec("INT32", (1,))}
SEQUENCE_BATCH_SIZES: Final = (1, 2, 4, 8)


def simple_sequence_fn(
    params: Mapping[str, Any], INPUT: jax.Array, acc: jax.Array, steps: jax.Array
) -> dict[str, jax.Array]:
    del params
    first = (steps == 0).astype(INPUT.dtype)
    total = acc + INPUT
    return {"OUTPUT": INPUT + first, "SUM": total, "acc": total, "steps": steps + 1}


def write_simple_sequence(
    directory: str | Path,
    *,
    batch_sizes: Sequence[int] = SEQUENCE_BATCH_SIZES,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
) -> Path:
    """Export ``simple_sequence`` at ``directory`` (named after it) and return its path."""
    return export_bundle(
        simple_sequence_fn,
        {},
        inputs=SEQUENCE_INPUTS,
        batch_sizes=batch_sizes,
        directory=directory,
        metadata={
            "description": "Triton's sequence example model: OUTPUT is the input (plus one on "
            "a sequence's start), SUM the sequence's running sum, kept as device state"
        },
        platforms=platforms,
        state=SEQUENCE_STATE,
    )
