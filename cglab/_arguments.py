"""The torch-free argparse pieces every ``python -m cglab`` command shares."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from cglab.errors import NotSavedError

PROG = "python -m cglab"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each help ends in "(default: ...)" unless the default is None (the help says it); examples as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """Bad arguments get one line naming the argument, not a usage dump or a traceback."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def help_text(description: str, examples: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """A parser's help: ``description`` filled by hand, then example command lines, each with what it shows."""
    return {
        "description": textwrap.fill(" ".join(description.split()), width=88),
        "epilog": "examples:\n" + "\n".join(f"  {command}\n      # {why}" for command, why in examples),
        "formatter_class": _HelpFormatter,
    }


def add_command(
    sub: argparse._SubParsersAction, name: str, summary: str, description: str, *examples: tuple[str, str]
) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``: ``summary`` in the command list, the rest in its --help."""
    return sub.add_parser(name, help=summary, **help_text(description, examples))


def _items(text: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``. An empty item (``"1,,2"``) is a typo, not a separator: refused."""
    items = [part.strip() for part in text.split(",")]
    if any(items) and not all(items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item (a doubled comma, or one at an end); remove it")
    return [item for item in items if item]


def counts(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low``."""

    def parse(text: str) -> int:
        if not text.strip().lstrip("-").isdigit() or int(text) < low:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {low}, got {text!r}")
        return int(text)

    return parse


def int_list(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (argparse type: its error message names the argument)."""
    try:
        values = [int(part) for part in _items(text)]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def name_list(valid: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type for ``"a,b"`` -> ``["a", "b"]``, each name one of ``valid``."""

    def parse(text: str) -> list[str]:
        names = [name.lower() for name in _items(text)]
        if not names or any(n not in valid for n in names):
            raise argparse.ArgumentTypeError(f"expected comma-separated names from {', '.join(valid)}; got {text!r}")
        return names

    return parse


def print_saved(text: str) -> None:
    """Print a report of saved results: a reader that went away (``| head``) is no error, a full disk says so."""
    try:
        print(text, flush=True)
    except OSError as exc:
        stdout_to_devnull()
        if not isinstance(exc, BrokenPipeError):
            why = exc.strerror or exc
            raise NotSavedError(f"the files are saved, but stdout failed ({why}); read them", None) from None


def stdout_to_devnull() -> None:
    """Point a closed stdout at the null device: Python's flush at exit must not fail a second time."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
