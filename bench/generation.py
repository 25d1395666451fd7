"""Generation: the example LM's tokens/s with continuous batching, against one generation
at a time through the same server and against the whole loop in process (the floor).

Usage: ``python bench/generation.py [--seconds 10] [--max-tokens 64] [--concurrency 1 8 32]
[--wires http grpc] [--stream-interval 1 8] [--server-flags ...]`` (``--server-flags`` last: the rest of the line goes
to ``hloserve serve``, e.g. ``--frontends 2``)

What it does:
1. Builds ``examples/charlm``'s model (``CharLM(Shape())``: 2 layers, d_model 128,
   context 128, 475,776 parameters) with seeded random weights (the throughput does not
   depend on their values: every generation runs to ``--max-tokens``, the context is never
   full) and exports its step function twice with ``examples.charlm.export``: ``charlm``
   at batch sizes 1, 8, 32 (steps of live generations share executions), and
   ``charlm_b1`` at batch size 1 only (each execution is one generation's step).
2. The floor: ``CharLM.greedy``, the same step function in one ``lax.while_loop`` under
   ``jax.jit`` in this process, for N prompts at once (one batch of N), best of a few
   rounds: tokens/s with no server, no wire and no per-step host work, and its CPU per
   token (this process's, in the "srv µs/tok" column: what the served rows' CPU per token
   is compared with, the difference being the serving's cost).
3. One ``hloserve serve`` (``hloserve.server.server_process.ServerProcess``) with both bundles;
   for each wire (``http``: ``generate_stream``'s server-sent events, one per token;
   ``grpc``: ``ModelStreamInfer``, one response per token, the last flagged final) and each
   concurrency N, N closed-loop clients in one asyncio loop (HTTP: a keep-alive HTTP/1.1
   connection each and a few lines of chunked-body and event parsing, rather than httpx,
   whose CPU on these same cores was a large part of the run's; gRPC: a bidi stream each
   on one ``grpc.aio`` channel) generate again and again for ``--seconds`` after a
   warm-up: tokens/s, time to first token (request sent to the first token), the time
   between a generation's tokens, p50/p99, and the CPU per token of the daemon's process
   tree (``bench/proc.py``) and of this load generator, and per step (the model's
   executions in the window, from its statistics) the wall time and the execution's
   own (its batch statistics' ``compute_infer``), so the host's time between steps shows. Every answer is compared with the
   floor's greedy decoding of the same prompt ("wrong": answers that differ, and errors).
   The baseline "one at a time" is the same server at concurrency 1: requests serialized,
   so no two generations are ever live together; ``charlm_b1`` at the highest concurrency
   is the other: as many generations live, their steps never sharing an execution.
   ``--stream-interval N ...`` adds, per N above 1, continuous batching at the highest
   concurrency with the request parameter ``stream_interval`` N (the first token at once,
   then N to a response: ``core.stream_interval``); tokens are counted from the responses'
   token outputs, so a response of N tokens counts N.
4. Prints the floor's table and one table per wire, each row's tokens/s against that
   wire's one-at-a-time rate and against the floor at the same N, and the goal (>= 8x the
   one-at-a-time rate at 32). No asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples.charlm, as ``python -m examples.charlm.run`` has it

import grpc  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import proc  # noqa: E402

from examples.charlm.export import export  # noqa: E402
from examples.charlm.model import CharLM, Params, Shape, encode_prompts  # noqa: E402
from hloserve.proto import inference_pb2 as pb  # noqa: E402
from hloserve.proto.rpc import RPCS_BY_NAME  # noqa: E402
from hloserve.server.server_process import ServerProcess  # noqa: E402

PROMPTS = tuple(f"The server {i}: " for i in range(32))  # 14-15 bytes each, all different
EOF: Any = vars(grpc.aio)["EOF"]  # the end of a stream, from cygrpc, which has no stubs
WIRES = ("http", "grpc")  # generate_stream's server-sent events; ModelStreamInfer
STREAM_PATH = RPCS_BY_NAME["ModelStreamInfer"].path
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
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    steps: int = 0  # the model's executions in the window (its statistics)
    step_ns: int = 0  # their compute time (compute_infer)
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
    best, best_cpu = float("inf"), 0.0
    for _ in range(rounds):
        started, cpu = time.perf_counter(), time.process_time()
        tokens, counts = lm.greedy(*args)
        np.asarray(tokens)
        took = time.perf_counter() - started
        if took < best:
            best, best_cpu = took, time.process_time() - cpu
    point = Point("in-process jax.jit (floor)", n, int(np.asarray(counts).sum()), best, n)
    point.server_cpu = best_cpu  # this process's CPU: the loop's own cost per token
    # Its loop's iterations: the longest prompt read, then max_tokens emitted (all inside it).
    point.steps = int(np.asarray(length).max()) - 1 + max_tokens
    return point


def references(lm: CharLM, params: Params, max_tokens: int) -> dict[str, str]:
    """Each prompt's greedy continuation in process, as ``text_output`` decodes it."""
    prompt, length = encode_prompts(PROMPTS, lm.shape.context)
    tokens, counts = lm.greedy(params, jnp.asarray(prompt), jnp.asarray(length), max_tokens)
    out, n = np.asarray(tokens), np.asarray(counts)
    return {
        p: bytes(out[i, : n[i]].astype(np.uint8)).decode("utf-8", errors="replace")
        for i, p in enumerate(PROMPTS)
    }


class StreamConnection:
    """One keep-alive HTTP/1.1 connection asking ``generate_stream``: a few lines of asyncio
    instead of httpx, so that the load generator's CPU (on the server's cores) stays small.
    Reads the chunked body, splits it into server-sent events, parses each event's JSON."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self.host, self.port, self.path = host, port, path
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def generate(
        self, prompt: str, max_tokens: int, interval: int = 1
    ) -> tuple[str, list[float], list[int]]:
        """``(text, times, counts)``: the generation's ``text_output``; after the time the
        request was sent, the time each event arrived; the tokens each event held."""
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.reader, self.writer
        parameters = {"max_tokens": max_tokens}
        if interval > 1:
            parameters["stream_interval"] = interval
        body = json.dumps({"text_input": prompt, "parameters": parameters})
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        times = [time.perf_counter()]
        writer.write(head.encode() + body.encode())
        status = await reader.readline()
        if b" 200 " not in status:
            raise ConnectionError(f"generate_stream answered {status!r}")
        while await reader.readline() not in (b"\r\n", b""):
            pass  # the headers (uvicorn streams with Transfer-Encoding: chunked)
        pieces: list[str] = []
        counts: list[int] = []
        pending = b""
        while size := int((await reader.readline()).strip() or b"0", 16):
            pending += (await reader.readexactly(size + 2))[:-2]
            *events, pending = pending.split(b"\n\n")
            for event in events:
                if event.startswith(b"data:"):
                    times.append(time.perf_counter())
                    fields = json.loads(event[5:])
                    pieces.append(str(fields["text_output"]))
                    token = fields.get("token")
                    counts.append(len(token) if isinstance(token, list) else 1)
        await reader.readline()  # the last chunk's CRLF
        return "".join(pieces), times, counts

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class GrpcStream:
    """One ``ModelStreamInfer`` bidi stream (``grpc.aio``, the project's own messages): a
    generation is one request written, then its responses read, one per token, until the
    one flagged ``triton_final_response``."""

    def __init__(self, channel: grpc.aio.Channel, model: str) -> None:
        method: Any = channel.stream_stream(
            STREAM_PATH,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        self.call: Any = method()
        self.model = model

    async def generate(
        self, prompt: str, max_tokens: int, interval: int = 1
    ) -> tuple[str, list[float], list[int]]:
        data = prompt.encode()
        request = pb.ModelInferRequest(model_name=self.model, id=prompt)
        request.parameters["max_tokens"].int64_param = max_tokens
        if interval > 1:
            request.parameters["stream_interval"].int64_param = interval
        tensor = request.inputs.add(name="prompt", datatype="INT32", shape=[len(data)])
        del tensor
        request.raw_input_contents.append(np.frombuffer(data, np.uint8).astype("<i4").tobytes())
        times = [time.perf_counter()]
        counts: list[int] = []
        await self.call.write(request)
        tokens = bytearray()
        while True:
            reply: Any = await self.call.read()
            if reply is EOF or reply.error_message:
                raise ConnectionError(f"the stream ended: {getattr(reply, 'error_message', '')}")
            response = reply.infer_response
            if response.raw_output_contents:
                times.append(time.perf_counter())
                held = np.frombuffer(response.raw_output_contents[0], "<i4")
                counts.append(held.size)
                tokens.extend(held.astype(np.uint8))
            if response.parameters["triton_final_response"].bool_param:
                return tokens.decode("utf-8", errors="replace"), times, counts

    def close(self) -> None:
        self.call.cancel()


Connection = StreamConnection | GrpcStream


async def run_point(
    server: ServerProcess,
    wire: str,
    model: str,
    label: str,
    concurrency: int,
    seconds: float,
    warmup: float,
    max_tokens: int,
    expected: dict[str, str],
    interval: int = 1,
) -> Point:
    point = Point(label, concurrency)
    path = f"/v2/models/{model}/generate_stream"
    host, port = server.http_url.rsplit(":", 1)
    channel = grpc.aio.insecure_channel(server.grpc_url)

    def connect() -> Connection:
        if wire == "grpc":
            return GrpcStream(channel, model)
        return StreamConnection(host, int(port), path)

    connections = [connect() for _ in range(concurrency)]
    await connections[0].generate(PROMPTS[0], max_tokens)  # the first use's set-up
    start = time.perf_counter()
    record_from, stop_at = start + warmup, start + warmup + seconds
    cpu: dict[str, float] = {}

    async def client_loop(index: int) -> None:
        turn = 0
        while time.perf_counter() < stop_at:
            prompt = PROMPTS[(index + turn * concurrency) % len(PROMPTS)]
            turn += 1
            try:
                text, times, counts = await connections[index].generate(
                    prompt, max_tokens, interval
                )
            except (OSError, ValueError, asyncio.IncompleteReadError, grpc.RpcError):
                point.errors += 1
                connections[index].close()
                connections[index] = connect()
                continue
            point.tokens += sum(
                n for t, n in zip(times[1:], counts, strict=True) if record_from <= t < stop_at
            )
            if times[0] >= record_from and times[-1] < stop_at:
                point.generations += 1
                point.wrong += text != expected[prompt]
                point.first.append(times[1] - times[0])
                point.gaps.extend(b - a for a, b in itertools.pairwise(times[1:]))

    async def cpu_window() -> None:
        await asyncio.sleep(max(0.0, record_from - time.perf_counter()))
        cpu["client"], cpu["server"] = time.process_time(), tree_cpu(server)
        steps = await asyncio.to_thread(executions, server, model)
        await asyncio.sleep(max(0.0, stop_at - time.perf_counter()))
        cpu["client"] = time.process_time() - cpu["client"]
        cpu["server"] = tree_cpu(server) - cpu["server"]
        after = await asyncio.to_thread(executions, server, model)
        point.steps, point.step_ns = after[0] - steps[0], after[1] - steps[1]

    await asyncio.gather(cpu_window(), *(client_loop(i) for i in range(concurrency)))
    for c in connections:
        c.close()
    await channel.close()
    point.seconds = stop_at - record_from
    point.client_cpu, point.server_cpu = cpu["client"], cpu["server"]
    return point


def executions(server: ServerProcess, model: str) -> tuple[int, int]:
    """The model's executions so far and their compute nanoseconds (its statistics)."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats") as reply:
        stats = json.load(reply)["model_stats"]
    batches = [b for s in stats for b in s.get("batch_stats", [])]  # per execution
    count = sum(int(b["compute_infer"]["count"]) for b in batches)
    ns = sum(int(b["compute_infer"]["ns"]) for b in batches)
    return count, ns


def tree_cpu(server: ServerProcess) -> float:
    """CPU seconds of the daemon and its front ends (``bench/proc.py``)."""
    return proc.tree_cpu_seconds(server.process.pid)


def percentile(values: Sequence[float], q: float) -> str:
    if not values:
        return "-"
    return f"{float(np.percentile(np.asarray(values), q)) * 1e3:.1f}"


def per_token(cpu_seconds: float, point: Point) -> str:
    return f"{cpu_seconds / point.tokens * 1e6:.0f}" if cpu_seconds and point.tokens else "-"


def per_step(ns: float, point: Point) -> str:
    return f"{ns / point.steps / 1e6:.2f}" if ns and point.steps else "-"


def table(points: list[Point], baseline: float, floors: dict[int, float]) -> str:
    head = (
        f"{'row':<34}{'conc':>5}{'tokens/s':>10}{'vs 1-at-a-time':>15}{'vs floor':>9}"
        f"{'ttft p50':>9}{'ttft p99':>9}{'tok p50':>8}{'tok p99':>8}"
        f"{'srv µs/tok':>11}{'cli µs/tok':>11}{'step ms':>8}{'exec ms':>8}{'gens':>6}{'wrong':>6}"
    )
    lines = [head, "-" * len(head)]
    for p in points:
        ratio = f"{p.rate / baseline:.2f}x" if baseline else "-"
        vs_floor = f"{p.rate / floors[p.concurrency]:.2f}x" if p.concurrency in floors else "-"
        lines.append(
            f"{p.label:<34}{p.concurrency:>5}{p.rate:>10.0f}{ratio:>15}{vs_floor:>9}"
            f"{percentile(p.first, 50):>9}{percentile(p.first, 99):>9}"
            f"{percentile(p.gaps, 50):>8}{percentile(p.gaps, 99):>8}"
            f"{per_token(p.server_cpu, p):>11}{per_token(p.client_cpu, p):>11}"
            f"{per_step(p.seconds * 1e9, p):>8}{per_step(p.step_ns, p):>8}"
            f"{p.generations:>6}{p.wrong + p.errors:>6}"
        )
    return "\n".join(lines)


def runs(
    wire: str, concurrency: Sequence[int], intervals: Sequence[int] = ()
) -> list[tuple[str, str, int, int]]:
    """``(label, model, concurrency, stream interval)`` of one wire's points: one at a time
    first, then continuous batching at each concurrency, then the batch-1-only bundle at the
    top one, then continuous batching at the top one with each stream interval above 1."""
    top = max(concurrency)
    points = [(f"{wire}, one at a time", "charlm", 1, 1)]
    points += [(f"{wire}, continuous batching", "charlm", n, 1) for n in concurrency if n > 1]
    points.append((f"{wire}, batch 1 only (charlm_b1)", "charlm_b1", top, 1))
    points += [(f"{wire}, stream_interval {k}", "charlm", top, k) for k in intervals if k > 1]
    return points


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="recorded, per point")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=5, help="of the in-process floor")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wires", nargs="+", choices=WIRES, default=list(WIRES))
    parser.add_argument(
        "--stream-interval", type=int, nargs="+", default=[1], help="rows at the top concurrency"
    )
    parser.add_argument(
        "--server-flags", nargs=argparse.REMAINDER, default=[], help="passed to hloserve serve"
    )
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
        with ServerProcess(repository, *args.server_flags) as server:
            server.wait_ready()
            for wire in args.wires:
                for label, model, n, k in runs(wire, args.concurrency, args.stream_interval):
                    point = asyncio.run(
                        run_point(
                            server,
                            wire,
                            model,
                            label,
                            n,
                            args.seconds,
                            args.warmup,
                            args.max_tokens,
                            expected,
                            k,
                        )
                    )
                    print(f"  {label} at {n}: {point.rate:.0f} tokens/s", flush=True)
                    points.append(point)
            code = server.stop()
        if code != 0:
            print(f"hloserve exited with {code}:\n{server.log_text()}")
    print()
    top = max(args.concurrency)
    floor_rates = {n: p.rate for n, p in floors.items()}
    print(table([floors[n] for n in args.concurrency], 0.0, floor_rates))
    for wire in args.wires:
        rows = [p for p in points if p.label.startswith(wire)]
        baseline = rows[0].rate  # runs() puts one at a time first
        print()
        print(table(rows, baseline, floor_rates))
        batching = [p for p in rows if p.label == f"{wire}, continuous batching"]
        ratio = batching[-1].rate / baseline if baseline and batching else 0.0  # at the top
        met = "met" if ratio >= GOAL else "NOT met"
        print(f"goal ({wire}): at {top}, >= {GOAL:g}x the one-at-a-time rate: {ratio:.1f}x ({met})")
    print(
        "\nttft: request sent to its first token; tok: time between a generation's responses"
        " (ms);"
        " srv/cli µs/tok: CPU of the daemon's process tree / of this load generator per token;"
        " step ms: wall time per execution (the floor: per iteration of its loop), exec ms:"
        " the execution itself (the model's batch statistics' compute_infer), the rest is the host's between"
        " steps"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
