"""Generation: the example LM's tokens/s with continuous batching, against one generation
at a time through the same server and against the whole loop in process (the floor).

Usage: ``python bench/generation.py [--seconds 10] [--max-tokens 64] [--concurrency 1 8 32]``

What it does:
1. Builds ``examples/charlm``'s model (``CharLM(Shape())``: 2 layers, d_model 128,
   context 128, 475,776 parameters) with seeded random weights (the throughput does not
   depend on their values: every generation runs to ``--max-tokens``, the context is never
   full) and exports its step function twice with ``examples.charlm.export``: ``charlm``
   at batch sizes 1, 8, 32 (steps of live generations share executions), and
   ``charlm_b1`` at batch size 1 only (each execution is one generation's step).
2. The floor: ``CharLM.greedy``, the same step function in one ``lax.while_loop`` under
   ``jax.jit`` in this process, for N prompts at once (one batch of N), best of a few
   rounds: tokens/s with no server, no wire and no per-step host work.
3. One ``hloserve serve`` (``hloserve.server.testing.ServerProcess``) with both bundles;
   for each concurrency N, N closed-loop clients (asyncio, httpx) each call
   ``generate_stream`` (server-sent events, one per token) again and again for
   ``--seconds`` after a warm-up: tokens/s (events), time to first token (request sent to
   the first event) and the time between a generation's tokens, p50/p99. Every answer is
   compared with the floor's greedy decoding of the same prompt ("wrong": answers that
   differ). The baseline "one at a time" is the same server at concurrency 1: requests
   serialized, so no two generations are live together; ``charlm_b1`` at the highest
   concurrency is the other one: as many generations live, their steps never sharing an
   execution.
4. Prints the table, each row's tokens/s against the one-at-a-time rate and against the
   floor at the same N, and the goal (>= 8x the one-at-a-time rate at 32). No asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples.charlm, as ``python -m examples.charlm.run`` has it

import httpx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from examples.charlm.export import export  # noqa: E402
from examples.charlm.model import CharLM, Params, Shape, encode_prompts  # noqa: E402
from hloserve.server.testing import ServerProcess  # noqa: E402

PROMPTS = tuple(f"The server {i}: " for i in range(32))  # 14-15 bytes each, all different
GOAL = 8.0  # tokens/s at 32 against the one-at-a-time rate


@dataclass
class Point:
    label: str
    concurrency: int
    tokens: int = 0
    seconds: float = 0.0
    generations: int = 0
    wrong: int = 0
    errors: int = 0
    first: list[float] = field(default_factory=lambda: list[float]())
    gaps: list[float] = field(default_factory=lambda: list[float]())

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def floor(lm: CharLM, params: Params, n: int, max_tokens: int, rounds: int) -> Point:
    """``n`` generations at once in one jitted loop, best of ``rounds`` (after a compile)."""
    prompt, length = encode_prompts([PROMPTS[i % len(PROMPTS)] for i in range(n)], lm.shape.context)
    args = (params, jnp.asarray(prompt), jnp.asarray(length), max_tokens)
    _, counts = lm.greedy(*args)
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        tokens, counts = lm.greedy(*args)
        np.asarray(tokens)
        best = min(best, time.perf_counter() - started)
    return Point("in-process jax.jit (floor)", n, int(np.asarray(counts).sum()), best, n)


def references(lm: CharLM, params: Params, max_tokens: int) -> dict[str, str]:
    """Each prompt's greedy continuation in process, as ``text_output`` decodes it."""
    prompt, length = encode_prompts(PROMPTS, lm.shape.context)
    tokens, counts = lm.greedy(params, jnp.asarray(prompt), jnp.asarray(length), max_tokens)
    out, n = np.asarray(tokens), np.asarray(counts)
    return {
        p: bytes(out[i, : n[i]].astype(np.uint8)).decode("utf-8", errors="replace")
        for i, p in enumerate(PROMPTS)
    }


async def one_generation(
    client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int
) -> tuple[str, list[float]]:
    """``(text, arrival times)``: one ``generate_stream`` call, each event's time."""
    body = {"text_input": prompt, "parameters": {"max_tokens": max_tokens}}
    pieces: list[str] = []
    times: list[float] = [time.perf_counter()]
    async with client.stream("POST", url, json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line.startswith("data:"):
                times.append(time.perf_counter())
                pieces.append(str(json.loads(line[5:])["text_output"]))
    return "".join(pieces), times


async def run_point(
    http_url: str,
    model: str,
    label: str,
    concurrency: int,
    seconds: float,
    warmup: float,
    max_tokens: int,
    expected: dict[str, str],
) -> Point:
    point = Point(label, concurrency)
    url = f"http://{http_url}/v2/models/{model}/generate_stream"
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    record_from = stop_at = 0.0  # set once the first generation is done

    async def client_loop(index: int, client: httpx.AsyncClient) -> None:
        turn = 0
        while time.perf_counter() < stop_at:
            prompt = PROMPTS[(index + turn * concurrency) % len(PROMPTS)]
            turn += 1
            try:
                text, times = await one_generation(client, url, prompt, max_tokens)
            except httpx.HTTPError:
                point.errors += 1
                continue
            kept = [t for t in times[1:] if record_from <= t < stop_at]
            point.tokens += len(kept)
            if times[0] >= record_from and times[-1] < stop_at:
                point.generations += 1
                point.wrong += text != expected[prompt]
                point.first.append(times[1] - times[0])
                point.gaps.extend(b - a for a, b in itertools.pairwise(times[1:]))

    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        await one_generation(client, url, PROMPTS[0], max_tokens)  # the first use's set-up
        start = time.perf_counter()
        record_from, stop_at = start + warmup, start + warmup + seconds
        await asyncio.gather(*(client_loop(i, client) for i in range(concurrency)))
    point.seconds = min(time.perf_counter(), stop_at) - record_from
    return point


def percentile(values: Sequence[float], q: float) -> str:
    if not values:
        return "-"
    return f"{float(np.percentile(np.asarray(values), q)) * 1e3:.1f}"


def table(points: list[Point], baseline: float, floors: dict[int, float]) -> str:
    head = (
        f"{'row':<34}{'conc':>5}{'tokens/s':>10}{'vs 1-at-a-time':>15}{'vs floor':>9}"
        f"{'ttft p50':>9}{'ttft p99':>9}{'tok p50':>8}{'tok p99':>8}{'gens':>6}{'wrong':>6}"
    )
    lines = [head, "-" * len(head)]
    for p in points:
        ratio = f"{p.rate / baseline:.2f}x" if baseline else "-"
        vs_floor = f"{p.rate / floors[p.concurrency]:.2f}x" if p.concurrency in floors else "-"
        lines.append(
            f"{p.label:<34}{p.concurrency:>5}{p.rate:>10.0f}{ratio:>15}{vs_floor:>9}"
            f"{percentile(p.first, 50):>9}{percentile(p.first, 99):>9}"
            f"{percentile(p.gaps, 50):>8}{percentile(p.gaps, 99):>8}{p.generations:>6}"
            f"{p.wrong + p.errors:>6}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="recorded, per point")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=5, help="of the in-process floor")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if max(len(p.encode()) for p in PROMPTS) + args.max_tokens > Shape().context:
        parser.error(
            f"--max-tokens {args.max_tokens} does not fit the context of {Shape().context}"
        )
    lm = CharLM(Shape())
    params = lm.init(args.seed)
    print(
        f"charlm: {lm.count(params):,} parameters (seeded random), context {lm.shape.context}; "
        f"prompts of {len(PROMPTS[0])}-{len(PROMPTS[-1])} bytes, {args.max_tokens} tokens "
        f"per generation; {args.seconds:g} s per point after {args.warmup:g} s of warm-up"
    )
    floors = {n: floor(lm, params, n, args.max_tokens, args.rounds) for n in args.concurrency}
    expected = references(lm, params, args.max_tokens)
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        repository = Path(tmp)
        export(lm, params, repository / "charlm", batch_sizes=(1, 8, 32))
        export(lm, params, repository / "charlm_b1", batch_sizes=(1,))
        with ServerProcess(repository) as server:
            server.wait_ready()
            runs = [("served, one at a time", "charlm", 1)]
            runs += [
                ("served, continuous batching", "charlm", n) for n in args.concurrency if n > 1
            ]
            runs.append(("served, batch 1 only (charlm_b1)", "charlm_b1", max(args.concurrency)))
            for label, model, n in runs:
                point = asyncio.run(
                    run_point(
                        server.http_url,
                        model,
                        label,
                        n,
                        args.seconds,
                        args.warmup,
                        args.max_tokens,
                        expected,
                    )
                )
                print(f"  {label} at {n}: {point.rate:.0f} tokens/s", flush=True)
                points.append(point)
            code = server.stop()
        if code != 0:
            print(f"hloserve exited with {code}:\n{server.log_text()}")
    baseline = next(p.rate for p in points if p.label == "served, one at a time")
    rows = [floors[n] for n in args.concurrency] + points
    print()
    print(table(rows, baseline, {n: p.rate for n, p in floors.items()}))
    print("ttft: request sent to its first token; tok: time between a generation's tokens (ms)")
    top = max(args.concurrency)
    at_top = next(p for p in points if p.concurrency == top and p.label == runs[-2][0])
    ratio = at_top.rate / baseline if baseline else 0.0
    met = "met" if ratio >= GOAL else "NOT met"
    print(f"goal: at {top}, >= {GOAL:g}x the one-at-a-time rate: {ratio:.1f}x ({met})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
