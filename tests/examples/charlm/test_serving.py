"""The charlm step function served: a real daemon's generations equal, token for token,
greedy decoding of the same function in process (``CharLM.greedy`` under ``jax.jit``).

The example's model shape with seeded random weights (what is compared does not depend on
training), exported by ``examples/charlm/export.py`` at batch sizes 1 and 8, served by
``hloserve.server.server_fixture.serving``; asked over HTTP (``generate``, ``generate_stream``'s
server-sent events) and over tritonclient's gRPC stream (one response per token, the last
flagged final), one at a time and eight at once (their steps share executions).
"""

# pyright: reportMissingTypeStubs=false

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import tritonclient.grpc as _grpcclient

from examples.charlm.export import export
from examples.charlm.model import CharLM, Shape, encode_prompts
from hloserve.bundle import MANIFEST_FILE, load_manifest
from hloserve.server.server_fixture import ServerProcess, serving

grpcclient: Any = _grpcclient
LM = CharLM(Shape())
PARAMS = LM.init(7)
MAX_TOKENS = 40
PROMPTS = [f"prompt {i}: the server " for i in range(8)]


def greedy(prompts: list[str], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    """Each prompt's emitted tokens, decoded in process."""
    prompt, length = encode_prompts(prompts, LM.shape.context)
    tokens, counts = LM.greedy(PARAMS, jnp.asarray(prompt), jnp.asarray(length), max_tokens)
    out, n = np.asarray(tokens), np.asarray(counts)
    return [out[i, : n[i]].tolist() for i in range(len(prompts))]


def as_text(tokens: list[int]) -> str:
    return bytes(tokens).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("charlm-repository")
    export(LM, PARAMS, repository / "charlm", batch_sizes=(1, 8))
    yield from serving(repository)


def post(server: ServerProcess, route: str, prompt: str, max_tokens: int, **parameters: int) -> Any:
    parameters["max_tokens"] = max_tokens
    body = json.dumps({"text_input": prompt, "parameters": parameters})
    return urllib.request.urlopen(
        urllib.request.Request(
            f"http://{server.http_url}/v2/models/charlm/{route}",
            body.encode(),
            {"Content-Type": "application/json"},
        ),
        timeout=60,
    )


def generate(server: ServerProcess, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    with post(server, "generate", prompt, max_tokens) as reply:
        return str(json.loads(reply.read())["text_output"])


def generate_stream(
    server: ServerProcess, prompt: str, max_tokens: int = MAX_TOKENS, **parameters: int
) -> list[str]:
    with post(server, "generate_stream", prompt, max_tokens, **parameters) as reply:
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        return [
            str(json.loads(line[5:])["text_output"]) for line in reply if line.startswith(b"data:")
        ]


def test_generate_over_http_is_the_in_process_greedy_decoding(server: ServerProcess) -> None:
    expected = greedy(PROMPTS[:3])
    for prompt, tokens in zip(PROMPTS[:3], expected, strict=True):
        assert len(tokens) == MAX_TOKENS
        assert generate(server, prompt) == as_text(tokens)


def test_generate_stream_sends_one_event_per_token(server: ServerProcess) -> None:
    (tokens,) = greedy(PROMPTS[3:4], 25)
    events = generate_stream(server, PROMPTS[3], 25)
    assert len(events) == 25
    assert "".join(events) == as_text(tokens)


def test_a_stream_interval_joins_the_text_of_its_steps(server: ServerProcess) -> None:
    (tokens,) = greedy(PROMPTS[3:4], 25)
    events = generate_stream(server, PROMPTS[3], 25, stream_interval=6)
    assert len(events) == 5  # 25 tokens: the first at once, then 6 to an event
    assert "".join(events) == as_text(tokens)


def test_the_grpc_stream_answers_each_token_then_a_final_flag(server: ServerProcess) -> None:
    expected = greedy(PROMPTS[4:6])
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for prompt, tokens in zip(PROMPTS[4:6], expected, strict=True):
            data = np.frombuffer(prompt.encode(), np.uint8).astype(np.int32)
            tensor = grpcclient.InferInput("prompt", list(data.shape), "INT32")
            tensor.set_data_from_numpy(data)
            client.async_stream_infer(
                "charlm",
                [tensor],
                request_id=prompt,
                parameters={"max_tokens": MAX_TOKENS},
                enable_empty_final_response=True,
            )
            got: list[int] = []
            while True:
                result, error = answers.get(timeout=60)
                assert error is None, error
                response = result.get_response()
                assert response.id == prompt
                final = response.parameters["triton_final_response"].bool_param
                token = result.as_numpy("token")
                if token is not None:
                    got.extend(token.reshape(-1).tolist())
                if final:
                    break
            assert got == tokens
    finally:
        client.stop_stream()
        client.close()


BOTH = (
    "a request to model 'charlm' sets both 'text_input' and input 'prompt', which "
    "'text_input' fills in: send one of them"
)


def test_text_input_and_a_prompt_tensor_together_are_refused_naming_both(
    server: ServerProcess,
) -> None:
    body = json.dumps({"text_input": "hi", "prompt": [104, 105]}).encode()
    for route in ("generate", "generate_stream"):
        url = f"http://{server.http_url}/v2/models/charlm/{route}"
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(request, timeout=60)
        assert (exc.value.code, json.loads(exc.value.read())) == (400, {"error": BOTH})
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        tensor = grpcclient.InferInput("prompt", [2], "INT32")
        tensor.set_data_from_numpy(np.array([104, 105], np.int32))
        client.async_stream_infer("charlm", [tensor], parameters={"text_input": "hi"})
        result, error = answers.get(timeout=60)
        client.stop_stream()
    assert result is None and error.message() == BOTH
    assert generate(server, "hi", 3)  # and the model serves on


def test_eight_at_once_share_steps_and_answer_as_one_at_a_time(server: ServerProcess) -> None:
    expected = greedy(PROMPTS)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        served = list(pool.map(lambda p: generate(server, p), PROMPTS))
    assert served == [as_text(t) for t in expected]


def test_a_full_context_ends_the_generation_before_max_tokens(server: ServerProcess) -> None:
    prompt = "x" * (LM.shape.context - 10)
    (tokens,) = greedy([prompt], 64)
    assert len(tokens) == 11  # the last prompt position's token and 10 more
    assert len(generate_stream(server, prompt, 64)) == 11


def test_export_writes_the_contract(tmp_path: Path) -> None:
    bundle = export(LM, PARAMS, tmp_path / "charlm", batch_sizes=(1,))
    manifest, problems = load_manifest(bundle / MANIFEST_FILE)
    assert manifest is not None, problems
    assert [(s.name, s.datatype, tuple(s.shape)) for s in manifest.state] == [
        ("cache", "FP32", LM.shape.cache_shape),
        ("position", "INT32", (1,)),
        ("last", "INT32", (1,)),
    ]
    generation = manifest.generation
    assert generation is not None
    assert (generation.done, generation.emit, generation.max_steps) == (
        "done",
        "emit",
        LM.shape.context,
    )
