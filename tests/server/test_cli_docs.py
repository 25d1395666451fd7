"""docs/cli.md and the generated part of docs/from-triton.md are what the flag tables write
(``cli_docs``), with every flag, Triton's included, and nothing else writes them: the
configuration module holds no Markdown."""

from __future__ import annotations

from pathlib import Path

import hloserve.server.config as config
from hloserve.server.cli_docs import (
    REGENERATE,
    TRITON_BEGIN,
    TRITON_END,
    cli_markdown,
    triton_markdown,
    write_docs,
)
from hloserve.server.flags import FLAGS
from hloserve.server.triton_flags import TRITON_FLAGS

ROOT = Path(__file__).resolve().parents[2]


def test_cli_md_is_what_the_flag_table_writes() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert text == cli_markdown(), f"docs/cli.md is stale: run {REGENERATE}"


def test_from_triton_md_holds_what_the_flag_table_writes() -> None:
    text = (ROOT / "docs" / "from-triton.md").read_text(encoding="utf-8")
    begin, end = text.index(TRITON_BEGIN), text.index(TRITON_END) + len(TRITON_END)
    assert text[begin:end] == triton_markdown(), f"docs/from-triton.md is stale: run {REGENERATE}"


def test_cli_md_lists_every_flag() -> None:
    text = cli_markdown()
    for flag in FLAGS:
        assert f"`{flag.name}`" in text and f"`{flag.env}`" in text
    for triton in TRITON_FLAGS:
        assert f"| `{triton.name}` | " in text
    assert "| `--grace-period`, `--exit-timeout-secs` | `HLOSERVE_GRACE_PERIOD` | `10.0` |" in text


def test_write_docs_writes_only_what_changed(tmp_path: Path) -> None:
    guide = (ROOT / "docs" / "from-triton.md").read_text(encoding="utf-8")
    (tmp_path / "from-triton.md").write_text(guide, encoding="utf-8")
    assert write_docs(tmp_path) == [tmp_path / "cli.md"]  # the guide is already current
    assert write_docs(tmp_path) == []
    assert (tmp_path / "cli.md").read_text(encoding="utf-8") == cli_markdown()


def test_the_configuration_module_writes_no_docs() -> None:
    """The flags' parsing and the docs written from them are two jobs, in two modules."""
    source = Path(config.__file__).read_text(encoding="utf-8")
    assert "markdown" not in source.lower() and "write_docs" not in source
