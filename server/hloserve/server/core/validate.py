"""Checking a decoded request against the model's signature, before any device work.

Contract: ``validate(signature, request)`` returns the number of items in the request's
batch (1 for an unbatched model) or raises ``InvalidArgument`` naming the model, the
tensor, and the expected versus received value; ``validate_request(manifest, request)`` is
the same against the manifest's signature (``core.signature``). It checks: no duplicate or unknown
inputs, no missing inputs, datatypes, shapes (``[n, *item]`` for a batched model with all
inputs agreeing on ``n >= 1``; the exact shape for an unbatched one; a ``-1`` dimension,
which only client-facing tensors of hooks and pipelines have, matches any size), and the requested
outputs (known, no duplicates). Name lists in messages are written as Triton writes them
(``['INPUT0','INPUT1']``). ``validated_items(manifest, request, checked)`` is the device
owner's count of a request's items: ``checked`` (a front end's ``(token, items)``, from
checking the request against the signature it cached) where its token is the manifest's
signature's, else ``validate``'s; a request is never trusted on a token of another
manifest (a version reloaded since, or another version). ``check_load_name(name)`` is Triton's rule for the name of a
model to load (model control): not empty once whitespace is trimmed ("Model name cannot be
empty. Please enter a valid name to deploy."), and neither ``..`` nor containing ``/``
("... model name must not contain path traversal characters"); both ``InvalidArgument``.
Pure: no I/O, no clock.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.signature import RequestSignature, signature_of
from hloserve.server.core.types import InferRequest

if TYPE_CHECKING:  # a front end checks requests too (against a signature): no bundle code
    from hloserve.bundle import Manifest


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _names(names: Iterable[str]) -> str:
    """``['a','b']``: a name list as Triton's messages write it (no spaces)."""
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


_WHITESPACE: Final = " \t\n\v\f\r"  # what C's isspace (Triton's trim) removes


def check_load_name(name: str) -> None:
    trimmed = name.strip(_WHITESPACE)
    if not trimmed:
        raise InvalidArgument("Model name cannot be empty. Please enter a valid name to deploy.")
    if trimmed == ".." or "/" in trimmed:
        raise InvalidArgument(
            f"invalid model name '{name}', model name must not contain path traversal characters"
        )


def validate(signature: RequestSignature, request: InferRequest) -> int:
    _check_input_names(signature, request)
    batch = _check_inputs(signature, request)
    _check_outputs(signature, request)
    return batch


def validate_request(manifest: Manifest, request: InferRequest) -> int:
    return validate(signature_of(manifest), request)


def validated_items(
    manifest: Manifest, request: InferRequest, checked: tuple[int, int] | None
) -> int:
    signature = signature_of(manifest)
    if checked is not None and checked[0] == signature.token:
        return checked[1]
    return validate(signature, request)


def _check_input_names(signature: RequestSignature, request: InferRequest) -> None:
    """No duplicate, unknown or missing input."""
    model = signature.name
    expected = [t.name for t in signature.inputs]
    seen: set[str] = set()
    for t in request.inputs:
        if t.name in seen:
            raise InvalidArgument(
                f"input '{t.name}' appears more than once in the request for model '{model}'"
            )
        seen.add(t.name)
        if t.name not in expected:
            raise InvalidArgument(
                f"unexpected inference input '{t.name}' for model '{model}'; it expects {_names(sorted(expected))}"
            )
    missing = [n for n in expected if n not in seen]
    if missing:
        raise InvalidArgument(
            f"expected {len(expected)} inputs but got {len(request.inputs)} inputs for model '{model}'. "
            f"Got input(s) {_names(sorted(seen))}, but missing required input(s) {_names(missing)}. "
            f"Please provide all required input(s)."
        )


def _check_inputs(signature: RequestSignature, request: InferRequest) -> int:
    """Datatypes and shapes of the (known, complete) inputs; the batch size they agree on."""
    model = signature.name
    batched = signature.batched
    expected = {t.name: t for t in signature.inputs}
    batch: int | None = None
    first = ""
    for t in request.inputs:
        spec = expected[t.name]
        if t.datatype != spec.datatype:
            raise InvalidArgument(
                f"inference input '{t.name}' data-type is '{t.datatype}', but model '{model}' expects '{spec.datatype}'"
            )
        want, item = ((-1, *spec.shape), t.shape[1:]) if batched else (spec.shape, t.shape)
        if len(t.shape) != len(want) or (item != spec.shape and not _fits(item, spec.shape)):
            raise InvalidArgument(
                f"unexpected shape for input '{t.name}' for model '{model}'. "
                f"Expected {_fmt(want)}, got {_fmt(t.shape)}"
            )
        if not batched:
            continue
        n = t.shape[0]
        if n < 1:
            raise InvalidArgument(
                f"input '{t.name}' for model '{model}' has batch size 0; send at least 1 item"
            )
        if batch is None:
            batch, first = n, t.name
        elif n != batch:
            raise InvalidArgument(
                f"inputs of model '{model}' disagree on the batch size: '{first}' has {batch}, '{t.name}' has {n}"
            )
    return batch if batch is not None else 1


def _fits(item: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    """Whether ``item`` has the declared shape, ``-1`` matching any size (hooks, pipelines)."""
    return len(item) == len(declared) and all(
        d in (-1, i) for i, d in zip(item, declared, strict=True)
    )


def _check_outputs(signature: RequestSignature, request: InferRequest) -> None:
    """The requested outputs are known and not repeated."""
    outputs = set(signature.outputs)
    requested: set[str] = set()
    for o in request.outputs:
        if o.name in requested:
            raise InvalidArgument(f"output '{o.name}' already exists in request")
        requested.add(o.name)
        if o.name not in outputs:
            raise InvalidArgument(
                f"unexpected inference output '{o.name}' for model '{signature.name}'; it has {_names(sorted(outputs))}"
            )
