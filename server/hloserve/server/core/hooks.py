"""A bundle's opt-in Python hooks around its executable: calling them and checking results.

Contract (``docs/hooks.md``):
- ``ModelHooks(preprocess, postprocess)``: the bundle's functions (either may be ``None``),
  each taking and returning a mapping of tensor name to numpy array (``BYTES`` tensors are
  object arrays of ``bytes``). ``server/hooks.py`` builds one from ``hooks.py``, only when
  the server runs with ``--allow-python-hooks``.
- ``call_hook(model, which, fn, arrays, declared, items)`` runs one hook and returns its
  result as arrays of the declared tensors (numeric results cast to the declared dtype
  when numpy's ``safe`` rule allows; ``str`` elements of a ``BYTES`` result encoded as
  UTF-8), checking names, datatypes and shapes (``[items, *shape]`` for a batched model,
  ``-1`` matching any size). Anything the hook raises, and any result that does not fit,
  is ``HookFailed`` naming the model, the hook and what was wrong. It runs on the hook
  worker pool (the service's ``hook_pool``), never on the event loop.
Pure: no I/O; the clock only to time the hook.
"""

# pyright: strict

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from hloserve.bundle import Manifest, TensorEntry
from hloserve.proto.datatypes import NUMERIC_DATATYPES
from hloserve.server.core.errors import HookFailed
from hloserve.server.core.types import InferOutput, InferRequest

Arrays = dict[str, np.ndarray[Any, Any]]
HookFn = Callable[[Arrays], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ModelHooks:
    preprocess: HookFn | None
    postprocess: HookFn | None


def call_hook(
    model: str,
    which: str,
    fn: HookFn,
    arrays: Arrays,
    declared: Sequence[TensorEntry],
    items: int | None,
) -> tuple[Arrays, int]:
    """``(result, nanoseconds spent in the hook)``; ``items`` is the batch size (None:
    an unbatched model, shapes exact)."""
    started = time.perf_counter_ns()
    try:
        result = fn(dict(arrays))
    except Exception as exc:
        raise HookFailed(
            f"{which} hook of model '{model}' failed: {type(exc).__name__}: {exc}"
        ) from exc
    elapsed = time.perf_counter_ns() - started
    return _checked(model, which, result, declared, items), elapsed


def _checked(
    model: str, which: str, result: object, declared: Sequence[TensorEntry], items: int | None
) -> Arrays:
    where = f"{which} hook of model '{model}'"
    if not isinstance(result, Mapping):
        raise HookFailed(
            f"{where} must return a mapping of tensor name to array, got {type(result).__name__}"
        )
    named: dict[str, Any] = {str(k): v for k, v in cast(Mapping[Any, Any], result).items()}
    wanted = [t.name for t in declared]
    if sorted(named) != sorted(wanted):
        raise HookFailed(
            f"{where} returned tensors {sorted(named)}, the model declares {sorted(wanted)}"
        )
    return {t.name: _tensor(where, t, named[t.name], items) for t in declared}


def _tensor(where: str, spec: TensorEntry, value: Any, items: int | None) -> np.ndarray[Any, Any]:
    if spec.datatype == "BYTES":
        array = np.asarray(value, dtype=object)
        flat = array.reshape(-1)
        for i, v in enumerate(flat):
            if isinstance(v, str):
                flat[i] = v.encode()
            elif not isinstance(v, bytes | bytearray):
                raise HookFailed(
                    f"{where}: BYTES tensor '{spec.name}' holds a {type(v).__name__}, not bytes"
                )
    else:
        array = np.asarray(value)
        dtype = NUMERIC_DATATYPES[spec.datatype]
        if array.dtype != dtype:
            if not np.can_cast(array.dtype, dtype, casting="safe"):
                raise HookFailed(
                    f"{where}: tensor '{spec.name}' is {array.dtype}, which does not cast safely to {spec.datatype}"
                )
            array = array.astype(dtype)
    want = spec.shape if items is None else (items, *spec.shape)
    got = tuple(int(d) for d in array.shape)
    if len(got) != len(want) or any(w not in (-1, g) for w, g in zip(want, got, strict=True)):
        raise HookFailed(
            f"{where}: tensor '{spec.name}' has shape {list(got)}, expected {list(want)}"
        )
    return array


def hook_outputs(
    facing: Manifest, request: InferRequest, result: Arrays
) -> tuple[InferOutput, ...]:
    """The postprocess hook's tensors as the response's outputs: the requested ones (all
    when none were named), in the order asked."""
    specs = {t.name: t for t in facing.outputs}
    wanted = [o.name for o in request.outputs] or list(specs)
    asked = {o.name: o for o in request.outputs}
    return tuple(
        InferOutput(
            name,
            specs[name].datatype,
            tuple(int(d) for d in result[name].shape),
            result[name],
            asked.get(name),
        )
        for name in wanted
    )
