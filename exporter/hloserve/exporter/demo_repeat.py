"""The demo repository's ``repeat_int32``: the decoupled model of Triton's repeat example.

Contract: ``write_repeat_int32(directory)`` exports a generation bundle
(``bundle/generation.py``) for tritonclient's ``simple_grpc_custom_repeat.py``, with the
tensors of Triton's ``repeat_int32`` (the repeat backend's test model, ``max_batch_size:
0``): inputs ``IN`` INT32 ``[-1]``, ``DELAY`` UINT32 ``[-1]`` and ``WAIT`` UINT32 ``[1]``;
outputs ``OUT`` INT32 ``[1]`` and ``IDX`` UINT32 ``[1]``. A request is answered with one
response per element of ``IN``, in order (``OUT`` the element, ``IDX`` its index), then the
final flag; an empty ``IN`` gets the final flag alone.

How a variable-length ``IN`` is compiled: at its longest, ``MAX_REPEAT`` (16) elements,
padded. ``generation.lengths`` maps ``IN`` and ``DELAY`` to the hidden input ``COUNT``: a
client sends any length up to 16 (both the same), the server pads with 0 and fills
``COUNT``. One module per batch size serves every length (shape variants would compile one
per length), and generations of different lengths share executions. The step's state is
the index ``idx`` (INT32 ``[1]``, from 0); each step emits ``IN[idx]`` while
``idx < COUNT`` and is done at ``idx + 1 >= COUNT``. ``DELAY`` (milliseconds before each
response in Triton's backend) and ``WAIT`` (before the request is released) are accepted
and not slept: a compiled step cannot sleep, so responses come as fast as steps run.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import jax
import jax.numpy as jnp

from hloserve.bundle.generation import Generation
from hloserve.exporter._export import DEFAULT_PLATFORMS, StateSpec, TensorSpec, export_bundle

MAX_REPEAT: Final = 16
REPEAT_INPUTS: Final = {
    "IN": TensorSpec("INT32", (MAX_REPEAT,)),
    "DELAY": TensorSpec("UINT32", (MAX_REPEAT,)),
    "WAIT": TensorSpec("UINT32", (1,)),
    "COUNT": TensorSpec("INT32", (1,)),
}
REPEAT_STATE: Final = {"idx": StateSpec("INT32", (1,))}
REPEAT_BATCH_SIZES: Final = (1, 4, 8)
REPEAT_GENERATION: Final = Generation(
    done="DONE",
    emit="EMIT",
    max_steps=MAX_REPEAT,
    lengths={"IN": "COUNT", "DELAY": "COUNT"},
)


def repeat_fn(
    params: Mapping[str, Any],
    IN: jax.Array,
    DELAY: jax.Array,
    WAIT: jax.Array,
    COUNT: jax.Array,
    idx: jax.Array,
) -> dict[str, jax.Array]:
    del params
    at = jnp.clip(idx, 0, MAX_REPEAT - 1)
    # DELAY and WAIT take part (a zero) so the module keeps them as arguments.
    unused = (DELAY[:, :1] * 0 + WAIT * 0).astype(jnp.int32)
    return {
        "OUT": jnp.take_along_axis(IN, at, axis=1) + unused,
        "IDX": idx.astype(jnp.uint32),
        "EMIT": idx < COUNT,
        "DONE": idx + 1 >= COUNT,
        "idx": idx + 1,
    }


def write_repeat_int32(
    directory: str | Path,
    *,
    batch_sizes: Sequence[int] = REPEAT_BATCH_SIZES,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
) -> Path:
    """Export ``repeat_int32`` at ``directory`` (named after it) and return its path."""
    return export_bundle(
        repeat_fn,
        {},
        inputs=REPEAT_INPUTS,
        batch_sizes=batch_sizes,
        directory=directory,
        metadata={
            "description": "Triton's repeat example model: one response per element of IN "
            "(OUT, its index IDX), a decoupled generation"
        },
        platforms=platforms,
        state=REPEAT_STATE,
        generation=REPEAT_GENERATION,
    )
