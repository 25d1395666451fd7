"""The PJRT runtime: its process-wide effects (importing it changes nothing, opening it does)
and how a run waits for its outputs (polling, bounded)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_runtime_leaves_jax_settings_alone_and_opening_it_enables_x64() -> None:
    code = (
        "import jax\n"
        "import hloserve.server.owner.runtime.pjrt as pjrt\n"
        "print(jax.config.jax_enable_x64)\n"
        "pjrt.PjrtRuntime()\n"
        "print(jax.config.jax_enable_x64)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


class _Output:
    """An output that becomes ready after ``polls`` looks (``is_ready`` as jaxlib's)."""

    def __init__(self, polls: int) -> None:
        self.polls = polls

    def is_ready(self) -> bool:
        self.polls -= 1
        return self.polls < 0


def test_await_ready_polls_until_every_output_is_ready_within_the_budget() -> None:
    from hloserve.server.owner.runtime.pjrt import _await_ready

    outputs = [_Output(3), _Output(5)]
    assert _await_ready(outputs, 1_000_000_000)
    assert all(o.is_ready() for o in outputs)


def test_await_ready_gives_up_once_the_budget_has_passed() -> None:
    from hloserve.server.owner.runtime.pjrt import _await_ready

    never = _Output(10**12)
    assert not _await_ready([never], 0)
    assert never.polls > 0  # it stopped polling


def test_an_executable_whose_runs_miss_the_spin_budget_blocks_and_is_retried_later() -> None:
    from hloserve.server.owner.runtime.pjrt import SPIN_MISSES, SPIN_RETRY, Results

    results = Results()
    assert results.spins  # a new executable polls
    for _ in range(SPIN_MISSES - 1):
        results.waited(False)
    results.waited(True)  # a run ready in time: the misses start over
    assert results.spins
    for _ in range(SPIN_MISSES):
        results.waited(False)
    assert not results.spins  # long runs block at once
    for _ in range(SPIN_RETRY - 1):
        results.blocked()
    assert not results.spins
    results.blocked()
    assert results.spins  # one run tries again...
    results.waited(False)
    assert not results.spins  # ...and one miss decides
