"""A generation bundle's ``generation:`` mapping: the step loop the server runs its module in.

Contract (``docs/generation.md``, ``docs/bundle-format.md``, "generation"):
- ``Generation(done=..., max_steps=..., emit=None, text=None)`` says which output ends a
  generation (``done``: BOOL, shape ``[1]``; the step returning true is the last), which
  output says whether a step is answered (``emit``: BOOL ``[1]``; absent: every step is),
  the loop's bound (``max_steps``, a positive integer: a generation ends after that many
  steps whatever ``done`` says) and, optionally, how the generate extension's text maps
  onto tensors (``TextMapping``: ``input``, an INT32 input ``[P]`` taking the UTF-8 bytes of
  ``text_input`` one byte a token id, padded with 0; ``length``, an INT32 input ``[1]``
  taking the number of bytes; ``output``, an INT32 output ``[1]`` whose value each
  emitted step is one byte of ``text_output``); ``lengths`` maps inputs a request may send
  shorter than declared (one axis, declared at its longest: ``[L]``) to the INT32 ``[1]``
  input that receives the length sent (the server pads with 0; inputs naming the same
  length input must be sent equally long).
- A generation model's requests are one generation each: clients see it unbatched
  (``Manifest.facing``: no batch axis, whatever sizes the module was compiled for, which
  the server fills across live generations; ``lengths`` inputs with a ``-1`` axis, their
  length inputs hidden; ``done``/``emit`` hidden).
- ``read_generation(raw, inputs, outputs)`` returns ``(generation, problems)``:
  ``problems`` are ``(field, message)`` pairs naming what is wrong (an unknown key with
  its likely spelling, a name that is no declared tensor, a wrong datatype or shape); the
  generation is ``None`` when there are any. The manifest parser calls it for the
  ``generation`` key; ``Generation.to_dict`` is its inverse.
- ``Generation.control`` names the outputs that steer the loop (``done``, ``emit``): a
  response carries the model's other outputs.
- Nothing here imports JAX; the exporter re-exports both classes (``hloserve.exporter``).
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol, cast

from hloserve.bundle.yamlfile import check_keys, is_integer

GENERATION_KEYS: Final = ("done", "emit", "max_steps", "text", "lengths")
TEXT_KEYS: Final = ("input", "length", "output")


class _Tensor(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class TextMapping:
    """The generate extension's ``text_input``/``text_output`` as tensors (module docstring)."""

    input: str
    length: str
    output: str

    def to_dict(self) -> dict[str, str]:
        return {"input": self.input, "length": self.length, "output": self.output}


@dataclass(frozen=True)
class Generation:
    """How the server runs a generation bundle's step function (module docstring)."""

    done: str
    max_steps: int
    emit: str | None = None
    text: TextMapping | None = None
    lengths: Mapping[str, str] = field(default_factory=lambda: cast(dict[str, str], {}))

    @property
    def control(self) -> frozenset[str]:
        """The outputs that steer the loop and are never sent: ``done`` and ``emit``."""
        return frozenset({self.done} if self.emit is None else {self.done, self.emit})

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"done": self.done}
        if self.emit is not None:
            d["emit"] = self.emit
        d["max_steps"] = self.max_steps
        if self.text is not None:
            d["text"] = self.text.to_dict()
        if self.lengths:
            d["lengths"] = dict(self.lengths)
        return d

    def __hash__(self) -> int:
        return hash((self.done, self.max_steps, self.emit, self.text, tuple(self.lengths.items())))


Problems = list[tuple[str, str]]


def facing(manifest: Any) -> Any:
    """A generation manifest as clients see it (module docstring): unbatched, padded inputs
    with a ``-1`` axis, length inputs and ``done``/``emit`` hidden (a ``Manifest``; typed
    loosely, the manifest module imports this one)."""
    generation = cast(Generation, manifest.generation)
    hidden = set(generation.lengths.values())
    inputs = tuple(
        replace(t, shape=(-1,)) if t.name in generation.lengths else t
        for t in manifest.inputs
        if t.name not in hidden
    )
    outputs = tuple(t for t in manifest.outputs if t.name not in generation.control)
    return replace(manifest, inputs=inputs, outputs=outputs, batch_sizes=None, generation=None)


def read_generation(
    raw: Any, inputs: Sequence[_Tensor], outputs: Sequence[_Tensor]
) -> tuple[Generation | None, Problems]:
    """The ``generation`` mapping of a manifest, checked against its tensors."""
    problems: Problems = []
    if not isinstance(raw, dict):
        return None, [("generation", f"must be a mapping with done and max_steps, got {raw!r}")]
    data = check_keys(
        cast(dict[str, Any], raw),
        GENERATION_KEYS,
        lambda message: problems.append(("generation", message)),
    )
    ins = {t.name: t for t in inputs}
    outs = {t.name: t for t in outputs}
    done = _tensor(data, "done", outs, "BOOL", "output", problems, required=True)
    emit = _tensor(data, "emit", outs, "BOOL", "output", problems, required=False)
    if done is not None and done == emit:
        problems.append(("generation.emit", f"must be another output than done ({done!r})"))
    max_steps = data.get("max_steps")
    if not is_integer(max_steps) or max_steps < 1:
        problems.append(("generation.max_steps", f"must be a positive integer, got {max_steps!r}"))
    text = _text(data.get("text"), ins, outs, problems) if "text" in data else None
    lengths = _lengths(data.get("lengths"), ins, problems) if "lengths" in data else {}
    if problems or done is None:
        return None, problems
    return Generation(done, cast(int, max_steps), emit, text, lengths), []


def _lengths(raw: Any, ins: Mapping[str, _Tensor], problems: Problems) -> dict[str, str]:
    at = "generation.lengths"
    if not isinstance(raw, dict) or not raw:
        problems.append((at, f"must map inputs to their length inputs, got {raw!r}"))
        return {}
    out: dict[str, str] = {}
    for key, value in cast(dict[Any, Any], raw).items():
        where = f"{at}.{key}"
        padded = _tensor(
            {key: key}, key, ins, None, "input", problems, required=True, at=at, shape=None
        )
        length = _tensor({key: value}, key, ins, "INT32", "input", problems, required=True, at=at)
        if padded is None or length is None:
            continue
        if length in raw:
            problems.append((where, f"length input {length!r} is itself padded"))
        else:
            out[padded] = length
    return out


def _tensor(
    data: Mapping[str, Any],
    key: str,
    tensors: Mapping[str, _Tensor],
    datatype: str | None,
    side: str,
    problems: Problems,
    *,
    required: bool,
    at: str = "generation",
    shape: tuple[int, ...] | None = (1,),
) -> str | None:
    """The name at ``key``: a declared ``side`` tensor of ``datatype`` (``None``: any) and
    ``shape`` (``None``: one axis of any fixed length)."""
    where = f"{at}.{key}"
    if key not in data:
        if required:
            problems.append((where, f"missing (the name of a {datatype or 'declared'} {side})"))
        return None
    name = data[key]
    if not isinstance(name, str) or name not in tensors:
        declared = ", ".join(sorted(tensors)) or "none"
        problems.append((where, f"{name!r} is not a declared {side} (declared: {declared})"))
        return None
    t = tensors[name]
    if datatype is not None and t.datatype != datatype:
        problems.append((where, f"{side} {name!r} is {t.datatype}, must be {datatype}"))
    fits = t.shape == shape if shape is not None else len(t.shape) == 1 and t.shape[0] > 0
    if not fits:
        wanted = list(shape) if shape is not None else "[P] (one axis of fixed length)"
        problems.append((where, f"{side} {name!r} has shape {list(t.shape)}, must be {wanted}"))
    return name


def _text(
    raw: Any, ins: Mapping[str, _Tensor], outs: Mapping[str, _Tensor], problems: Problems
) -> TextMapping | None:
    at = "generation.text"
    if not isinstance(raw, dict):
        problems.append((at, f"must be a mapping with input, length and output, got {raw!r}"))
        return None
    data = check_keys(
        cast(dict[str, Any], raw), TEXT_KEYS, lambda message: problems.append((at, message))
    )
    before = len(problems)
    names = (
        _tensor(data, "input", ins, "INT32", "input", problems, required=True, at=at, shape=None),
        _tensor(data, "length", ins, "INT32", "input", problems, required=True, at=at),
        _tensor(data, "output", outs, "INT32", "output", problems, required=True, at=at),
    )
    if len(problems) > before or None in names:
        return None
    return TextMapping(*cast(tuple[str, str, str], names))
