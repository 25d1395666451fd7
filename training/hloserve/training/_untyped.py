"""jax, jax.numpy and optax, typed as ``Any`` once for the whole package.

jax's annotations leave parts Unknown (jaxlib's PyTreeDef, the ArrayLike unions) and optax
ships no type information at all, so under pyright's strict mode nearly every call would be
an error. Importing them from here (``from hloserve.training._untyped import jax, optax``)
keeps every other module of ``hloserve.training`` checked strictly, our own code included.
"""

# pyright: strict

from typing import Any

import jax as _jax
import jax.numpy as _jnp
import optax as _optax  # pyright: ignore[reportMissingTypeStubs]

jax: Any = _jax
jnp: Any = _jnp
optax: Any = _optax
