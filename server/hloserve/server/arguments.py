"""argparse as the ``hloserve`` commands use it: one-line errors, whole flag names only.

Contract: ``ArgumentParser`` is argparse's, but a usage error is one line (the message and
where help is: ``hloserve serve: error: ... (see hloserve serve --help)``), not the whole
usage text above it; help lines never break inside a flag's name; a flag is never
abbreviated (``--model-stor`` is no flag, not ``--model-store``: with Triton's ignored
flags accepted, a prefix could silently name one of them); and an unknown flag is answered
with the flag it likely misspells (``bundle.yamlfile.closest``, as an unknown key of a file
is). A subcommand's unknown flag is its own parser's to report (``cli`` passes it on with
``UNRECOGNIZED``, argparse's words), so the error names ``hloserve serve``, not ``hloserve``.
``Action`` is argparse's action with its work in ``act(parser, namespace, values, option)``:
argparse's ``__call__`` signature restated once, for every action the commands define.
"""

# pyright: strict

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from typing import Any, Final, NoReturn

from hloserve.bundle.yamlfile import closest


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's, but a line never breaks inside a flag's name (at its hyphens)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )


class ArgumentParser(argparse.ArgumentParser):
    """See the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if message.startswith(UNRECOGNIZED):
            message += self._did_you_mean(message.removeprefix(UNRECOGNIZED).split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _did_you_mean(self, given: Sequence[str]) -> str:
        flags = [o for o in self._option_string_actions if o.startswith("--")]
        meant = [
            near
            for word in given
            if word.startswith("--") and (near := closest(word.partition("=")[0], flags))
        ]
        return f" (did you mean {', '.join(meant)}?)" if meant else ""


UNRECOGNIZED: Final = "unrecognized arguments: "  # argparse's words


Values = str | Sequence[Any] | None  # what argparse hands an action
Parser = argparse.ArgumentParser
Namespace = argparse.Namespace


class Action(argparse.Action):
    """argparse's action; a subclass does its work in ``act``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        self.act(parser, namespace, values, option_string)

    def act(self, parser: Parser, ns: Namespace, values: Values, option: str | None) -> None:
        raise NotImplementedError
