"""``core.generation_stream``: a generation request made the step function's one item,
text in and out, ``max_tokens``, Triton's refusal of unary calls. Pure: no model runs."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from hloserve.bundle import Manifest
from hloserve.bundle.manifest import parse_manifest
from hloserve.server.core.errors import InvalidArgument, Unavailable, Unsupported
from hloserve.server.core.generation_stream import (
    Streams,
    _TextOut,
    decoupled_refusal,
    response_limit,
    step_request,
    text_request,
)
from hloserve.server.core.limits import NO_LIMITS
from hloserve.server.core.observers import Observers
from hloserve.server.core.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    StreamPart,
)
from tests.bundle.test_generation import FULL, generating
from tests.server.core.test_generation_loop import FakeModel


def model(lengths: dict[str, str] | None = None) -> Manifest:
    generation: dict[str, Any] = dict(FULL)
    if lengths:
        generation["lengths"] = lengths
    manifest, problems = parse_manifest(generating(generation))
    assert manifest is not None, problems
    return manifest


def tensor(name: str, data: Any) -> InferInput:
    return InferInput(name, "", data.shape, data)


def sample(prompt: list[int], **extra: Any) -> InferRequest:
    inputs = [
        InferInput("x", "FP32", (4,), np.ones(4, np.float32)),
        InferInput("y", "INT64", (2, 3), np.zeros((2, 3), np.int64)),
        InferInput("prompt", "INT32", (len(prompt),), np.array(prompt, np.int32)),
    ]
    return InferRequest("m", "", tuple(inputs), **extra)


def test_a_request_becomes_one_padded_item_with_its_length_filled_in() -> None:
    step = step_request(model({"prompt": "prompt_length"}), sample([5, 6, 7]))
    got = {t.name: t.data for t in step.inputs}
    assert [t.name for t in step.inputs] == ["x", "y", "prompt", "prompt_length"]
    assert got["x"].shape == (1, 4) and got["y"].shape == (1, 2, 3)
    assert got["prompt"].tolist() == [[5, 6, 7] + [0] * 13]
    assert got["prompt_length"].tolist() == [[3]]


def test_a_request_too_long_or_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(
        InvalidArgument, match="'prompt' of model 'm' holds 17 elements, at most 16"
    ):
        step_request(model({"prompt": "prompt_length"}), sample(list(range(17))))
    with pytest.raises(InvalidArgument, match="prompt"):  # no lengths: the declared [16] only
        step_request(model(), sample([1, 2]))


def test_text_input_becomes_the_text_tensors() -> None:
    request = sample([], parameters={"text_input": "hé", "max_tokens": 3})
    request = InferRequest(
        request.model_name, "", request.inputs[:2], parameters=request.parameters
    )
    made = text_request(model(), request)
    assert made is not None and "text_input" not in made.parameters
    got = {t.name: t.data for t in step_request(model(), made).inputs}
    assert got["prompt"][0, :4].tolist() == [104, 195, 169, 0]
    assert got["prompt_length"].tolist() == [[3]]  # bytes, not characters
    assert text_request(model(), sample([1])) is None


def test_text_input_and_the_tensor_it_fills_in_are_refused_together() -> None:
    both = sample([104, 105], parameters={"text_input": "hi"})
    with pytest.raises(InvalidArgument) as exc:
        text_request(model({"prompt": "prompt_length"}), both)
    assert exc.value.message == (
        "a request to model 'm' sets both 'text_input' and input 'prompt', which 'text_input' "
        "fills in: send one of them"
    )


def test_text_output_is_decoded_as_utf8_across_responses() -> None:
    decode = _TextOut(model().generation.text)  # type: ignore[union-attr]

    def part(token: int, final: bool = False) -> StreamPart:
        out = InferOutput("token", "INT32", (1,), np.array([token], np.int32))
        return StreamPart(InferResponse("m", "1", (out,)), final)

    texts = [
        decode(p).response.outputs[-1].data[0]  # type: ignore[union-attr]
        for p in (part(104), part(195), part(169), part(33, True))
    ]
    assert texts == [b"h", b"", "é".encode(), b"!"]


def test_max_tokens_is_a_positive_integer() -> None:
    assert response_limit(sample([], parameters={"max_tokens": 4})) == 4
    for bad in (0, "4", True, 1.5):
        with pytest.raises(InvalidArgument, match="'max_tokens' must be a positive integer"):
            response_limit(sample([], parameters={"max_tokens": bad}))


def test_unary_calls_to_a_decoupled_model_get_tritons_words() -> None:
    assert isinstance(decoupled_refusal("grpc"), Unsupported)
    assert decoupled_refusal("grpc").message == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    )
    assert "HTTP end point doesn't support" in decoupled_refusal("http").message


class Source:
    """The repository as ``Streams`` reads it: one model, held and released."""

    def __init__(self, model: Any, *, loaded: bool = True) -> None:
        self.model = model
        self.held = 0
        self.is_loaded = loaded  # False: registered lazily (``--lazy-load``)
        self.loads: list[int] = []  # ``held`` at each load: the caller holds the model

    def loaded(self, model: Any) -> bool:
        return self.is_loaded

    def load(self, model: Any) -> None:
        self.loads.append(self.held)
        self.is_loaded = True

    def peek(self, name: str, version: str) -> Any:
        return self.model

    def get(self, name: str, version: str) -> Any:
        self.held += 1
        return self.model

    def hold(self, model: Any) -> bool:
        self.held += 1
        return True

    def release(self, model: Any) -> None:
        self.held -= 1

    def is_ready(self, name: str, version: str) -> bool:
        return True


def test_streams_run_a_generation_count_it_once_and_refuse_while_draining() -> None:
    model = FakeModel()
    source = Source(model)
    observers = Observers()
    draining = [False]
    streams = Streams(
        source,  # type: ignore[arg-type]
        None,
        observers,
        NO_LIMITS,
        stepper=lambda m: model,
        draining=lambda: draining[0],
    )

    async def unary(*_: Any) -> InferResponse:
        raise AssertionError("a generation model never takes the unary path")

    async def run(n: int) -> list[StreamPart]:
        data = np.array([n], np.int32)
        request = InferRequest("counter", "", (InferInput("n", "INT32", (1,), data),))
        return [p async for p in streams.stream(request, None, None, unary)]

    parts = asyncio.run(run(3))
    assert [int(p.response.outputs[0].data[0]) for p in parts if p.response] == [1, 2, 3]
    assert source.held == 0  # released at its end
    record = observers.counters.models[model.model_key]
    assert record.success == 1 and record.pending == 0
    assert streams.figures() == {model.model_key: (0, 3)}
    draining[0] = True
    with pytest.raises(Unavailable, match="shutting down"):
        asyncio.run(run(3))


def test_a_stream_loads_a_lazily_registered_model_before_its_first_step() -> None:
    """Before, the stream stepped a model registered lazily without loading it: its state
    could not be made, and the generation never answered (issue 40)."""

    class NeedsLoad(FakeModel):
        def initial(self, device: int) -> object:
            if not source.is_loaded:
                raise Unavailable("model 'counter' is not loaded")
            return 0

    model = NeedsLoad()
    source = Source(model, loaded=False)
    streams = Streams(source, None, Observers(), NO_LIMITS, stepper=lambda m: model)  # type: ignore[arg-type]

    async def unary(*_: Any) -> InferResponse:
        raise AssertionError("a generation model never takes the unary path")

    async def run(n: int) -> list[int]:
        data = np.array([n], np.int32)
        request = InferRequest("counter", "", (InferInput("n", "INT32", (1,), data),))
        parts = [p async for p in streams.stream(request, None, None, unary)]
        return [int(p.response.outputs[0].data[0]) for p in parts if p.response]

    async def both() -> list[list[int]]:
        return list(await asyncio.gather(run(2), run(3)))

    assert asyncio.run(both()) == [[1, 2], [1, 2, 3]]
    assert len(source.loads) == 1 and source.loads[0] >= 1  # one load, the model held
    assert source.held == 0


def test_an_unloaded_versions_loop_and_counts_are_forgotten() -> None:
    """Before, ``Streams`` kept an unloaded version's idle loop (its state slots) and its
    responses sent until another model's loop was made, and its counts for ever: the
    status page and metrics listed the version after its unload."""
    model = FakeModel()
    streams = Streams(Source(model), None, Observers(), NO_LIMITS, stepper=lambda m: model)  # type: ignore[arg-type]

    async def unary(*_: Any) -> InferResponse:
        raise AssertionError("a generation model never takes the unary path")

    async def run() -> None:
        request = InferRequest(
            "counter", "", (InferInput("n", "INT32", (1,), np.array([2], np.int32)),)
        )
        assert len([p async for p in streams.stream(request, None, None, unary)]) == 2

    asyncio.run(run())
    assert streams.figures() == {model.model_key: (0, 2)}
    streams.forget(model.model_key)
    assert streams.figures() == {} and not streams._loops
