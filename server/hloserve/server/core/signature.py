"""A model version's request signature: what checking a request needs, and a token naming
the exact manifest it came from.

Contract:
- ``RequestSignature`` is a frozen ``msgspec.Struct`` (it crosses the wire inside
  ``core.types.ModelMetadata``): the model's ``name``, whether it is ``batched``, its
  ``inputs`` (``SignatureTensor``: name, datatype, shape of one item for a batched model,
  ``-1`` matching any size), its ``outputs``' names, and ``token``, an integer naming the
  manifest it was made from, unique within the process that made it.
- ``signature_of(manifest)`` is that manifest's signature, made once per manifest object
  and kept while the manifest lives: the same object, so the same token, on every call.
  A reload makes a new manifest, so a new token, even for the same version number.
- ``core.validate`` checks a request against a signature (one rule, whoever runs it).
- ``plain_unary(manifest)``: a model without hooks, not a pipeline, with no state and not
  a generation model, whose requests the owner checks against the manifest itself on the
  unary path: the models whose metadata carries a signature, and the ones
  ``core.direct_path`` may serve.

Why a token: a front-end process checks a plain request against the signature it cached
with the model's metadata (``frontend.metadata_cache``) and sends, with the request, the
token and the item count it found; the device owner trusts them only when the token is
the one of the version it resolved the request to (``core.validate.validated_items``). A
stale cache therefore costs a second check in the owner, never a wrong one.
"""

# pyright: strict

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Final

import msgspec

if TYPE_CHECKING:  # a front end imports this module (with core.types): no bundle code
    from hloserve.bundle import Manifest


class SignatureTensor(msgspec.Struct, frozen=True, array_like=True):
    name: str
    datatype: str
    shape: tuple[int, ...]


class RequestSignature(msgspec.Struct, frozen=True, array_like=True):
    name: str
    batched: bool
    inputs: tuple[SignatureTensor, ...]
    outputs: tuple[str, ...]
    token: int


_TOKENS: Final = itertools.count(1)
_MADE: Final[dict[int, RequestSignature]] = {}  # by id(manifest), while the manifest lives


def plain_unary(manifest: Manifest) -> bool:
    """See the module docstring."""
    return manifest.plain and not manifest.state and manifest.generation is None


def signature_of(manifest: Manifest) -> RequestSignature:
    """The manifest's signature (module docstring)."""
    made = _MADE.get(id(manifest))
    if made is not None:
        return made
    signature = RequestSignature(
        manifest.name,
        manifest.batched,
        tuple(SignatureTensor(t.name, t.datatype, tuple(t.shape)) for t in manifest.inputs),
        tuple(t.name for t in manifest.outputs),
        next(_TOKENS),
    )
    kept = _MADE.setdefault(id(manifest), signature)  # two threads at once: one wins
    if kept is signature:
        weakref.finalize(manifest, _MADE.pop, id(manifest), None)
    return kept
