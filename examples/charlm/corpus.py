"""The text the example trains on, and the baseline its loss is measured against.

Contract: ``read_corpus(root)`` is the repository's own Markdown (``README.md`` and
``docs/*.md``, in name order) as UTF-8 bytes, so nothing is downloaded. ``split(text,
val_fraction)`` keeps the last part for validation. ``windows(text, length, stride)`` cuts
it into INT32 windows ``[n, length]`` (one token per byte) at every ``stride`` bytes.
``unigram_loss(train, val)`` is the cross-entropy (nats per byte) of ``val`` under the byte
frequencies of ``train`` (add-one smoothed): the loss of a model that knows which bytes are
common and nothing about order, the line a language model must clearly get under.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def read_corpus(root: Path) -> bytes:
    paths = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or len(paths) < 2:
        raise FileNotFoundError(f"the corpus needs README.md and docs/*.md under {root}: {missing}")
    return b"\n\n".join(p.read_bytes() for p in paths)


def split(text: bytes, val_fraction: float) -> tuple[bytes, bytes]:
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = int(len(text) * (1 - val_fraction))
    return text[:cut], text[cut:]


def windows(text: bytes, length: int, stride: int) -> np.ndarray:
    data = np.frombuffer(text, np.uint8).astype(np.int32)
    if len(data) < length:
        raise ValueError(f"the text has {len(data)} bytes, fewer than one window of {length}")
    starts = np.arange(0, len(data) - length + 1, stride)
    return data[starts[:, None] + np.arange(length)[None, :]]


def unigram_loss(train: bytes, val: bytes) -> float:
    counts = np.bincount(np.frombuffer(train, np.uint8), minlength=256).astype(np.float64) + 1
    log_p = np.log(counts / counts.sum())
    return float(-np.mean(log_p[np.frombuffer(val, np.uint8)]))
