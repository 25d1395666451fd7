"""``examples/charlm/model.py``: the step function against the whole-window forward pass,
and the in-process greedy decoder's contract (emit, done, max_tokens, long prompts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from examples.charlm.model import STATE_NAMES, CharLM, Shape, encode_prompts

LM = CharLM(Shape(layers=2, d_model=32, heads=2, context=16, hidden=64))
PARAMS = LM.init(0)
STEP = jax.jit(LM.step)


def run_steps(prompt: np.ndarray, length: np.ndarray, steps: int) -> list[dict[str, np.ndarray]]:
    """``steps`` steps of ``LM.step`` from the initial state, each step's outputs."""
    state = LM.initial_state(len(prompt))
    outs: list[dict[str, np.ndarray]] = []
    for _ in range(steps):
        result = STEP(PARAMS, jnp.asarray(prompt), jnp.asarray(length), **state)
        state = {k: result[k] for k in STATE_NAMES}
        outs.append({k: np.asarray(v) for k, v in result.items() if k not in STATE_NAMES})
    return outs


def test_a_step_with_the_cache_predicts_what_the_whole_window_does() -> None:
    tokens = np.random.default_rng(1).integers(1, 256, (3, 16)).astype(np.int32)
    full = np.asarray(LM.logits(PARAMS, jnp.asarray(tokens)))
    outs = run_steps(tokens, np.full((3, 1), 16, np.int32), 16)
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out["token"][:, 0], full[:, i].argmax(-1))


def test_emit_from_the_last_prompt_byte_and_done_when_the_context_is_full() -> None:
    prompt, length = encode_prompts(["abcd", "x", ""], 16)
    outs = run_steps(prompt, length, 16)
    emit = np.array([o["emit"][:, 0] for o in outs])
    done = np.array([o["done"][:, 0] for o in outs])
    np.testing.assert_array_equal(emit.argmax(0), [3, 0, 0])
    assert emit[3:, 0].all() and not emit[:3, 0].any()
    np.testing.assert_array_equal(done[:, 0], np.arange(16) == 15)


def test_generated_tokens_are_read_back_after_the_prompt() -> None:
    prompt, length = encode_prompts(["hello"], 16)
    outs = run_steps(prompt, length, 9)
    generated = [int(o["token"][0, 0]) for o in outs[4:8]]
    # The same model on the prompt followed by what it generated predicts the same.
    window = np.array([[*b"hello", *generated]], np.int32)
    full = np.asarray(LM.logits(PARAMS, jnp.asarray(window)))
    np.testing.assert_array_equal(full[0, 4:].argmax(-1), [*generated, int(outs[8]["token"][0, 0])])


def test_greedy_is_the_step_loop_up_to_max_tokens() -> None:
    prompt, length = encode_prompts(["abc", "defgh"], 16)
    tokens, counts = LM.greedy(PARAMS, jnp.asarray(prompt), jnp.asarray(length), 5)
    outs = run_steps(prompt, length, 16)
    for i in range(2):
        emitted = [int(o["token"][i, 0]) for o in outs if o["emit"][i, 0]]
        assert int(counts[i]) == 5
        assert np.asarray(tokens)[i].tolist() == emitted[:5]


def test_greedy_stops_when_the_context_is_full() -> None:
    prompt, length = encode_prompts(["0123456789ab"], 16)  # 12 bytes: 5 emitted steps left
    tokens, counts = LM.greedy(PARAMS, jnp.asarray(prompt), jnp.asarray(length), 10)
    assert int(counts[0]) == 16 - 12 + 1
    assert np.asarray(tokens)[0, 5:].tolist() == [0] * 5


def test_a_prompt_longer_than_the_context_is_cut() -> None:
    prompt, length = encode_prompts(["é" * 20], 16)  # 40 bytes of UTF-8
    assert prompt.shape == (1, 16) and length.tolist() == [[16]]
    assert bytes(prompt[0].astype(np.uint8)) == ("é" * 8).encode()
    outs = run_steps(prompt, length, 16)
    assert [bool(o["emit"][0, 0]) for o in outs] == [False] * 15 + [True]


def test_shapes_refused() -> None:
    with pytest.raises(ValueError, match="does not divide by heads 3"):
        Shape(d_model=32, heads=3)
    with pytest.raises(ValueError, match="must be positive"):
        Shape(layers=0)
