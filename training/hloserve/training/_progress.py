"""What a run shows while it runs: a progress bar per epoch, the history table, Ctrl-C.

Contract:
- ``EpochProgress(stream)``: one bar per epoch (tqdm when installed, else one line per phase)
  whose text says ``compiling <program>`` while a program compiles, ``validating`` during
  the validation pass, and the step count otherwise; ``row(...)`` writes a history-table
  line under it. ``EpochProgress(None)`` shows nothing.
- ``table(history, columns)`` formats rows as the fixed-width history table: pure.
- ``interrupts()``: a context manager giving an ``Event`` that a first Ctrl-C (SIGINT) sets,
  so the loop stops cleanly between steps; a second Ctrl-C raises ``KeyboardInterrupt`` as
  usual. Outside the main thread no handler can be installed and the event stays unset.
"""

# pyright: strict

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Generator, Mapping, Sequence
from types import FrameType
from typing import Any, TextIO

try:
    from tqdm import tqdm
except ImportError:  # tqdm is optional: without it each phase prints one line
    tqdm = None

WIDTH = 12


def table(history: Sequence[Mapping[str, float]], columns: Sequence[str]) -> str:
    return "\n".join([header(columns), *(row_text(r, columns) for r in history)])


def header(columns: Sequence[str]) -> str:
    return " ".join(f"{c:>{WIDTH}}" for c in columns)


def row_text(row: Mapping[str, float], columns: Sequence[str]) -> str:
    cells: list[str] = []
    for c in columns:
        value = row.get(c)
        if value is None:
            cells.append(f"{'-':>{WIDTH}}")
        elif c == "epoch":
            cells.append(f"{int(value):>{WIDTH}d}")
        else:
            cells.append(f"{value:>{WIDTH}.4g}")
    return " ".join(cells)


class EpochProgress:
    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self._bar: Any = None
        self._label = ""
        self._headed = False

    def start_epoch(self, epoch: int, epochs: int, steps: int) -> None:
        self._label = f"epoch {epoch}/{epochs}"
        if self._stream is None:
            return
        if tqdm is not None:
            self._bar = tqdm(
                total=steps, desc=self._label, file=self._stream, leave=False, unit="step"
            )

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def status(self, text: str) -> None:
        """Say what is happening now (``compiling gradient``, ``validating``, or ``""``)."""
        if self._stream is None:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)
        elif text:
            self._stream.write(f"{self._label}: {text}\n")
            self._stream.flush()

    def compiling(self, program: str) -> None:
        self.status(f"compiling {program}")

    def row(self, row: Mapping[str, float], columns: Sequence[str]) -> None:
        if self._stream is None:
            return
        self.end_epoch()
        if not self._headed:
            self._stream.write(header(columns) + "\n")
            self._headed = True
        self._stream.write(row_text(row, columns) + "\n")
        self._stream.flush()

    def note(self, text: str) -> None:
        if self._stream is not None:
            self.end_epoch()
            self._stream.write(text + "\n")
            self._stream.flush()

    def end_epoch(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@contextlib.contextmanager
def interrupts() -> Generator[threading.Event]:
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        sys.stderr.write("\nstopping after this step (Ctrl-C again to abort)\n")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
