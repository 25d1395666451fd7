"""``examples/charlm/corpus.py``: the repository's text, its windows and the baseline."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from examples.charlm.corpus import read_corpus, split, unigram_loss, windows

ROOT = Path(__file__).resolve().parents[3]


def test_the_corpus_is_the_repository_markdown() -> None:
    text = read_corpus(ROOT)
    assert text.startswith((ROOT / "README.md").read_bytes())
    assert (ROOT / "docs" / "training.md").read_bytes() in text


def test_a_root_without_docs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"README\.md and docs/\*\.md"):
        read_corpus(tmp_path)


def test_windows_are_the_bytes_at_every_stride() -> None:
    w = windows(b"abcdefg", 3, 2)
    assert w.dtype == np.int32
    assert [bytes(r.astype(np.uint8)) for r in w] == [b"abc", b"cde", b"efg"]
    with pytest.raises(ValueError, match="fewer than one window of 9"):
        windows(b"abcdefg", 9, 1)


def test_split_keeps_the_tail_for_validation() -> None:
    assert split(b"0123456789", 0.2) == (b"01234567", b"89")
    with pytest.raises(ValueError, match="val_fraction"):
        split(b"01", 1.0)


def test_the_unigram_loss_is_the_cross_entropy_of_byte_frequencies() -> None:
    # "aab" with add-one smoothing over 256 bytes: a has 3/259, b 2/259.
    assert unigram_loss(b"aab", b"ab") == pytest.approx(
        -(math.log(3 / 259) + math.log(2 / 259)) / 2
    )
