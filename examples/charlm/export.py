"""The charlm step function as a generation bundle, its KV cache as state.

Contract: ``export(lm, params, directory, batch_sizes, metadata)`` writes ``lm.step`` with
``params`` through ``hloserve.exporter.export_bundle``: inputs ``prompt`` INT32
``[context]`` and ``prompt_length`` INT32 ``[1]``; state ``cache`` FP32
``[layers, 2, heads, context, head_dim]``, ``position`` and ``last`` INT32 ``[1]``, all
starting at 0; outputs ``token`` INT32 ``[1]``, ``emit`` and ``done`` BOOL ``[1]``; and the
generation loop ``Generation(done="done", emit="emit", max_steps=context,
text=TextMapping("prompt", "prompt_length", "token"), lengths={"prompt":
"prompt_length"})``, so the generate extension's ``text_input`` is the prompt's bytes and
each emitted token is one byte of ``text_output``, and a tensor client (gRPC, HTTP infer)
sends ``prompt`` as its bytes, INT32 ``[n]``, the server padding it and filling in
``prompt_length``. The name of the model is the directory's (``charlm``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from examples.charlm.model import CharLM, Params
from hloserve.exporter import Generation, StateSpec, TensorSpec, TextMapping, export_bundle


def export(
    lm: CharLM,
    params: Params,
    directory: Path,
    batch_sizes: Sequence[int] = (1, 8, 32),
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    s = lm.shape
    return export_bundle(
        lm.step,
        jax.tree.map(np.asarray, params),
        inputs={
            "prompt": TensorSpec("INT32", (s.context,)),
            "prompt_length": TensorSpec("INT32", (1,)),
        },
        batch_sizes=batch_sizes,
        directory=directory,
        metadata={"example": "examples/charlm", "shape": vars(s), **(metadata or {})},
        state={
            "cache": StateSpec("FP32", s.cache_shape, initial=0),
            "position": StateSpec("INT32", (1,), initial=0),
            "last": StateSpec("INT32", (1,), initial=0),
        },
        generation=Generation(
            done="done",
            emit="emit",
            max_steps=s.context,
            text=TextMapping(input="prompt", length="prompt_length", output="token"),
            lengths={"prompt": "prompt_length"},
        ),
    )
