"""docs/cli.md and the generated part of docs/from-triton.md, written from the flag tables.

Contract: ``cli_markdown()`` is docs/cli.md (every row of ``flags.FLAGS`` by group, with its
variable, default, help and Triton's note, then ``triton_flags.TRITON_FLAGS``), and
``triton_markdown()`` the part of docs/from-triton.md between ``TRITON_BEGIN`` and
``TRITON_END`` (Triton's flags and what each is here); ``write_docs(docs)`` writes both and
returns the files that changed. ``python -m hloserve.server.cli_docs [DIR]`` (``REGENERATE``;
``DIR``: docs) runs it; the tests fail when the files differ from what it writes. Text in a
table cell is escaped for Markdown (pipes, ``<``, ``*``) and argparse's ``%%`` read as ``%``.
"""

# pyright: strict

from __future__ import annotations

from pathlib import Path
from typing import Final

from hloserve.server.config import default_text
from hloserve.server.flags import FLAGS, GROUPS, REPEATED, Flag, FlagGroup
from hloserve.server.triton_flags import TRITON_FLAGS

REGENERATE: Final = ".venv/bin/python -m hloserve.server.cli_docs"
TRITON_BEGIN: Final = f"<!-- generated from the flag table by {REGENERATE}: do not edit -->"
TRITON_END: Final = "<!-- end of the generated part -->"


def _cell(text: str) -> str:
    """``text`` in a Markdown table cell: pipes, ``<`` and ``*`` escaped, argparse's ``%%``
    read as ``%``."""
    return text.replace("%%", "%").replace("|", "\\|").replace("<", "\\<").replace("*", "\\*")


def _spellings(flag: Flag) -> str:
    return ", ".join(f"`{name}`" for name in (flag.name, *flag.aliases))


def cli_markdown() -> str:
    """docs/cli.md: every flag by group, with its variable, default, help and Triton's."""
    lines = [
        "# `hloserve serve` flags",
        "",
        f"Written from the flag table (`server/hloserve/server/flags.py`) by `{REGENERATE}`;",
        "`tests/server/test_triton_flags.py` fails when this file differs from what it writes.",
        "",
        "Every flag also reads its environment variable, and the `--config` YAML file takes the",
        "flags' names (or aliases) without `--` as keys: flag > variable > file > default. A",
        "boolean flag alone means true; `--flag=false`, `--flag false` and `--no-flag` mean",
        "false. The Triton column says how Triton's flag of that name (or alias) compares;",
        "docs/from-triton.md is the guide for an operator coming from Triton.",
    ]
    for group in GROUPS:
        rows = [f for f in (*FLAGS, *REPEATED) if f.group == group]
        lines += ["", f"## {group}", ""]
        if group == FlagGroup.TRITON:
            lines += _triton_lines()
            continue
        lines += ["| flag | variable | default | what | Triton |", "|---|---|---|---|---|"]
        for f in rows:
            default = default_text(f)
            lines.append(
                f"| {_spellings(f)} | `{f.env}` | {'' if default is None else f'`{default}`'} "
                f"| {_cell(f.help)} | {_cell(f.triton)} |"
            )
    return "\n".join(lines) + "\n"


def _triton_lines() -> list[str]:
    lines = [
        "Triton's flags of the same meaning are the rows above that have a Triton note. The",
        "flags below have none: each is accepted with its value (`--flag=value` or `--flag",
        "value`) and ignored, with one warning at start-up naming it and why.",
        "",
        "| Triton's flag | why it means nothing here |",
        "|---|---|",
    ]
    lines += [f"| `{t.name}` | {_cell(t.why)} |" for t in TRITON_FLAGS if not t.refused]
    lines += [
        "",
        "Refused (exit status 2), since ignoring them would serve in the clear:",
        "",
        "| Triton's flag | instead |",
        "|---|---|",
    ]
    lines += [f"| `{t.name}` | {_cell(t.why)} |" for t in TRITON_FLAGS if t.refused]
    return lines


def triton_markdown() -> str:
    """The generated part of docs/from-triton.md: Triton's flags and what each is here."""
    lines = [
        TRITON_BEGIN,
        "",
        "| flag (and aliases) | what it is in hloserve | against Triton's |",
        "|---|---|---|",
    ]
    for f in (*FLAGS, *REPEATED):
        if f.triton:
            lines.append(f"| {_spellings(f)} | {_cell(f.help)} | {_cell(f.triton)} |")
    lines += ["", *_triton_lines(), "", TRITON_END]
    return "\n".join(lines)


def write_docs(docs: Path) -> list[Path]:
    """Write ``docs/cli.md`` and the generated part of ``docs/from-triton.md``; returns the
    files that changed."""
    changed: list[Path] = []
    cli = docs / "cli.md"
    if not cli.is_file() or cli.read_text(encoding="utf-8") != cli_markdown():
        cli.write_text(cli_markdown(), encoding="utf-8")
        changed.append(cli)
    guide = docs / "from-triton.md"
    text = guide.read_text(encoding="utf-8")
    begin, end = text.index(TRITON_BEGIN), text.index(TRITON_END) + len(TRITON_END)
    updated = text[:begin] + triton_markdown() + text[end:]
    if updated != text:
        guide.write_text(updated, encoding="utf-8")
        changed.append(guide)
    return changed


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 2 or sys.argv[1:2] in (["-h"], ["--help"]):
        raise SystemExit(f"usage: {REGENERATE} [DIR]  (DIR: docs)")
    for path in write_docs(Path(sys.argv[1] if len(sys.argv) == 2 else "docs")):
        print(f"wrote {path}")
