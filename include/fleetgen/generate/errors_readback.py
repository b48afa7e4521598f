"""Which of a shard's earlier error records a new try keeps, from the lines of ``errors/shard-NNNNN.jsonl``.

An error record stands only when it says the failure was the prompt's own (``records.PROMPT_FAULT``: a prompt the
servers refused, e.g. longer than the context): the prompt is done and never sent again in the run. Every other
record (the server's fault, or a line written before records said whose fault) is dropped and its prompt sent
again, so clearing a shard once the servers are fixed regenerates it (docs/shards.md §6). ``store.py`` opens the
file, hands its lines here and rewrites it with the lines kept: this module reads no file itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fleetgen.generate import jsonio
from fleetgen.generate.records import PROMPT_FAULT


@dataclass(frozen=True)
class ErrorsReadBack:
    """The error lines that stand (in file order), their prompt ids, and how many were dropped."""

    kept: list[bytes]
    kept_ids: list[bytes]
    dropped: int


def read_back_errors(lines: Iterable[bytes], line_id: Callable[[bytes, int], bytes]) -> ErrorsReadBack:
    """Sort a shard's error lines into those that stand and those whose prompts are sent again. ``line_id`` gives
    a line's prompt id from the line and its number (1-based); it raises on a line it cannot read, kept or not."""
    kept, kept_ids, dropped = [], [], 0
    for number, raw in enumerate(lines, 1):
        raw_id = line_id(raw, number)
        if fault(raw) == PROMPT_FAULT:
            kept.append(raw)
            kept_ids.append(raw_id)
        else:
            dropped += 1
    return ErrorsReadBack(kept, kept_ids, dropped)


def fault(raw: bytes) -> str | None:
    """Whose fault an error line says its failure was; None for a line written before records said so."""
    try:
        return jsonio.loads(raw).get("fault")
    except (jsonio.JSONDecodeError, AttributeError):
        return None
