"""What every script in bench/ shares: its small mode and the form of its last line.

Small mode: every bench takes ``--smoke``, which stands for argument values the script declares once (a few
prompts, one trial, a tiny checkpoint) and runs the same code path in seconds, so that tests/bench/ runs each
bench in `make test` and a refactor that breaks one fails the suite. An argument given explicitly beside
``--smoke`` wins. The figures of a smoke run say that the code works, not how fast: quote full runs only.

Last line: every bench ends with one machine-readable line, ``<bench name> key=value key=value ...``, each value
a number or numbers joined by ``/`` (one per night, say), or one word for a key the bench declares as such (a
chosen configuration's name, yes or no); ``read_last_line`` parses it.

Imported as ``from _common import ...``: Python puts a script's own folder first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import Any

SMOKE_FLAG = "--smoke"


def parse_args(parser: argparse.ArgumentParser, smoke: Mapping[str, Any],
               argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The script's arguments; with ``--smoke``, ``smoke`` (argument name -> value) replaces their defaults."""
    parser.add_argument(SMOKE_FLAG, action="store_true",
                        help="a small run of the same code path in seconds: "
                             + ", ".join(f"{name}={value}" for name, value in smoke.items()))
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = sorted(set(smoke) - set(vars(parser.parse_args([]))))
    if unknown:  # a renamed argument must not leave the smoke run silently at full size
        raise ValueError(f"smoke values for arguments the parser does not have: {', '.join(unknown)}")
    if SMOKE_FLAG in argv:
        parser.set_defaults(**smoke)
    return parser.parse_args(argv)


def read_last_line(output: str, words: Collection[str] = ()) -> tuple[str, dict[str, list[float] | str]]:
    """(bench name, figures) of the last line of a bench's output; each figure a list of its ``/`` parts, or its
    text for a key in ``words``."""
    lines = output.strip().splitlines()
    if not lines:
        raise ValueError("the bench printed nothing")
    name, *pairs = lines[-1].split()
    figures = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{pair!r} of the last line {lines[-1]!r} is not key=value")
        figures[key] = value if key in words else [float(part) for part in value.split("/")]
    return name, figures
