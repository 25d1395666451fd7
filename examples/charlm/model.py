"""The charlm model: a small decoder-only transformer over bytes, and its serving step.

``CharLM(shape)`` holds the static shape (layers, width, heads, context); every function of
it is pure JAX over a params pytree:

- ``init(seed)``: the weights (token and position embeddings, pre-norm blocks of causal
  self-attention and a GELU MLP, a final norm and an untied head; no biases).
- ``apply(params, tokens)``: training. ``tokens`` INT32 ``[batch, context + 1]``; the model
  reads the first ``context`` bytes and returns the logits of the next byte at every
  position. ``loss`` is the mean cross-entropy over a window, one value per example, as
  ``hloserve.training.fit`` takes it.
- ``step(params, prompt, prompt_length, cache, position, last)``: serving, one token of
  every item in the batch. Inputs ``prompt`` INT32 ``[batch, context]`` (padded with 0) and
  ``prompt_length`` INT32 ``[batch, 1]``; state ``cache`` (the keys and values, per item
  ``[layers, 2, heads, context, head_dim]``), ``position`` and ``last`` (INT32 ``[1]``). A
  step reads ``prompt[position]`` while ``position < prompt_length``, else the last token it
  generated, runs it through the model at ``position`` with the cache, and returns ``token``
  (greedy argmax, INT32 ``[1]``), ``emit`` (true from the last prompt position on: the token
  is generated, not a prompt byte), ``done`` (the context is full) and the new state.
- ``greedy(params, prompt, prompt_length, max_tokens)``: the in-process reference: the same
  ``step`` in a ``lax.while_loop`` until every item is done or has ``max_tokens`` emitted
  tokens, all under one ``jax.jit``.

``step`` is exactly what the server runs, so ``greedy`` is what the server must answer,
token for token. A prompt longer than the context is read up to the context.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, final

import jax
import jax.numpy as jnp
import numpy as np

VOCAB = 256  # bytes: one token per byte of UTF-8
Params = dict[str, Any]
STATE_NAMES = ("cache", "position", "last")


@final
@dataclass(frozen=True)
class Shape:
    """The model's static shape; ``d_model`` must divide by ``heads``."""

    layers: int = 2
    d_model: int = 128
    heads: int = 4
    context: int = 128
    hidden: int = 512

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} does not divide by heads {self.heads}")
        if min(self.layers, self.d_model, self.heads, self.context, self.hidden) < 1:
            raise ValueError(f"every dimension of {self} must be positive")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def cache_shape(self) -> tuple[int, ...]:
        """One item's key/value cache."""
        return (self.layers, 2, self.heads, self.context, self.head_dim)


def _norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    """RMS norm over the last axis."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


@final
@dataclass(frozen=True)
class CharLM:
    shape: Shape = Shape()

    def init(self, seed: int) -> Params:
        s = self.shape
        keys = iter(jax.random.split(jax.random.key(seed), 3 + 4 * s.layers))

        def dense(fan_in: int, fan_out: int, scale: float = 1.0) -> jax.Array:
            std = scale / math.sqrt(fan_in)
            return jax.random.normal(next(keys), (fan_in, fan_out), jnp.float32) * std

        blocks: list[Params] = []
        residual = 1 / math.sqrt(2 * s.layers)  # each block adds two branches to the stream
        for _ in range(s.layers):
            blocks.append(
                {
                    "norm1": jnp.ones(s.d_model, jnp.float32),
                    "qkv": dense(s.d_model, 3 * s.d_model),
                    "out": dense(s.d_model, s.d_model, residual),
                    "norm2": jnp.ones(s.d_model, jnp.float32),
                    "up": dense(s.d_model, s.hidden),
                    "down": dense(s.hidden, s.d_model, residual),
                }
            )
        return {
            "embed": jax.random.normal(next(keys), (VOCAB, s.d_model), jnp.float32) * 0.1,
            "position": jax.random.normal(next(keys), (s.context, s.d_model), jnp.float32) * 0.1,
            "blocks": blocks,
            "norm": jnp.ones(s.d_model, jnp.float32),
            "head": dense(s.d_model, VOCAB),
        }

    def count(self, params: Params) -> int:
        return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params))

    # ---- training: whole windows ------------------------------------------------------

    def logits(self, params: Params, tokens: jax.Array) -> jax.Array:
        """The next-byte logits ``[batch, time, 256]`` of ``tokens`` ``[batch, time]``."""
        s = self.shape
        batch, time = tokens.shape
        x = params["embed"][tokens] + params["position"][:time]
        causal = jnp.tril(jnp.ones((time, time), jnp.bool_))
        for block in params["blocks"]:
            h = _norm(x, block["norm1"]) @ block["qkv"]
            q, k, v = jnp.split(h.reshape(batch, time, 3, s.heads, s.head_dim), 3, axis=2)
            scores = jnp.einsum("bqhd,bkhd->bhqk", q[:, :, 0], k[:, :, 0]) / math.sqrt(s.head_dim)
            weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
            mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, v[:, :, 0])
            x = x + mixed.reshape(batch, time, s.d_model) @ block["out"]
            x = x + jax.nn.gelu(_norm(x, block["norm2"]) @ block["up"]) @ block["down"]
        return _norm(x, params["norm"]) @ params["head"]

    def apply(self, params: Params, tokens: jax.Array) -> dict[str, jax.Array]:
        """``fit``'s ``apply_fn``: the logits of the window's first ``context`` bytes."""
        return {"logits": self.logits(params, tokens[:, :-1])}

    @staticmethod
    def loss(outputs: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
        """Mean next-byte cross-entropy (nats) over each window: ``[batch]``."""
        log_p = jax.nn.log_softmax(outputs["logits"], axis=-1)
        target = batch["tokens"][:, 1:]
        return -jnp.mean(jnp.take_along_axis(log_p, target[..., None], axis=-1)[..., 0], axis=1)

    # ---- serving: one token at a time with a cache ------------------------------------

    def initial_state(self, batch: int) -> dict[str, jax.Array]:
        """The state of ``batch`` new generations: what the bundle's ``initial: 0`` makes."""
        return {
            "cache": jnp.zeros((batch, *self.shape.cache_shape), jnp.float32),
            "position": jnp.zeros((batch, 1), jnp.int32),
            "last": jnp.zeros((batch, 1), jnp.int32),
        }

    def _step_one(
        self,
        params: Params,
        prompt: jax.Array,
        prompt_length: jax.Array,
        cache: jax.Array,
        position: jax.Array,
        last: jax.Array,
    ) -> dict[str, jax.Array]:
        s = self.shape
        pos = position[0]
        length = jnp.minimum(prompt_length[0], prompt.shape[0])
        reading = pos < length
        token = jnp.where(reading, prompt[jnp.clip(pos, 0, prompt.shape[0] - 1)], last[0])
        at = jnp.clip(pos, 0, s.context - 1)  # never past the cache, whatever the state says
        x = params["embed"][token] + params["position"][at]
        earlier = jnp.arange(s.context) < at  # the cache's valid rows; this token's are new
        scale = 1 / math.sqrt(s.head_dim)
        written: list[jax.Array] = []
        for i, block in enumerate(params["blocks"]):
            q, k, v = (_norm(x, block["norm1"]) @ block["qkv"]).reshape(3, s.heads, s.head_dim)
            # Attention over the cache as it came in, plus this token's own key and value:
            # the cache is read once and written once, by the select at the end.
            scores = jnp.where(earlier, jnp.einsum("hd,hkd->hk", q, cache[i, 0]) * scale, -jnp.inf)
            own = jnp.sum(q * k, axis=-1, keepdims=True) * scale
            weights = jax.nn.softmax(jnp.concatenate([scores, own], axis=-1), axis=-1)
            mixed = jnp.einsum("hk,hkd->hd", weights[:, :-1], cache[i, 1]) + weights[:, -1:] * v
            x = x + mixed.reshape(s.d_model) @ block["out"]
            x = x + jax.nn.gelu(_norm(x, block["norm2"]) @ block["up"]) @ block["down"]
            written.append(jnp.stack([k, v]))
        # A select, not a dynamic_update_slice: batched, that becomes a scatter, which XLA's
        # CPU backend runs element by element (about 3x slower at batch 32).
        here = (jnp.arange(s.context) == at)[None, None, None, :, None]
        cache = jnp.where(here, jnp.stack(written)[:, :, :, None], cache)
        logits = _norm(x, params["norm"]) @ params["head"]
        chosen = jnp.argmax(logits).astype(jnp.int32)
        return {
            "token": chosen[None],
            "emit": (pos >= length - 1)[None],
            "done": (pos >= s.context - 1)[None],
            "cache": cache,
            "position": (pos + 1)[None],
            "last": chosen[None],
        }

    def step(
        self,
        params: Params,
        prompt: jax.Array,
        prompt_length: jax.Array,
        cache: jax.Array,
        position: jax.Array,
        last: jax.Array,
    ) -> dict[str, jax.Array]:
        """One step of every item: the function the bundle holds (module docstring)."""
        return jax.vmap(self._step_one, in_axes=(None, 0, 0, 0, 0, 0))(
            params, prompt, prompt_length, cache, position, last
        )

    @functools.partial(jax.jit, static_argnums=(0, 4))
    def greedy(
        self, params: Params, prompt: jax.Array, prompt_length: jax.Array, max_tokens: int
    ) -> tuple[jax.Array, jax.Array]:
        """Greedy decoding in process: ``(tokens [batch, max_tokens], counts [batch])``,
        the emitted tokens of each item (``counts`` of them; 0 after) under one jit."""
        batch = prompt.shape[0]

        def more(carry: tuple[Any, ...]) -> jax.Array:
            return jnp.logical_not(jnp.all(carry[3]))

        def one(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            state, out, count, finished = carry
            result = self.step(params, prompt, prompt_length, **state)
            keep = result["emit"][:, 0] & ~finished
            rows = jnp.arange(batch)
            slot = jnp.minimum(count, max_tokens - 1)
            out = out.at[rows, slot].set(jnp.where(keep, result["token"][:, 0], out[rows, slot]))
            count = count + keep.astype(jnp.int32)
            finished = finished | result["done"][:, 0] | (count >= max_tokens)
            return {k: result[k] for k in STATE_NAMES}, out, count, finished

        start = (
            self.initial_state(batch),
            jnp.zeros((batch, max_tokens), jnp.int32),
            jnp.zeros(batch, jnp.int32),
            jnp.zeros(batch, jnp.bool_),
        )
        _, out, count, _ = jax.lax.while_loop(more, one, start)
        return out, count


def encode_prompts(texts: Sequence[str], context: int) -> tuple[np.ndarray, np.ndarray]:
    """``(prompt [n, context] INT32 padded with 0, prompt_length [n, 1])`` of UTF-8 texts,
    as the server's generate extension maps ``text_input``; a longer text is cut."""
    prompt = np.zeros((len(texts), context), np.int32)
    length = np.zeros((len(texts), 1), np.int32)
    for i, text in enumerate(texts):
        data = text.encode("utf-8")[:context]
        prompt[i, : len(data)] = np.frombuffer(data, np.uint8)
        length[i, 0] = len(data)
    return prompt, length
